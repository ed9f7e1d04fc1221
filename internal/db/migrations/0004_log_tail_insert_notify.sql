-- A build's first log tail is an INSERT: announce it too, so a client watching a build that
-- just started sees its first lines without waiting for the second write.
CREATE OR REPLACE FUNCTION notify_build_log() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.log_seq IS DISTINCT FROM OLD.log_seq THEN
        PERFORM pg_notify('build_log', NEW.build_job_id::text);
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER build_log_notify_insert
    AFTER INSERT ON build_log_tails
    FOR EACH ROW EXECUTE FUNCTION notify_build_log();
