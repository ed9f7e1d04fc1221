-- Per-role database roles, so that a node sharing the database writes only what its roles
-- need and only its own rows. Run by `harmonia-ci db roles --apply` as the
-- owner of the schema, in one transaction; running it again converges on exactly these grants.
--
-- harmonia_node is what every node may do whatever its roles: read everything, keep its own
-- nodes row, end its own leases and give back its own claims (a restarted node releases what
-- its previous process held, whatever its roles). Each role's group is a member of it and adds
-- that role's writes. A node logs in as a role named after its node id (`db grant-node`), so
-- row-level security compares claimed_by, nodes.id and leaders.node_id with session_user,
-- which a session cannot change (unlike a setting such as app.node_id).
--
-- Row-level security is enabled here, not by a migration, and never FORCEd: the schema owner
-- bypasses it, so the default single-owner setup (and the owner's triggers, see migration
-- 0010) works unchanged.

-- ===== Roles =====

DO $$
DECLARE
    r TEXT;
BEGIN
    FOREACH r IN ARRAY ARRAY['harmonia_node', 'harmonia_frontend', 'harmonia_evaluator',
                             'harmonia_signer', 'harmonia_cache', 'harmonia_builder'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', r);
        END IF;
    END LOOP;
END
$$;

GRANT harmonia_node TO harmonia_frontend, harmonia_evaluator, harmonia_signer, harmonia_cache, harmonia_builder;

-- Standbys end the session of a leader whose lease ran out (a paused process keeps its lock
-- forever otherwise); sessions of other login roles can only be ended with this.
GRANT pg_signal_backend TO harmonia_frontend, harmonia_signer;

-- The schema itself (public needs nothing, another schema does).
DO $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO harmonia_node', current_schema());
END
$$;

-- ===== Start from nothing =====

-- The claim runs as the owner (migration 0016): only builders may call it.
REVOKE ALL ON FUNCTION claim_jobs(TEXT[], TEXT[], TEXT, INT, INT)
    FROM PUBLIC, harmonia_node, harmonia_frontend, harmonia_evaluator, harmonia_signer, harmonia_cache,
         harmonia_builder;

REVOKE ALL ON schema_migrations, derivations, derivation_outputs, derivation_inputs, repositories,
    projects, evaluations, eval_attrs, eval_units, build_jobs, build_attempts, build_log_tails, nodes, leaders,
    maintenance_runs, signing_keys, webhook_deliveries, gc_runs, gc_requests, drv_objects, node_grants, cache_tokens,
    repository_credentials, api_tokens, action_log
    FROM harmonia_node, harmonia_frontend, harmonia_evaluator, harmonia_signer, harmonia_cache,
         harmonia_builder;

DO $$
DECLARE
    p RECORD;
BEGIN
    FOR p IN SELECT policyname, tablename FROM pg_policies
             WHERE schemaname = current_schema() AND policyname LIKE 'harmonia\_%' LOOP
        EXECUTE format('DROP POLICY %I ON %I', p.policyname, p.tablename);
    END LOOP;
END
$$;

-- ===== Every node =====

GRANT SELECT ON schema_migrations, derivations, derivation_outputs, derivation_inputs, repositories,
    projects, evaluations, eval_attrs, eval_units, build_jobs, build_attempts, build_log_tails, nodes, leaders,
    maintenance_runs, signing_keys, webhook_deliveries, gc_runs, gc_requests, drv_objects, node_grants,
    cache_tokens, -- sha256 of random tokens: reading them gives no token
    action_log
    TO harmonia_node;

-- Its own row: registration, heartbeats, draining, deregistration. The roles it advertises
-- must be roles its login role has: a builder that registered as a signer or a cache would be
-- sent other nodes' tokens and asked for inputs. A builder's login declares no system, feature
-- or slot beyond its grant (node_grants): the claim takes them from this row.
GRANT INSERT (id, roles, endpoint, hostname, max_evals, systems, features, max_jobs, status,
              version, incarnation, started_at, last_seen, draining, nix_version, nix_protocol),
      UPDATE (roles, endpoint, hostname, max_evals, systems, features, max_jobs, status, version,
              incarnation, started_at, last_seen, draining, current_jobs, cpu_usage,
              memory_usage, speed_factor, nix_version, nix_protocol),
      DELETE
    ON nodes TO harmonia_node;

-- Its leases, ended at once when a new process of the node registers.
GRANT UPDATE (lease_until, renewed_at) ON leaders TO harmonia_node;

-- Its claims, given back at registration (queue.ReleaseNode).
GRANT UPDATE (status, claimed_by, claimed_at, started_at, finished_at, retry_count)
    ON build_jobs TO harmonia_node;
GRANT UPDATE (status, claimed_by, claimed_at, started_at) ON evaluations TO harmonia_node;
GRANT UPDATE (status, claimed_by, claimed_at) ON eval_units TO harmonia_node;

-- ===== Frontend: webhooks, the UI's actions, commit statuses, projects, maintenance =====

GRANT INSERT, UPDATE, DELETE ON repositories, projects, evaluations, eval_attrs,
    webhook_deliveries TO harmonia_frontend;
GRANT INSERT ON gc_requests TO harmonia_frontend;
-- Only frontends see the web UI's sessions and admin bindings.
GRANT SELECT, INSERT, DELETE ON web_sessions TO harmonia_frontend;
-- Credentials moved out of old repository URLs: the frontend hands them to the evaluator that
-- holds an evaluation of the repository (evalcred), as it mints a forge's; no other role reads
-- them.
GRANT SELECT ON repository_credentials TO harmonia_frontend;
GRANT SELECT, INSERT, DELETE ON admin_logins TO harmonia_frontend;
-- Users' own cache tokens: minted and revoked in the UI, their projects refreshed from the forge.
GRANT INSERT, UPDATE (project_ids, login, refreshed_at, revoked_at) ON cache_tokens TO harmonia_frontend;
-- API tokens: only frontends authenticate with them (a node's reading one's user and lifetime
-- would serve no purpose); users mint and revoke theirs in the UI. Every write through the API
-- or the UI is recorded.
GRANT SELECT, INSERT, UPDATE (last_used_at, revoked_at) ON api_tokens TO harmonia_frontend;
GRANT INSERT ON action_log TO harmonia_frontend;
GRANT INSERT, DELETE ON maintenance_runs TO harmonia_frontend;
-- Rebuild, cancel, the reaper, unsupported builds; blocked_inputs and ready for the readiness
-- audit.
GRANT UPDATE (status, priority, claimed_by, claimed_at, started_at, finished_at, exit_code,
              retry_count, error_message, blocked_inputs, ready, failure_retries, retry_at)
    ON build_jobs TO harmonia_frontend;
-- The reaper puts back the evaluation units of dead nodes.
GRANT UPDATE (status, claimed_by, claimed_at) ON eval_units TO harmonia_frontend;
-- Drain requests, dead nodes and their cleanup.
GRANT UPDATE (status, draining), DELETE ON nodes TO harmonia_frontend;
-- The maintenance leader's election.
GRANT INSERT, UPDATE ON leaders TO harmonia_frontend;

-- ===== Evaluator: its evaluations, the derivation tables, new jobs =====

GRANT UPDATE (status, claimed_by, claimed_at, started_at, finished_at, attempt, error,
              retention_seconds, nix_version, base_commit, merge_commit, workers, worker_memory,
              worker_restarts)
    ON evaluations TO harmonia_evaluator;
GRANT INSERT, DELETE ON eval_attrs TO harmonia_evaluator;
-- The units of the evaluations it runs or helps with: split off, claimed, done, handed back.
GRANT INSERT, UPDATE (status, claimed_by, claimed_at, attempt), DELETE ON eval_units TO harmonia_evaluator;
GRANT INSERT ON derivations, derivation_inputs TO harmonia_evaluator;
-- Never nar_hash or nar_size: the canonical NAR hash is the signer's to record.
GRANT INSERT (drv_path, output_name, output_path) ON derivation_outputs TO harmonia_evaluator;
GRANT INSERT (drv_path, project_id, system, required_features, dependent_chain, trusted, retry_limit,
              retry_backoff_secs) ON build_jobs TO harmonia_evaluator;
-- Reviving cancelled jobs a new evaluation needs, cancelling those a failed one no longer does;
-- the critical-path order of the pending jobs its new jobs wait for; a trusted evaluation's
-- trust in the jobs it needs, and the rebuild of quarantined outputs it does not promote; its
-- retry policy on the queued jobs it needs, and the retry of failures past its failure expiry.
GRANT UPDATE (status, finished_at, claimed_by, claimed_at, started_at, dependent_chain, trusted,
              retry_limit, retry_backoff_secs, retry_count, failure_retries, retry_at, exit_code,
              error_message) ON build_jobs TO harmonia_evaluator;
-- A trusted evaluation promotes the quarantined outputs it needs (when its project promotes).
GRANT UPDATE (quarantined) ON derivation_outputs TO harmonia_evaluator;

-- ===== Signer: build results, NAR hashes, keys; the GC leader =====

GRANT UPDATE (status, finished_at, exit_code, error_message, log_url), DELETE
    ON build_jobs TO harmonia_signer;
GRANT UPDATE (nar_hash, nar_size, quarantined, nonrepro_nar_hash) ON derivation_outputs TO harmonia_signer;
GRANT INSERT, UPDATE (last_seen) ON signing_keys TO harmonia_signer;
GRANT DELETE ON evaluations, derivations, webhook_deliveries, gc_requests TO harmonia_signer;
GRANT INSERT, UPDATE, DELETE ON gc_runs TO harmonia_signer;
-- Attempts are written by the owner's trigger (migration 0026); the GC expires their logs.
GRANT UPDATE (log_key) ON build_attempts TO harmonia_signer;
-- The .drv objects of the cache: written by the signer's publish, deleted by the GC.
GRANT INSERT, DELETE ON drv_objects TO harmonia_signer;
GRANT INSERT ON maintenance_runs TO harmonia_signer;
GRANT INSERT, UPDATE ON leaders TO harmonia_signer;

-- ===== Cache: reads only =====

-- ===== Builder: its claimed jobs and their log tails =====

-- A claim only through claim_jobs, which takes ready jobs of the node's registered systems and
-- features within its free slots; then its own claims on (the attempt is the claim's to count).
GRANT EXECUTE ON FUNCTION claim_jobs(TEXT[], TEXT[], TEXT, INT, INT) TO harmonia_builder;
GRANT UPDATE (status, claimed_by, claimed_at, started_at, finished_at, retry_count,
              exit_code, error_message, log_url, failures, failure_retries, retry_at)
    ON build_jobs TO harmonia_builder;
GRANT INSERT, UPDATE (log_tail, log_seq), DELETE ON build_log_tails TO harmonia_builder;
-- Builder time charged to projects (fair shares).
GRANT UPDATE (consumed_seconds) ON projects TO harmonia_builder;

-- ===== Row-level security =====

ALTER TABLE nodes ENABLE ROW LEVEL SECURITY;
ALTER TABLE leaders ENABLE ROW LEVEL SECURITY;
ALTER TABLE build_jobs ENABLE ROW LEVEL SECURITY;
ALTER TABLE build_log_tails ENABLE ROW LEVEL SECURITY;
ALTER TABLE evaluations ENABLE ROW LEVEL SECURITY;
ALTER TABLE eval_attrs ENABLE ROW LEVEL SECURITY;
ALTER TABLE eval_units ENABLE ROW LEVEL SECURITY;
ALTER TABLE derivations ENABLE ROW LEVEL SECURITY;
ALTER TABLE derivation_outputs ENABLE ROW LEVEL SECURITY;
ALTER TABLE derivation_inputs ENABLE ROW LEVEL SECURITY;

-- nodes

CREATE POLICY harmonia_read ON nodes FOR SELECT TO harmonia_node USING (true);
CREATE POLICY harmonia_own_insert ON nodes FOR INSERT TO harmonia_node
    WITH CHECK (id = session_user AND roles <@ ARRAY(
        SELECT m.role FROM (VALUES ('frontend', 'harmonia_frontend'), ('evaluator', 'harmonia_evaluator'),
                                   ('signer', 'harmonia_signer'), ('cache', 'harmonia_cache'),
                                   ('builder', 'harmonia_builder')) AS m(role, grp)
        WHERE pg_has_role(session_user, m.grp, 'MEMBER'))
        AND (NOT pg_has_role(session_user, 'harmonia_builder', 'MEMBER')
             OR EXISTS (SELECT 1 FROM node_grants g WHERE g.id = session_user AND nodes.systems <@ g.systems
                        AND nodes.features <@ g.features AND nodes.max_jobs <= g.max_jobs)));
CREATE POLICY harmonia_own_update ON nodes FOR UPDATE TO harmonia_node
    USING (id = session_user)
    WITH CHECK (id = session_user AND roles <@ ARRAY(
        SELECT m.role FROM (VALUES ('frontend', 'harmonia_frontend'), ('evaluator', 'harmonia_evaluator'),
                                   ('signer', 'harmonia_signer'), ('cache', 'harmonia_cache'),
                                   ('builder', 'harmonia_builder')) AS m(role, grp)
        WHERE pg_has_role(session_user, m.grp, 'MEMBER'))
        AND (NOT pg_has_role(session_user, 'harmonia_builder', 'MEMBER')
             OR EXISTS (SELECT 1 FROM node_grants g WHERE g.id = session_user AND nodes.systems <@ g.systems
                        AND nodes.features <@ g.features AND nodes.max_jobs <= g.max_jobs)));
CREATE POLICY harmonia_own_delete ON nodes FOR DELETE TO harmonia_node USING (id = session_user);
-- The frontend marks nodes dead, deletes dead rows and forwards drain requests, but changes no
-- other node's roles or endpoint. (A subquery in WITH CHECK reads the row as it was before the
-- statement.)
CREATE POLICY harmonia_frontend_update ON nodes FOR UPDATE TO harmonia_frontend
    USING (true)
    WITH CHECK ((roles, endpoint) = (SELECT n.roles, n.endpoint FROM nodes n WHERE n.id = nodes.id));
CREATE POLICY harmonia_frontend_delete ON nodes FOR DELETE TO harmonia_frontend USING (true);

-- leaders: a node ends only its own leases; a frontend stands for maintenance, a signer for
-- gc, each only in its own name.

CREATE POLICY harmonia_read ON leaders FOR SELECT TO harmonia_node USING (true);
CREATE POLICY harmonia_own_release ON leaders FOR UPDATE TO harmonia_node
    USING (node_id = session_user) WITH CHECK (node_id = session_user);
CREATE POLICY harmonia_frontend_insert ON leaders FOR INSERT TO harmonia_frontend
    WITH CHECK (role = 'maintenance' AND node_id = session_user);
CREATE POLICY harmonia_frontend_update ON leaders FOR UPDATE TO harmonia_frontend
    USING (role = 'maintenance') WITH CHECK (role = 'maintenance' AND node_id = session_user);
CREATE POLICY harmonia_signer_insert ON leaders FOR INSERT TO harmonia_signer
    WITH CHECK (role = 'gc' AND node_id = session_user);
CREATE POLICY harmonia_signer_update ON leaders FOR UPDATE TO harmonia_signer
    USING (role = 'gc') WITH CHECK (role = 'gc' AND node_id = session_user);

-- build_jobs

CREATE POLICY harmonia_read ON build_jobs FOR SELECT TO harmonia_node USING (true);
-- Any node gives back its own claims: to the queue, or failed past its retries. The WITH CHECK
-- expressions of all of a role's policies are ORed, not paired with their USING, so each one
-- says itself which rows it is for: a subquery in WITH CHECK reads the row as it was before
-- the statement.
CREATE POLICY harmonia_own_release ON build_jobs FOR UPDATE TO harmonia_node
    USING (claimed_by = session_user)
    WITH CHECK ((status = 'pending' AND claimed_by IS NULL
                 AND (SELECT o.claimed_by FROM build_jobs o WHERE o.id = build_jobs.id) = session_user)
                OR (status = 'failed' AND claimed_by = session_user));
-- A builder moves its own claims on: uploading, failed, cancelled, back to the queue. Never
-- succeeded: the signer records that; never a new claim: claim_jobs makes those, as the owner.
-- A failure marks the pending jobs above it dep-failed. (The subqueries read the row as it was
-- before the statement: only a job this builder held in building or uploading stays or goes
-- back.)
CREATE POLICY harmonia_builder_update ON build_jobs FOR UPDATE TO harmonia_builder
    USING (claimed_by = session_user OR (status = 'pending' AND claimed_by IS NULL))
    WITH CHECK ((claimed_by = session_user AND status IN ('building', 'uploading', 'failed', 'cancelled')
                 AND (SELECT o.claimed_by = session_user AND o.status IN ('building', 'uploading')
                      FROM build_jobs o WHERE o.id = build_jobs.id))
                OR (claimed_by IS NULL AND status = 'dep-failed')
                OR (claimed_by IS NULL AND status = 'pending'
                    AND (SELECT o.claimed_by FROM build_jobs o WHERE o.id = build_jobs.id) = session_user));
-- An evaluator adds pending jobs to the project of the evaluation it ingests (see derivations
-- below), revives cancelled ones and cancels pending ones.
CREATE POLICY harmonia_evaluator_insert ON build_jobs FOR INSERT TO harmonia_evaluator
    WITH CHECK (status = 'pending' AND claimed_by IS NULL AND project_id = ingest_project()
                AND (NOT trusted OR ingest_trusted_project() IS NOT NULL));
CREATE POLICY harmonia_evaluator_update ON build_jobs FOR UPDATE TO harmonia_evaluator
    USING (status IN ('pending', 'cancelled'))
    WITH CHECK (status IN ('pending', 'cancelled') AND claimed_by IS NULL);
-- An evaluation builds again the failed jobs it needs past its failure expiry (migration 0028):
-- a failed job and its dep-failed dependents go back to pending, and a dependent that still has
-- a failed input is dep-failed again.
CREATE POLICY harmonia_evaluator_expire ON build_jobs FOR UPDATE TO harmonia_evaluator
    USING (status IN ('failed', 'dep-failed') AND ingest_project() IS NOT NULL)
    WITH CHECK (status IN ('pending', 'dep-failed') AND claimed_by IS NULL AND ingest_project() IS NOT NULL);
-- A trusted evaluation's ingest (migration 0022) marks the jobs it needs trusted, whatever their
-- status, and resets a succeeded one whose outputs are quarantined when its project does not
-- promote them.
CREATE POLICY harmonia_evaluator_trust ON build_jobs FOR UPDATE TO harmonia_evaluator
    USING (ingest_trusted_project() IS NOT NULL)
    WITH CHECK (trusted AND ingest_trusted_project() IS NOT NULL);
-- Whichever policy lets an evaluator at a row (WITH CHECKs are ORed), trust only grows, and
-- only in a trusted evaluation's ingest; a job out of the queue (building, finished) keeps its
-- status and claim, but for that reset.
CREATE POLICY harmonia_evaluator_bounds ON build_jobs AS RESTRICTIVE FOR UPDATE TO harmonia_evaluator
    USING (true)
    WITH CHECK ((SELECT (o.trusted = build_jobs.trusted OR (build_jobs.trusted AND ingest_trusted_project() IS NOT NULL))
                        AND (o.status IN ('pending', 'cancelled')
                             OR (o.status = build_jobs.status AND o.claimed_by IS NOT DISTINCT FROM build_jobs.claimed_by)
                             OR (o.status IN ('failed', 'dep-failed') AND build_jobs.status = 'pending'
                                 AND build_jobs.claimed_by IS NULL AND ingest_project() IS NOT NULL)
                             OR (o.status = 'succeeded' AND build_jobs.status = 'pending' AND build_jobs.claimed_by IS NULL
                                 AND ingest_trusted_project() IS NOT NULL AND NOT ingest_promotes()))
                 FROM build_jobs o WHERE o.id = build_jobs.id));
-- The signer records results (and the GC expires logs); it deletes what nobody is building.
CREATE POLICY harmonia_signer_update ON build_jobs FOR UPDATE TO harmonia_signer
    USING (true) WITH CHECK (status IN ('succeeded', 'failed', 'cancelled', 'dep-failed'));
CREATE POLICY harmonia_signer_delete ON build_jobs FOR DELETE TO harmonia_signer
    USING (status NOT IN ('building', 'uploading'));
-- The frontend cancels, rebuilds, reaps and fails unsupported jobs; it never marks one
-- succeeded, and never makes a claim: a job it leaves building or uploading was so before,
-- held by the same node.
CREATE POLICY harmonia_frontend_update ON build_jobs FOR UPDATE TO harmonia_frontend
    USING (true)
    WITH CHECK (status <> 'succeeded'
                AND (status NOT IN ('building', 'uploading')
                     OR (SELECT o.status IN ('building', 'uploading') AND o.claimed_by = build_jobs.claimed_by
                         FROM build_jobs o WHERE o.id = build_jobs.id)));

-- build_log_tails: a builder writes the tails of the jobs it holds.

CREATE POLICY harmonia_read ON build_log_tails FOR SELECT TO harmonia_node USING (true);
CREATE POLICY harmonia_builder_own ON build_log_tails FOR ALL TO harmonia_builder
    USING (EXISTS (SELECT 1 FROM build_jobs j WHERE j.id = build_job_id AND j.claimed_by = session_user))
    WITH CHECK (EXISTS (SELECT 1 FROM build_jobs j WHERE j.id = build_job_id AND j.claimed_by = session_user));

-- evaluations

CREATE POLICY harmonia_read ON evaluations FOR SELECT TO harmonia_node USING (true);
CREATE POLICY harmonia_own_release ON evaluations FOR UPDATE TO harmonia_node
    USING (claimed_by = session_user)
    WITH CHECK (status = 'queued' AND claimed_by IS NULL
                AND (SELECT o.claimed_by FROM evaluations o WHERE o.id = evaluations.id) = session_user);
-- An evaluator claims a queued evaluation for itself and finishes or hands back its own
-- (harmonia_own_release).
CREATE POLICY harmonia_evaluator_update ON evaluations FOR UPDATE TO harmonia_evaluator
    USING (claimed_by = session_user OR (status = 'queued' AND claimed_by IS NULL))
    WITH CHECK (claimed_by = session_user AND status IN ('running', 'succeeded', 'failed'));
-- An evaluator walking a unit of a running evaluation fails it at its walk's first error, as
-- the claimant would.
CREATE POLICY harmonia_evaluator_fail_helped ON evaluations FOR UPDATE TO harmonia_evaluator
    USING (status = 'running'
           AND EXISTS (SELECT 1 FROM eval_units u
                       WHERE u.eval_id = evaluations.id AND u.eval_attempt = evaluations.attempt
                         AND u.claimed_by = session_user AND u.status = 'running'))
    WITH CHECK (status = 'failed');
CREATE POLICY harmonia_frontend_all ON evaluations FOR ALL TO harmonia_frontend USING (true) WITH CHECK (true);
CREATE POLICY harmonia_signer_delete ON evaluations FOR DELETE TO harmonia_signer USING (true);

-- eval_attrs: an evaluator writes the attributes of the evaluations it holds.

CREATE POLICY harmonia_read ON eval_attrs FOR SELECT TO harmonia_node USING (true);
CREATE POLICY harmonia_evaluator_insert ON eval_attrs FOR INSERT TO harmonia_evaluator
    WITH CHECK (EXISTS (SELECT 1 FROM evaluations e WHERE e.id = eval_id AND e.claimed_by = session_user)
                OR EXISTS (SELECT 1 FROM evaluations e JOIN eval_units u ON u.eval_id = e.id AND u.eval_attempt = e.attempt
                           WHERE e.id = eval_attrs.eval_id AND e.status = 'running'
                             AND u.claimed_by = session_user AND u.status = 'running'));
CREATE POLICY harmonia_evaluator_delete ON eval_attrs FOR DELETE TO harmonia_evaluator
    USING (EXISTS (SELECT 1 FROM evaluations e WHERE e.id = eval_id AND e.claimed_by = session_user));
CREATE POLICY harmonia_frontend_all ON eval_attrs FOR ALL TO harmonia_frontend USING (true) WITH CHECK (true);

-- eval_units: the parts of an evaluation's tree that several evaluators walk. A node gives back
-- only its own; an evaluator claims a queued unit of a running evaluation and moves on only
-- its own running ones; units are queued by the evaluation's claimant or by the walker of the
-- unit they come from, and cleared by the claimant. The frontend's reaper puts back a dead
-- node's. (Subqueries in WITH CHECK read the row as it was before the statement.)

CREATE POLICY harmonia_read ON eval_units FOR SELECT TO harmonia_node USING (true);
CREATE POLICY harmonia_own_release ON eval_units FOR UPDATE TO harmonia_node
    USING (claimed_by = session_user)
    WITH CHECK (status = 'queued' AND claimed_by IS NULL
                AND (SELECT o.claimed_by FROM eval_units o WHERE o.id = eval_units.id) = session_user);
CREATE POLICY harmonia_evaluator_claim ON eval_units FOR UPDATE TO harmonia_evaluator
    USING (status = 'queued' AND claimed_by IS NULL)
    WITH CHECK (status = 'running' AND claimed_by = session_user
                AND (SELECT o.status = 'queued' AND o.claimed_by IS NULL FROM eval_units o WHERE o.id = eval_units.id));
CREATE POLICY harmonia_evaluator_walk ON eval_units FOR UPDATE TO harmonia_evaluator
    USING (claimed_by = session_user AND status = 'running')
    WITH CHECK (claimed_by = session_user AND status IN ('running', 'done')
                AND (SELECT o.claimed_by = session_user AND o.status = 'running' AND o.attempt = eval_units.attempt
                     FROM eval_units o WHERE o.id = eval_units.id));
CREATE POLICY harmonia_evaluator_insert ON eval_units FOR INSERT TO harmonia_evaluator
    WITH CHECK (status = 'queued' AND claimed_by IS NULL
                AND (EXISTS (SELECT 1 FROM evaluations e
                             WHERE e.id = eval_units.eval_id AND e.attempt = eval_units.eval_attempt
                               AND e.status = 'running' AND e.claimed_by = session_user)
                     OR EXISTS (SELECT 1 FROM eval_units p
                                WHERE p.id = eval_units.parent_id AND p.eval_id = eval_units.eval_id
                                  AND p.claimed_by = session_user AND p.status = 'running')));
CREATE POLICY harmonia_evaluator_delete ON eval_units FOR DELETE TO harmonia_evaluator
    USING (EXISTS (SELECT 1 FROM evaluations e WHERE e.id = eval_units.eval_id AND e.claimed_by = session_user));
CREATE POLICY harmonia_frontend_all ON eval_units FOR ALL TO harmonia_frontend USING (true) WITH CHECK (true);

-- derivations, derivation_outputs, derivation_inputs: an evaluator writes them only in an
-- ingest transaction that names an evaluation it holds and is running (ingest_project,
-- migration 0016), and outputs and inputs only of derivations that transaction inserted: none
-- added to a derivation recorded before, which other evaluations' jobs and the signer's checks
-- rely on. A row identical to one already there is let through: an ingest that lost the race to
-- insert a shared derivation conflicts on it and writes nothing (ON CONFLICT DO NOTHING).

CREATE POLICY harmonia_read ON derivations FOR SELECT TO harmonia_node USING (true);
CREATE POLICY harmonia_evaluator_insert ON derivations FOR INSERT TO harmonia_evaluator
    WITH CHECK (ingest_project() IS NOT NULL);
CREATE POLICY harmonia_signer_delete ON derivations FOR DELETE TO harmonia_signer USING (true);

CREATE POLICY harmonia_read ON derivation_outputs FOR SELECT TO harmonia_node USING (true);
CREATE POLICY harmonia_evaluator_insert ON derivation_outputs FOR INSERT TO harmonia_evaluator
    WITH CHECK (ingest_project() IS NOT NULL
                AND (derivation_inserted_here(drv_path)
                     OR EXISTS (SELECT 1 FROM derivation_outputs o
                                WHERE o.drv_path = derivation_outputs.drv_path
                                  AND o.output_name = derivation_outputs.output_name
                                  AND o.output_path IS NOT DISTINCT FROM derivation_outputs.output_path)));
CREATE POLICY harmonia_signer_update ON derivation_outputs FOR UPDATE TO harmonia_signer
    USING (true) WITH CHECK (true);
-- A trusted evaluation whose project promotes quarantined outputs releases them.
CREATE POLICY harmonia_evaluator_promote ON derivation_outputs FOR UPDATE TO harmonia_evaluator
    USING (quarantined AND ingest_promotes()) WITH CHECK (NOT quarantined);

CREATE POLICY harmonia_read ON derivation_inputs FOR SELECT TO harmonia_node USING (true);
CREATE POLICY harmonia_evaluator_insert ON derivation_inputs FOR INSERT TO harmonia_evaluator
    WITH CHECK (ingest_project() IS NOT NULL
                AND (derivation_inserted_here(referrer)
                     OR EXISTS (SELECT 1 FROM derivation_inputs o
                                WHERE o.referrer = derivation_inputs.referrer
                                  AND o.input_drv = derivation_inputs.input_drv
                                  AND o.outputs = derivation_inputs.outputs)));
