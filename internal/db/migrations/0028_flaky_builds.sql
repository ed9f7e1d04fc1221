-- Retry policies for build failures, flaky builds, and failed builds retried after an expiry.
-- See docs/decisions.md, "Flaky builds: a retry policy on the job, an expiry on cached failures".
--
-- A job's policy is recorded on it when an evaluation enqueues or needs it (the most generous of
-- the evaluations that need it, capped by the evaluator's configuration): retry_limit build
-- failures are retried, each after retry_backoff_secs. failure_retries counts the retries used
-- since the job was last reset (a rebuild, an expiry); failures counts every build failure of the
-- job, never reset: a job that succeeds with failures > 0 failed before without a change to its
-- derivation, which is what flaky means. All defaults are constants: no table rewrite.
ALTER TABLE build_jobs
    ADD COLUMN retry_limit INT NOT NULL DEFAULT 0 CHECK (retry_limit >= 0),
    ADD COLUMN retry_backoff_secs INT NOT NULL DEFAULT 0 CHECK (retry_backoff_secs >= 0),
    ADD COLUMN failure_retries INT NOT NULL DEFAULT 0,
    ADD COLUMN failures INT NOT NULL DEFAULT 0,
    ADD COLUMN retry_at TIMESTAMPTZ;

-- The claim skips a job whose retry waits for its backoff. The ready index is unchanged: a job
-- in its backoff is pending and ready, and the claim's per-group walk reads its row anyway (to
-- lock it), so the filter costs one comparison on the rows it already visits. Builders poll
-- (queue.poll_interval), which picks the job up once the backoff has passed.
CREATE OR REPLACE FUNCTION claim_jobs(systems TEXT[], features TEXT[], node TEXT, per_group INT, max_jobs INT)
RETURNS TABLE (id BIGINT, drv_path TEXT, system TEXT, project_id BIGINT, priority INT, attempt INT,
               retry_count INT, required_features TEXT[], claimed_at TIMESTAMPTZ)
AS $$
DECLARE
    own_systems  TEXT[];
    own_features TEXT[];
    free_slots   INT;
BEGIN
    -- current_user is the function's owner: whoever is (a member of) it could write the claim
    -- directly, so its arguments stand.
    IF NOT pg_has_role(session_user, current_user, 'MEMBER') THEN
        SELECT n.systems, n.features,
               n.max_jobs - (SELECT count(*) FROM build_jobs h
                             WHERE h.claimed_by = n.id AND h.status IN ('building', 'uploading'))
        INTO own_systems, own_features, free_slots
        FROM nodes n WHERE n.id = session_user;
        IF node IS DISTINCT FROM session_user OR own_systems IS NULL THEN
            RAISE EXCEPTION 'claim jobs for node %: login % claims only for itself, once registered', node, session_user
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        IF NOT (systems <@ own_systems AND features <@ own_features) THEN
            RAISE EXCEPTION 'claim jobs for node %: systems % and features % are not all among its registered systems % and features %',
                node, systems, features, own_systems, own_features
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        max_jobs := LEAST(max_jobs, free_slots);
        IF max_jobs <= 0 THEN
            RETURN;
        END IF;
    END IF;
    RETURN QUERY
    WITH shares AS (
        SELECT p.id AS project_id, p.consumed_seconds / GREATEST(p.scheduling_shares, 1) AS ratio
        FROM projects p
    ), candidates AS MATERIALIZED (
        SELECT c.id, c.priority, c.dependent_chain, c.created_at, s.ratio
        FROM unnest(systems) AS sys(system)
        CROSS JOIN shares s
        CROSS JOIN LATERAL (
            SELECT bj.id, bj.priority, bj.dependent_chain, bj.created_at
            FROM build_jobs bj
            WHERE bj.status = 'pending' AND bj.ready
              AND bj.system = sys.system AND bj.project_id = s.project_id
              AND bj.required_features <@ features
              AND (bj.retry_at IS NULL OR bj.retry_at <= now())
            ORDER BY bj.priority DESC, bj.dependent_chain DESC, bj.created_at, bj.id
            LIMIT per_group
            FOR UPDATE SKIP LOCKED
        ) c
      UNION ALL
        SELECT c.id, c.priority, c.dependent_chain, c.created_at, 0
        FROM unnest(systems) AS sys(system)
        CROSS JOIN LATERAL (
            SELECT bj.id, bj.priority, bj.dependent_chain, bj.created_at
            FROM build_jobs bj
            WHERE bj.status = 'pending' AND bj.ready
              AND bj.system = sys.system AND bj.project_id IS NULL
              AND bj.required_features <@ features
              AND (bj.retry_at IS NULL OR bj.retry_at <= now())
            ORDER BY bj.priority DESC, bj.dependent_chain DESC, bj.created_at, bj.id
            LIMIT per_group
            FOR UPDATE SKIP LOCKED
        ) c
    ), chosen AS (
        SELECT c.id FROM candidates c
        ORDER BY c.priority DESC, c.ratio, c.dependent_chain DESC, c.created_at, c.id
        LIMIT max_jobs
    )
    UPDATE build_jobs bj SET
        status = 'building', claimed_by = node, claimed_at = now(), started_at = now(),
        attempt = bj.attempt + 1
    FROM chosen
    WHERE bj.id = chosen.id
    RETURNING bj.id, bj.drv_path, bj.system, bj.project_id, bj.priority, bj.attempt, bj.retry_count,
              bj.required_features, bj.claimed_at;
END;
$$ LANGUAGE plpgsql SECURITY DEFINER SET plan_cache_mode = force_generic_plan SET jit = off;

-- A build failure sent back to the queue for a retry (failures grows) is an attempt that
-- failed, not a transient retry: the attempts keep it as failed, with its exit code and error.
CREATE OR REPLACE FUNCTION build_jobs_record_attempt() RETURNS trigger AS $$
DECLARE
    st TEXT;
BEGIN
    st := CASE
        WHEN NEW.status IN ('succeeded', 'failed', 'cancelled') THEN NEW.status
        WHEN NEW.status = 'pending' AND NEW.failures > OLD.failures THEN 'failed'
        WHEN NEW.status = 'pending' AND NEW.started_at IS NOT NULL THEN 'retried'
        ELSE 'interrupted'
    END;
    INSERT INTO build_attempts (job_id, attempt, node, claimed_at, started_at, finished_at, status,
                                exit_code, error, log_key)
    VALUES (NEW.id, OLD.attempt, OLD.claimed_by, OLD.claimed_at, OLD.started_at,
            COALESCE(NEW.finished_at, now()), st,
            CASE WHEN st IN ('succeeded', 'failed', 'retried') THEN NEW.exit_code END,
            CASE WHEN st IN ('failed', 'retried') THEN NEW.error_message END,
            CASE WHEN NEW.log_url = 'log/' || substring(NEW.drv_path FROM 12) || '.' || OLD.attempt
                 THEN NEW.log_url END)
    ON CONFLICT (job_id, attempt) DO NOTHING;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql SECURITY DEFINER;

-- CREATE OR REPLACE drops the functions' pinned search_path (their SET clauses are replaced):
-- pinned again, as 0016 and 0026 did. Their grants stay.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION claim_jobs(TEXT[], TEXT[], TEXT, INT, INT) SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION build_jobs_record_attempt() SET search_path = %I, pg_temp',
                   current_schema());
END
$$;
