-- Readiness kept up to date, so that the claim does not check it per candidate and scan past
-- every job blocked on a long build: blocked_inputs counts a job's input
-- jobs that have not succeeded, so "ready" is blocked_inputs = 0 and the claim never scans jobs
-- waiting for their inputs. Semantics are exactly those of a per-candidate NOT EXISTS: an input
-- derivation with no job (already cached) does not block; one whose job is in any status but
-- 'succeeded' does. See docs/decisions.md for the figures that decided it.

ALTER TABLE build_jobs
    ADD COLUMN blocked_inputs INT NOT NULL DEFAULT 0,
    -- denormalised from derivations, like system, so the claim filters without a join
    ADD COLUMN required_features TEXT[] NOT NULL DEFAULT '{}';

UPDATE build_jobs bj SET required_features = d.required_features
FROM derivations d WHERE d.drv_path = bj.drv_path;

-- The claim walks this index per (system, project) in priority/FIFO order.
CREATE INDEX build_jobs_ready_idx
    ON build_jobs (system, project_id, priority DESC, created_at, id)
    WHERE status = 'pending' AND blocked_inputs = 0;

-- Concurrency. Two kinds of writer change readiness:
--  * enqueues (new jobs, new edges) recount absolutely, and take the transaction advisory lock
--    (class 0x48434931 "HCI1", object 2) EXCLUSIVELY, so they never race each other;
--  * a status crossing into or out of 'succeeded' applies a +1/-1 delta to its dependents; every
--    statement that may cross takes the same lock SHARED first, so it never overlaps an
--    enqueue. Deltas of concurrent finishes commute; they need nothing more.
-- An enqueue's count therefore sees every committed crossing, and every crossing after it sees
-- the enqueue's rows.
--
-- Every function below only follows keys (ids, drv paths, edges): index probes in nested loops
-- are always the right plan. Anything else is forbidden because plpgsql caches plans made while
-- a table looked small (a fresh database, or during one big enqueue), and such a plan counted
-- each job's blockers by hashing the whole table: quadratic, 16 minutes for 100k jobs.

CREATE FUNCTION recount_blocked(job_ids BIGINT[]) RETURNS void AS $$
BEGIN
    UPDATE build_jobs r SET blocked_inputs = c.n
    FROM (
        SELECT j.id, (
            SELECT count(*) FROM derivation_inputs di
            JOIN build_jobs dep ON dep.drv_path = di.input_drv
            WHERE di.referrer = j.drv_path AND dep.status <> 'succeeded'
        )::int AS n
        FROM build_jobs j WHERE j.id = ANY(job_ids)
    ) c
    WHERE r.id = c.id AND r.blocked_inputs <> c.n;
END;
$$ LANGUAGE plpgsql
    SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off;

-- New jobs: count their own blocking inputs, and recount every job that now has a new input job.
CREATE FUNCTION build_jobs_after_insert() RETURNS trigger AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1212369201, 2);
    PERFORM recount_blocked(ARRAY(
        SELECT n.id FROM new_jobs n
        UNION
        SELECT r.id FROM new_jobs n
        JOIN derivation_inputs di ON di.input_drv = n.drv_path
        JOIN build_jobs r ON r.drv_path = di.referrer
    ));
    RETURN NULL;
END;
$$ LANGUAGE plpgsql
    SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off;

CREATE TRIGGER build_jobs_readiness_insert
    AFTER INSERT ON build_jobs REFERENCING NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION build_jobs_after_insert();

-- The shared lock is taken before the statement touches any row: a row trigger runs with its
-- row already locked, and an enqueue (holding the lock exclusively) may be waiting on that row
-- (ON CONFLICT on the same drv_path), which would deadlock.
CREATE FUNCTION build_jobs_before_change() RETURNS trigger AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1212369201, 2);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER build_jobs_readiness_lock
    BEFORE UPDATE OF status OR DELETE ON build_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION build_jobs_before_change();

-- shift_dependents moves the count of every job that has input_drv as an input by delta. The
-- dependents are locked in id order first: two finishes sharing dependents would otherwise lock
-- them in index order each and could deadlock.
CREATE FUNCTION shift_dependents(input_drv TEXT, delta INT) RETURNS void AS $$
BEGIN
    PERFORM 1 FROM build_jobs r
    WHERE r.drv_path IN (SELECT di.referrer FROM derivation_inputs di WHERE di.input_drv = shift_dependents.input_drv)
    ORDER BY r.id FOR NO KEY UPDATE;
    UPDATE build_jobs r SET blocked_inputs = r.blocked_inputs + delta
    FROM derivation_inputs di
    WHERE di.input_drv = shift_dependents.input_drv AND r.drv_path = di.referrer;
END;
$$ LANGUAGE plpgsql
    SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off;

-- A job crossing into 'succeeded' unblocks each dependent by one; crossing out blocks it again.
CREATE FUNCTION build_jobs_after_status() RETURNS trigger AS $$
BEGIN
    PERFORM shift_dependents(NEW.drv_path, CASE WHEN NEW.status = 'succeeded' THEN -1 ELSE 1 END);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER build_jobs_readiness_status
    AFTER UPDATE OF status ON build_jobs
    FOR EACH ROW WHEN ((OLD.status = 'succeeded') IS DISTINCT FROM (NEW.status = 'succeeded'))
    EXECUTE FUNCTION build_jobs_after_status();

-- A deleted job that had not succeeded no longer blocks anyone.
CREATE FUNCTION build_jobs_after_delete() RETURNS trigger AS $$
BEGIN
    PERFORM shift_dependents(OLD.drv_path, -1);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER build_jobs_readiness_delete
    AFTER DELETE ON build_jobs
    FOR EACH ROW WHEN (OLD.status <> 'succeeded')
    EXECUTE FUNCTION build_jobs_after_delete();

-- New or removed edges: recount the referrers' jobs.
CREATE FUNCTION derivation_inputs_after_change() RETURNS trigger AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1212369201, 2);
    PERFORM recount_blocked(ARRAY(
        SELECT j.id FROM changed_edges e JOIN build_jobs j ON j.drv_path = e.referrer));
    RETURN NULL;
END;
$$ LANGUAGE plpgsql
    SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off;

CREATE TRIGGER derivation_inputs_readiness_insert
    AFTER INSERT ON derivation_inputs REFERENCING NEW TABLE AS changed_edges
    FOR EACH STATEMENT EXECUTE FUNCTION derivation_inputs_after_change();

CREATE TRIGGER derivation_inputs_readiness_delete
    AFTER DELETE ON derivation_inputs REFERENCING OLD TABLE AS changed_edges
    FOR EACH STATEMENT EXECUTE FUNCTION derivation_inputs_after_change();
