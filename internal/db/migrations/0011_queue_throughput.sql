-- Queue throughput (see docs/decisions.md, "The queue's hot path").
--
-- 1. Readiness as a stored generated column. The ready index's predicate used to read
--    blocked_inputs, so every +1/-1 a finish applies to a dependent changed an indexed column
--    and could never be a HOT update. The predicate now reads `ready`, which changes only when
--    the count crosses zero; every other step of the count is HOT when the page has room,
--    which the lower fillfactor leaves. Set first, so the rewrite below already uses it.
ALTER TABLE build_jobs SET (fillfactor = 80);

-- 2. dependent_chain: how many jobs the longest chain of pending jobs above this one holds (0:
--    nothing waits for it). With queue.order = critical-path the enqueue records it and the
--    claim prefers, among a project's ready jobs of one priority, the longest chain; with fifo
--    it stays 0 and the order is the enqueue's.
ALTER TABLE build_jobs
    ADD COLUMN ready BOOLEAN GENERATED ALWAYS AS (blocked_inputs = 0) STORED,
    ADD COLUMN dependent_chain INT NOT NULL DEFAULT 0;

DROP INDEX build_jobs_ready_idx;
CREATE INDEX build_jobs_ready_idx
    ON build_jobs (system, project_id, priority DESC, dependent_chain DESC, created_at, id)
    WHERE status = 'pending' AND ready;

-- 3. Generic plans for the hot statements. A prepared statement is planned again for each
--    execution while PostgreSQL expects a custom plan to beat the generic one; for the claim
--    that planning cost as much as running it (0.6 ms of every claim). Each plan below only
--    follows keys, so the generic plan is the right one for every argument. Never JIT-compiled
--    (see the claim below).
--
-- shift_dependents, a success's readiness step, is also one statement instead of two: the
-- dependents are still locked in id order first (two finishes sharing dependents would
-- otherwise lock them in index order each and could deadlock), inside the update.
CREATE OR REPLACE FUNCTION shift_dependents(input_drv TEXT, delta INT) RETURNS void AS $$
BEGIN
    UPDATE build_jobs r SET blocked_inputs = r.blocked_inputs + delta
    FROM (SELECT l.id FROM build_jobs l
          WHERE l.drv_path IN (SELECT di.referrer FROM derivation_inputs di
                               WHERE di.input_drv = shift_dependents.input_drv)
          ORDER BY l.id
          FOR NO KEY UPDATE) locked
    WHERE r.id = locked.id;
END;
$$ LANGUAGE plpgsql
    SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off
    SET plan_cache_mode = force_generic_plan SET jit = off;

-- The claim (the statement builders run most): for each (system, project) the ready index
-- yields that project's best jobs in priority, chain and FIFO order; the outer ORDER BY merges
-- them by priority DESC, the project's consumed/shares ratio, chain DESC, created_at. The
-- candidates are locked SKIP LOCKED inside a MATERIALIZED CTE, so the statement can neither
-- hand a row to two claimers nor return more than max_jobs rows. A function only so that its
-- plan is cached generic (see 3.); it runs with the caller's rights, so a builder's row-level
-- security applies as to any statement of its own. Without JIT: the generic plan prices each
-- per-project walk by its unLIMITed rows, which on a large queue is far above jit_above_cost,
-- and compiling the statement took 120 ms of a claim that runs in under one.
CREATE FUNCTION claim_jobs(systems TEXT[], features TEXT[], node TEXT, per_group INT, max_jobs INT)
RETURNS TABLE (id BIGINT, drv_path TEXT, system TEXT, project_id BIGINT, priority INT, attempt INT,
               retry_count INT, required_features TEXT[], claimed_at TIMESTAMPTZ)
AS $$
BEGIN
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
$$ LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off;

