-- The full schema, both layers (the Nix store layer and the CI layer), plus the cluster tables
-- (nodes, leases). Deviations from the design are recorded in docs/decisions.md.

-- ===== Layer 1: Nix store schema =====

CREATE TABLE derivations (
    drv_path          TEXT PRIMARY KEY,
    hash_part         TEXT NOT NULL,
    name              TEXT NOT NULL,
    system            TEXT NOT NULL,
    required_features TEXT[] NOT NULL DEFAULT '{}',
    drv_json          JSONB,
    nar_hash          TEXT NOT NULL,
    nar_size          BIGINT NOT NULL,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK (drv_path LIKE '/nix/store/%.drv'),
    CHECK (length(hash_part) = 32)
);
CREATE INDEX derivations_hash_part_idx ON derivations (hash_part);
CREATE INDEX derivations_system_idx ON derivations (system);

CREATE TABLE derivation_outputs (
    drv_path    TEXT NOT NULL REFERENCES derivations(drv_path) ON DELETE CASCADE,
    output_name TEXT NOT NULL,
    output_path TEXT,
    nar_hash    TEXT,
    nar_size    BIGINT,
    PRIMARY KEY (drv_path, output_name)
);
CREATE INDEX derivation_outputs_output_path_idx ON derivation_outputs (output_path);

CREATE TABLE derivation_inputs (
    referrer  TEXT NOT NULL REFERENCES derivations(drv_path) ON DELETE CASCADE,
    input_drv TEXT NOT NULL,
    outputs   TEXT[] NOT NULL,
    PRIMARY KEY (referrer, input_drv)
);
CREATE INDEX derivation_inputs_input_drv_idx ON derivation_inputs (input_drv);

-- ===== Layer 2: CI schema =====

CREATE TABLE repositories (
    id             BIGINT PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
    forge          TEXT NOT NULL,
    owner          TEXT NOT NULL,
    name           TEXT NOT NULL,
    full_name      TEXT NOT NULL,
    clone_url      TEXT NOT NULL,
    is_private     BOOLEAN NOT NULL DEFAULT false,
    default_branch TEXT NOT NULL DEFAULT 'main',
    last_synced    TIMESTAMPTZ DEFAULT now(),
    UNIQUE (forge, full_name)
);

CREATE TABLE projects (
    id                BIGINT PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
    repo_id           BIGINT NOT NULL REFERENCES repositories(id) UNIQUE,
    name              TEXT NOT NULL UNIQUE,
    enabled           BOOLEAN NOT NULL DEFAULT true,
    scheduling_shares INT NOT NULL DEFAULT 100 CHECK (scheduling_shares > 0),
    consumed_seconds  FLOAT NOT NULL DEFAULT 0 CHECK (consumed_seconds >= 0),
    pr_enabled        BOOLEAN NOT NULL DEFAULT true,
    pr_trust          TEXT NOT NULL DEFAULT 'collaborators'
                      CHECK (pr_trust IN ('collaborators', 'all', 'none')),
    poll_interval     INT NOT NULL DEFAULT 0 CHECK (poll_interval >= 0),
    last_polled       TIMESTAMPTZ,  -- forge-integration.md: polling needs it
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE evaluations (
    id             BIGINT PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
    project_id     BIGINT NOT NULL REFERENCES projects(id),
    flake_url      TEXT NOT NULL,
    commit_sha     TEXT NOT NULL,
    branch         TEXT NOT NULL,
    tree_hash      TEXT,
    status         TEXT NOT NULL DEFAULT 'queued'
                   CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled', 'skipped')),
    skipped_reason TEXT,
    reuses_eval_id BIGINT REFERENCES evaluations(id),
    claimed_by     TEXT,
    claimed_at     TIMESTAMPTZ,
    started_at     TIMESTAMPTZ,
    finished_at    TIMESTAMPTZ,
    error          TEXT,
    last_status    TEXT,
    last_status_at TIMESTAMPTZ,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),  -- GC needs it for never-started evals
    UNIQUE (project_id, commit_sha, branch)
);
CREATE INDEX evaluations_project_branch_idx ON evaluations (project_id, branch, status);
CREATE INDEX evaluations_project_tree_idx ON evaluations (project_id, tree_hash, status);
CREATE INDEX evaluations_queued_idx ON evaluations (status) WHERE status = 'queued';
CREATE INDEX evaluations_running_claim_idx ON evaluations (claimed_by) WHERE status = 'running';

CREATE TABLE eval_attrs (
    id       BIGINT PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
    eval_id  BIGINT NOT NULL REFERENCES evaluations(id) ON DELETE CASCADE,
    attr     TEXT NOT NULL,
    drv_path TEXT REFERENCES derivations(drv_path),
    error    TEXT,
    UNIQUE (eval_id, attr)
);
CREATE INDEX eval_attrs_drv_path_idx ON eval_attrs (drv_path);

