-- What a node's own database role may write is bounded by the database, not by the node's code
-- (see docs/decisions.md, "What each role may write"). For the default single-owner setup this
-- changes nothing: the owner's claims take their arguments as given.

-- 1. The claim is the only way a builder's login moves a job from pending to building (its
--    row-level security no longer lets it set a claim itself). The function runs as the schema
--    owner; for any other caller it claims only for the caller's own login, only systems and
--    features its nodes row declares, and no more jobs than its free slots (max_jobs less the
--    jobs it holds): without that bound a builder could claim every ready job, keep the one it
--    wants and give the others back. The candidates are the ready index's, so a job whose
--    inputs are not built is never claimed. The statement is migration 0011's.
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
$$ LANGUAGE plpgsql SECURITY DEFINER SET plan_cache_mode = force_generic_plan SET jit = off;

-- As for the readiness triggers (0010): the search_path is pinned to the tables' schema with
-- pg_temp last, so a caller's temporary tables cannot stand in for ours; and only the roles
-- granted it (roles.sql) may call a function that runs as the owner.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION claim_jobs(TEXT[], TEXT[], TEXT, INT, INT) SET search_path = %I, pg_temp',
                   current_schema());
END
$$;
REVOKE ALL ON FUNCTION claim_jobs(TEXT[], TEXT[], TEXT, INT, INT) FROM PUBLIC;

-- 2. What an evaluator's ingest writes (derivations, their outputs and inputs, jobs) it writes
--    for one evaluation it holds, named by the transaction-local setting harmonia.eval_id (see
--    eval's sqlHoldClaim). The rows themselves are shared by every evaluation that reaches
--    them, so the setting is the one link between a row and an evaluation when it is written;
--    it is only a pointer: the policies believe it only for a running evaluation claimed by
--    the session's own login. ingest_project is that evaluation's project, or NULL.
CREATE FUNCTION ingest_project() RETURNS BIGINT AS $$
    SELECT e.project_id FROM evaluations e
    WHERE e.id = NULLIF(current_setting('harmonia.eval_id', true), '')::bigint
      AND e.claimed_by = session_user AND e.status = 'running'
$$ LANGUAGE sql STABLE;

-- Whether derivation drv was inserted by the current transaction: an ingest writes a
-- derivation's outputs and inputs in the transaction that writes the derivation, so outputs
-- or inputs added to a derivation recorded earlier are not an ingest's. The ingest runs no
-- savepoints, so its rows carry the top-level transaction id. (xmin is 32 bits, compared with
-- the low 32 bits of the current 64-bit id.)
CREATE FUNCTION derivation_inserted_here(drv TEXT) RETURNS BOOLEAN AS $$
    SELECT EXISTS (SELECT 1 FROM derivations d
                   WHERE d.drv_path = drv AND d.xmin::text::bigint = txid_current() % 4294967296)
$$ LANGUAGE sql VOLATILE;

-- 3. What a builder's login may declare in its nodes row, set by the administrator with
--    `harmonia-ci db grant-node` (dbroles.GrantNode) and written only by the owner. The row is
--    the node's own, so without a ceiling it could declare any system and any number of slots,
--    claim every ready job and give back all but the one it wants.
CREATE TABLE node_grants (
    id       TEXT PRIMARY KEY,
    systems  TEXT[] NOT NULL,
    features TEXT[] NOT NULL,
    max_jobs INT NOT NULL CHECK (max_jobs >= 1)
);

-- An upgrade keeps the builders it had: each builder registered now is granted what it declares,
-- as `db grant-node` would have recorded from its configuration.
INSERT INTO node_grants (id, systems, features, max_jobs)
SELECT n.id, n.systems, n.features, n.max_jobs FROM nodes n
WHERE 'builder' = ANY(n.roles) AND n.max_jobs >= 1
ON CONFLICT (id) DO NOTHING;
