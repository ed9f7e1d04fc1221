-- Every claim of a job is an attempt, kept with its node, times, result, error and log, so that
-- a rebuild or a retry no longer replaces what the earlier claim did.
--
-- The rows are written by a trigger when an attempt ends (the job leaves building/uploading),
-- whichever path ends it: a finish, a transient retry, a release, the reaper, a cancel. No role
-- writes them itself; the garbage collector (the signer's login) clears log_key when it expires
-- the log.
CREATE TABLE build_attempts (
    job_id      BIGINT NOT NULL REFERENCES build_jobs(id) ON DELETE CASCADE,
    attempt     INT NOT NULL,
    node        TEXT,
    claimed_at  TIMESTAMPTZ,
    started_at  TIMESTAMPTZ,
    finished_at TIMESTAMPTZ NOT NULL,
    -- succeeded, failed, cancelled; retried: failed transiently, the job went back to the queue;
    -- interrupted: the claim was given back or its node lost, with no result.
    status      TEXT NOT NULL
                CHECK (status IN ('succeeded', 'failed', 'cancelled', 'retried', 'interrupted')),
    exit_code   INT,
    error       TEXT,
    -- The attempt's own log (log/<drv>.<attempt>); NULL when it uploaded none or it expired.
    log_key     TEXT,
    PRIMARY KEY (job_id, attempt)
);
CREATE INDEX build_attempts_log_finished_idx ON build_attempts (finished_at) WHERE log_key IS NOT NULL;

-- A failure keeps the attempt's started_at (sqlJobFailTransient), a release or a reaped claim
-- clears it: that is what tells a transient failure from an interruption once the job is
-- pending again. The log is the attempt's only if log_url names this attempt's key: a claim
-- that uploaded nothing leaves the previous attempt's log_url in place.
CREATE FUNCTION build_jobs_record_attempt() RETURNS trigger AS $$
DECLARE
    st TEXT;
BEGIN
    st := CASE
        WHEN NEW.status IN ('succeeded', 'failed', 'cancelled') THEN NEW.status
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

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION build_jobs_record_attempt() SET search_path = %I, pg_temp',
                   current_schema());
END
$$;
REVOKE ALL ON FUNCTION build_jobs_record_attempt() FROM PUBLIC;

CREATE TRIGGER build_jobs_attempt_ended
    AFTER UPDATE OF status ON build_jobs
    FOR EACH ROW
    WHEN (OLD.status IN ('building', 'uploading') AND NEW.status NOT IN ('building', 'uploading'))
    EXECUTE FUNCTION build_jobs_record_attempt();
