-- Which Nix each node runs, and which Nix evaluated each evaluation (see docs/decisions.md,
-- "Nix versions: 2.8 and 2.26, side by side"). A builder reports its daemon's version and the
-- worker protocol it speaks with it; a node that only evaluates, the Nix it evaluates with.
-- Empty: a node that runs no Nix, or a row written before this migration.
ALTER TABLE nodes ADD COLUMN nix_version TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN nix_protocol TEXT NOT NULL DEFAULT '';
ALTER TABLE evaluations ADD COLUMN nix_version TEXT NOT NULL DEFAULT '';
