-- Why a build failed, in words a user can act on ("build timed out after 4h0m0s", "no output
-- for 30m0s", Nix's own error). Kept on a transient failure too (the last reason), cleared when
-- the job succeeds or is rebuilt.
ALTER TABLE build_jobs ADD COLUMN error_message TEXT;

-- The cluster's signing public keys, which builders trust when they substitute inputs from the
-- cluster's caches. Each signer records its key at start; a key stays until an operator removes
-- it (keys retired by a rotation still verify the paths they signed).
CREATE TABLE signing_keys (
    public_key TEXT PRIMARY KEY CHECK (public_key ~ '^[A-Za-z0-9._+-]+:[A-Za-z0-9+/=]+$'),
    first_seen TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_seen  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- A deleted tail means the build finished (the builder deletes it after recording the result):
-- announce that too, so live-log streams end at once instead of at their next poll.
CREATE OR REPLACE FUNCTION notify_build_log() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('build_log', OLD.build_job_id::text);
        RETURN OLD;
    END IF;
    IF TG_OP = 'INSERT' OR NEW.log_seq IS DISTINCT FROM OLD.log_seq THEN
        PERFORM pg_notify('build_log', NEW.build_job_id::text);
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER build_log_notify_delete
    AFTER DELETE ON build_log_tails
    FOR EACH ROW EXECUTE FUNCTION notify_build_log();
