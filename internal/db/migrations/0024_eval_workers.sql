-- How an evaluation was walked (see docs/decisions.md, "Evaluation workers"): the walker
-- processes it ran at once, the resident memory each might use (0: no limit), and how many
-- times one was killed past that and restarted. Written by the evaluator on its claim and on each
-- restart; rows written before this migration have 0 everywhere.
ALTER TABLE evaluations ADD COLUMN workers INT NOT NULL DEFAULT 0;
ALTER TABLE evaluations ADD COLUMN worker_memory BIGINT NOT NULL DEFAULT 0;
ALTER TABLE evaluations ADD COLUMN worker_restarts INT NOT NULL DEFAULT 0;
