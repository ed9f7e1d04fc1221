-- The units of an evaluation's attribute tree that any evaluator node may walk (see
-- docs/decisions.md, "Evaluation workers"): a slice of a large set the walk split, or the retry
-- of one attribute past the per-worker memory limit. Rows belong to one attempt of the
-- evaluation (eval_attempt); a new attempt ignores and then deletes those of earlier ones. A
-- unit is claimed like a build job (claimed_by, attempt + 1, FOR UPDATE SKIP LOCKED), marked
-- done in the transaction that commits its last attributes, and put back by the reaper when
-- its node dies. claimed_by stays on a done unit: the node that walked it.
CREATE TABLE eval_units (
    id           BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    eval_id      BIGINT NOT NULL REFERENCES evaluations(id) ON DELETE CASCADE,
    eval_attempt INT NOT NULL,
    -- The unit whose walker split it off; NULL for one the evaluation's own roots led to.
    parent_id    BIGINT REFERENCES eval_units(id) ON DELETE CASCADE,
    -- The rendered attribute path the parent's walker handed on (a split set, or the retried
    -- attribute): a reclaimed parent skips it.
    handed       TEXT NOT NULL,
    path         TEXT[] NOT NULL,
    force        INT NOT NULL,
    names        TEXT[],
    retry        BOOLEAN NOT NULL DEFAULT false,
    status       TEXT NOT NULL DEFAULT 'queued' CHECK (status IN ('queued', 'running', 'done')),
    claimed_by   TEXT,
    claimed_at   TIMESTAMPTZ,
    attempt      INT NOT NULL DEFAULT 0,
    CHECK (status <> 'running' OR claimed_by IS NOT NULL)
);
CREATE INDEX eval_units_open_idx ON eval_units (eval_id, id) WHERE status <> 'done';
CREATE INDEX eval_units_parent_idx ON eval_units (parent_id);

-- The unit whose walker reported the attribute (NULL: the evaluation's roots), so that a
-- reclaimed unit skips what its earlier attempts committed.
ALTER TABLE eval_attrs ADD COLUMN unit_id BIGINT;
CREATE INDEX eval_attrs_unit_idx ON eval_attrs (unit_id) WHERE unit_id IS NOT NULL;

-- Under per-role logins, an evaluator that walks a unit of an evaluation ingests for it as its
-- claimant does: the ingest transaction names the evaluation, and the login holds a running
-- unit of its running attempt.
CREATE OR REPLACE FUNCTION ingest_project() RETURNS BIGINT AS $$
    SELECT e.project_id FROM evaluations e
    WHERE e.id = NULLIF(current_setting('harmonia.eval_id', true), '')::bigint
      AND e.status = 'running'
      AND (e.claimed_by = session_user
           OR EXISTS (SELECT 1 FROM eval_units u
                      WHERE u.eval_id = e.id AND u.eval_attempt = e.attempt
                        AND u.claimed_by = session_user AND u.status = 'running'))
$$ LANGUAGE sql STABLE;

CREATE OR REPLACE FUNCTION ingest_trusted_project() RETURNS BIGINT AS $$
    SELECT e.project_id FROM evaluations e
    WHERE e.id = NULLIF(current_setting('harmonia.eval_id', true), '')::bigint
      AND e.status = 'running' AND e.pr_number IS NULL
      AND (e.claimed_by = session_user
           OR EXISTS (SELECT 1 FROM eval_units u
                      WHERE u.eval_id = e.id AND u.eval_attempt = e.attempt
                        AND u.claimed_by = session_user AND u.status = 'running'))
$$ LANGUAGE sql STABLE;
