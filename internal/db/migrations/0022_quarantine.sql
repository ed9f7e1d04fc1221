-- Pull-request outputs are quarantined until a trusted evaluation needs them (see
-- docs/decisions.md, "Pull-request outputs are quarantined until a trusted evaluation needs
-- them").
--
-- A job is trusted when a trusted evaluation (of a branch: evaluations.pr_number IS NULL) needs
-- it; a pull request's evaluation creates its jobs untrusted, and a trusted one that needs an
-- existing job marks it trusted (only ever false to true).
ALTER TABLE build_jobs ADD COLUMN trusted BOOLEAN NOT NULL DEFAULT true;

-- The signer records, with an output's NAR hash, whether an untrusted job built it: a path whose
-- every built row is quarantined is served to nodes and to the readers of its projects only.
-- nonrepro_nar_hash is the NAR hash of a quarantined build a trusted rebuild did not reproduce
-- (the row's nar_hash is then the trusted build's).
ALTER TABLE derivation_outputs
    ADD COLUMN quarantined BOOLEAN NOT NULL DEFAULT false,
    ADD COLUMN nonrepro_nar_hash TEXT;

-- Whether a trusted evaluation takes a quarantined output as built (promotion) or rebuilds it;
-- an admin's setting, never the repository's.
ALTER TABLE projects ADD COLUMN promote_pr_outputs BOOLEAN NOT NULL DEFAULT true;

-- The signer asks, at every build-complete, whether a job's output paths are quarantined.
CREATE INDEX derivation_outputs_quarantined_idx ON derivation_outputs (output_path) WHERE quarantined;

-- The evaluator's ingest of a trusted evaluation: its project, or NULL when the transaction names
-- no running evaluation the session's login holds, or one of a pull request.
CREATE FUNCTION ingest_trusted_project() RETURNS BIGINT AS $$
    SELECT e.project_id FROM evaluations e
    WHERE e.id = NULLIF(current_setting('harmonia.eval_id', true), '')::bigint
      AND e.claimed_by = session_user AND e.status = 'running' AND e.pr_number IS NULL
$$ LANGUAGE sql STABLE;

-- Whether that trusted evaluation's project promotes quarantined outputs.
CREATE FUNCTION ingest_promotes() RETURNS BOOLEAN AS $$
    SELECT COALESCE((SELECT p.promote_pr_outputs FROM projects p WHERE p.id = ingest_trusted_project()), false)
$$ LANGUAGE sql STABLE;
