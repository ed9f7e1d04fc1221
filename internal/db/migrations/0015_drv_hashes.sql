-- Each .drv object carries its hash for the derivations that use it (Nix's
-- hashDerivationModulo), which the signer computes while it checks the derivation's output
-- paths against its text at publication (see docs/decisions.md, "Signed means built from what
-- the project declared"). A builder, and the signer at build-complete, check a derivation's
-- outputs from its text and its inputs' hashes, without reading the whole closure. NULL for a
-- .drv published before: computed from the stored texts when needed.
ALTER TABLE drv_objects ADD COLUMN drv_hash BYTEA CHECK (octet_length(drv_hash) = 32);
