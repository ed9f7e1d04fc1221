-- Evaluations are claimed like build jobs: attempt counts claims and is never reset, and every
-- write an evaluator makes is guarded by (id, claimed_by, attempt, status = 'running'), so an
-- evaluator whose claim was reaped changes nothing.
ALTER TABLE evaluations ADD COLUMN attempt INT NOT NULL DEFAULT 0;

-- Superseding and the "is this job still needed" check look up attrs by derivation and by
-- evaluation; eval_attrs (eval_id, attr) and (drv_path) are already indexed.

-- Projects are found by their repository's clone URL when a push arrives.
CREATE INDEX repositories_clone_url_idx ON repositories (clone_url);
