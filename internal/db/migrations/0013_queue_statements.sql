-- Fewer statements per job (see docs/decisions.md, "The queue's hot path: fewer statements per
-- job"). A profile of the drain's backends showed every statement on build_jobs paying for its
-- set-up as much as for its work: each compiles the table's CHECK constraints and its stored
-- generated column from their stored text, and each trigger runs statements of its own.

-- 1. `ready` becomes a plain column, written together with blocked_inputs by the only writers
--    of the count (recount_blocked and the readiness triggers below). As a generated column
--    its expression was parsed and compiled for every UPDATE of build_jobs, whatever it set.
--    Its values are kept; a new job starts at blocked_inputs 0, so ready, until its recount.
--    The readiness audit (queue.MaintenanceTasks) checks the pair as well as the count.
ALTER TABLE build_jobs ALTER COLUMN ready DROP EXPRESSION;
ALTER TABLE build_jobs ALTER COLUMN ready SET DEFAULT true;
ALTER TABLE build_jobs ALTER COLUMN ready SET NOT NULL;

CREATE OR REPLACE FUNCTION recount_blocked(job_ids BIGINT[]) RETURNS void AS $$
BEGIN
    UPDATE build_jobs r SET blocked_inputs = c.n, ready = (c.n = 0)
    FROM (
        SELECT j.id, (
            SELECT count(*) FROM derivation_inputs di
            JOIN build_jobs dep ON dep.drv_path = di.input_drv
            WHERE di.referrer = j.drv_path AND dep.status <> 'succeeded'
        )::int AS n
        FROM build_jobs j WHERE j.id = ANY(job_ids)
    ) c
    WHERE r.id = c.id AND (r.blocked_inputs <> c.n OR r.ready <> (c.n = 0));
END;
$$ LANGUAGE plpgsql
    SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off;

-- 2. The readiness triggers run their update themselves, instead of calling shift_dependents
--    (a second function call and a second statement per crossing). The dependents are still
--    locked in id order first: two finishes sharing dependents would otherwise lock them in
--    index order each and could deadlock.
--
--    The shared readiness lock (see 0002) is now taken by the statements that cross, not by a
--    statement trigger on every status update: claims, failures, releases and cancels never
--    move a job into or out of 'succeeded', and paid a trigger and a statement for it on every
--    claim. The queue's success takes the lock before touching its row (sqlJobSucceed); a
--    delete still takes it in the statement trigger below; any other statement that sets a
--    job succeeded (tests, fixtures) gets it here, with its own row already locked, which can
--    only deadlock (and be broken by PostgreSQL's detector) against an enqueue of that very
--    job.
CREATE OR REPLACE FUNCTION build_jobs_after_status() RETURNS trigger AS $$
BEGIN
    UPDATE build_jobs r SET
        blocked_inputs = r.blocked_inputs + (CASE WHEN NEW.status = 'succeeded' THEN -1 ELSE 1 END),
        ready = (r.blocked_inputs + (CASE WHEN NEW.status = 'succeeded' THEN -1 ELSE 1 END) = 0)
    FROM (SELECT l.id FROM build_jobs l
          WHERE l.drv_path IN (SELECT di.referrer FROM derivation_inputs di WHERE di.input_drv = NEW.drv_path)
          ORDER BY l.id
          FOR NO KEY UPDATE) locked
    WHERE r.id = locked.id
      AND EXISTS (SELECT FROM pg_advisory_xact_lock_shared(1212369201, 2));
    RETURN NULL;
END;
$$ LANGUAGE plpgsql SECURITY DEFINER
    SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
    SET plan_cache_mode = force_generic_plan SET jit = off;

CREATE OR REPLACE FUNCTION build_jobs_after_delete() RETURNS trigger AS $$
BEGIN
    UPDATE build_jobs r SET blocked_inputs = r.blocked_inputs - 1, ready = (r.blocked_inputs - 1 = 0)
    FROM (SELECT l.id FROM build_jobs l
          WHERE l.drv_path IN (SELECT di.referrer FROM derivation_inputs di WHERE di.input_drv = OLD.drv_path)
          ORDER BY l.id
          FOR NO KEY UPDATE) locked
    WHERE r.id = locked.id;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql SECURITY DEFINER
    SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
    SET plan_cache_mode = force_generic_plan SET jit = off;

-- CREATE OR REPLACE resets each function's settings to those given: pin the search path again
-- (see 0010).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION build_jobs_after_status() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION build_jobs_after_delete() SET search_path = %I, pg_temp', current_schema());
END
$$;

DROP FUNCTION shift_dependents(TEXT, INT);

DROP TRIGGER build_jobs_readiness_lock ON build_jobs;
CREATE TRIGGER build_jobs_readiness_lock
    BEFORE DELETE ON build_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION build_jobs_before_change();
