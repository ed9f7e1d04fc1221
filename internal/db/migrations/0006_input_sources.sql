-- A derivation's input sources (its inputSrcs: path literals, builtins.toFile results), so the
-- signer can tell which references a build's outputs may have: the closure of the input
-- derivations' outputs and of these. NULL for derivations ingested before this column existed
-- (their outputs may then refer only to input derivations' closures and their own outputs).
ALTER TABLE derivations ADD COLUMN input_srcs TEXT[];