CREATE TABLE build_jobs (
    id          BIGINT PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
    drv_path    TEXT NOT NULL REFERENCES derivations(drv_path),
    project_id  BIGINT REFERENCES projects(id),
    system      TEXT NOT NULL,
    status      TEXT NOT NULL DEFAULT 'pending'
                CHECK (status IN ('pending', 'building', 'uploading', 'succeeded', 'failed', 'cancelled', 'dep-failed')),
    priority    INT NOT NULL DEFAULT 0,
    claimed_by  TEXT,
    claimed_at  TIMESTAMPTZ,
    -- attempt counts claims and is never reset (retry_count is, by a rebuild): finish and
    -- lease-style updates are guarded by (claimed_by, attempt) so a stale worker changes nothing.
    attempt     INT NOT NULL DEFAULT 0,
    started_at  TIMESTAMPTZ,
    finished_at TIMESTAMPTZ,
    exit_code   INT,
    retry_count INT NOT NULL DEFAULT 0,
    log_url     TEXT,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (drv_path),
    CHECK (status NOT IN ('building', 'uploading') OR claimed_by IS NOT NULL)
);
CREATE INDEX build_jobs_pending_idx ON build_jobs (status, priority DESC, created_at ASC)
    WHERE status = 'pending';
CREATE INDEX build_jobs_claimed_idx ON build_jobs (claimed_by)
    WHERE status IN ('building', 'uploading');

-- Ephemeral live log tails. UNLOGGED: no WAL for ~500 updates/s; lost on a crash, which is
-- fine because the builder keeps the full log and uploads it on completion.
CREATE UNLOGGED TABLE build_log_tails (
    build_job_id BIGINT PRIMARY KEY REFERENCES build_jobs(id) ON DELETE CASCADE,
    log_tail     BYTEA,
    log_seq      INT NOT NULL DEFAULT 0
);

CREATE FUNCTION notify_build_log() RETURNS trigger AS $$
BEGIN
    IF NEW.log_seq IS DISTINCT FROM OLD.log_seq THEN
        PERFORM pg_notify('build_log', NEW.build_job_id::text);
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER build_log_notify
    AFTER UPDATE ON build_log_tails
    FOR EACH ROW EXECUTE FUNCTION notify_build_log();

-- ===== Cluster =====

-- One row per node id, a stable name such as the hostname, with its lifecycle facts. The row belongs to one
-- process at a time: incarnation is a fresh UUID per process start, and every write a node
-- makes to its own row is guarded by it.
CREATE TABLE nodes (
    id           TEXT PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$'),
    roles        TEXT[] NOT NULL,
    -- The same roles under their other name, for queries written against "capabilities".
    capabilities TEXT[] GENERATED ALWAYS AS (roles) STORED,
    endpoint     TEXT NOT NULL,
    hostname     TEXT NOT NULL DEFAULT '',
    max_evals    INT NOT NULL DEFAULT 1 CHECK (max_evals >= 1),
    systems      TEXT[] NOT NULL DEFAULT '{}',
    features     TEXT[] NOT NULL DEFAULT '{}',
    max_jobs     INT NOT NULL DEFAULT 1 CHECK (max_jobs >= 1),
    speed_factor FLOAT NOT NULL DEFAULT 1.0,
    status       TEXT NOT NULL DEFAULT 'joining'
                 CHECK (status IN ('joining', 'active', 'draining', 'dead')),
    version      TEXT NOT NULL DEFAULT '',
    incarnation  UUID NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    current_jobs INT NOT NULL DEFAULT 0,
    cpu_usage    REAL NOT NULL DEFAULT 0,
    memory_usage REAL NOT NULL DEFAULT 0,
    last_seen    TIMESTAMPTZ NOT NULL DEFAULT now(),
    draining     BOOLEAN NOT NULL DEFAULT false
);
CREATE INDEX nodes_last_seen_idx ON nodes (last_seen);

-- One row per leader role. The row is the authority: epoch is the fencing token, bumped on
-- every change of holder, and never goes backwards (the table is LOGGED and rows are never
-- deleted). The advisory lock held on the leader's dedicated connection only guards who
-- may write a new epoch.
CREATE TABLE leaders (
    role        TEXT PRIMARY KEY,
    node_id     TEXT NOT NULL,
    incarnation UUID NOT NULL,
    epoch       BIGINT NOT NULL CHECK (epoch > 0),
    acquired_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    renewed_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    lease_until TIMESTAMPTZ NOT NULL
);

-- Every run of a leader-only task, written inside the task's fenced transaction: who ran it,
-- under which epoch, and how many rows it changed. Operators see when maintenance last ran;
-- tests check that no write of an old epoch lands after a newer epoch began.
CREATE TABLE maintenance_runs (
    id       BIGINT PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
    role     TEXT NOT NULL,
    task     TEXT NOT NULL,
    node_id  TEXT NOT NULL,
    epoch    BIGINT NOT NULL,
    ran_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    affected BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX maintenance_runs_task_idx ON maintenance_runs (role, task, id DESC);
CREATE INDEX maintenance_runs_ran_at_idx ON maintenance_runs (ran_at);
