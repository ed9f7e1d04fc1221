-- Garbage collection and retention.

-- The retention an evaluation's tree declares (.harmonia-ci.toml `retention`); NULL: the
-- server's [retention] default.
ALTER TABLE evaluations ADD COLUMN retention_seconds BIGINT CHECK (retention_seconds > 0);
CREATE INDEX evaluations_created_at_idx ON evaluations (created_at);
CREATE INDEX evaluations_reuses_idx ON evaluations (reuses_eval_id) WHERE reuses_eval_id IS NOT NULL;

-- The GC rechecks what was added while it swept.
CREATE INDEX derivations_created_at_idx ON derivations (created_at);
CREATE INDEX build_jobs_log_finished_idx ON build_jobs (finished_at) WHERE log_url IS NOT NULL;

-- One row per garbage collection: operators (harmonia-ci status, the GC alert) see when it last
-- succeeded and what it deleted. Written by the GC leader, fenced by its epoch.
CREATE TABLE gc_runs (
    id                  BIGINT PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
    node_id             TEXT NOT NULL,
    epoch               BIGINT NOT NULL,
    started_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at         TIMESTAMPTZ,
    status              TEXT NOT NULL DEFAULT 'running'
                        CHECK (status IN ('running', 'succeeded', 'failed')),
    error               TEXT,
    evaluations_deleted BIGINT NOT NULL DEFAULT 0,
    jobs_deleted        BIGINT NOT NULL DEFAULT 0,
    derivations_deleted BIGINT NOT NULL DEFAULT 0,
    logs_expired        BIGINT NOT NULL DEFAULT 0,
    deliveries_deleted  BIGINT NOT NULL DEFAULT 0,
    objects_scanned     BIGINT NOT NULL DEFAULT 0,
    objects_deleted     BIGINT NOT NULL DEFAULT 0,
    bytes_deleted       BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX gc_runs_started_idx ON gc_runs (started_at DESC);

-- An operator's "collect now" (harmonia-ci gc): the GC leader runs when one is newer than its
-- last run, and deletes the requests it served.
CREATE TABLE gc_requests (
    id           BIGINT PRIMARY KEY GENERATED ALWAYS AS IDENTITY,
    requested_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Deleting evaluations sets their deliveries' eval_id NULL: without an index, one scan each.
CREATE INDEX webhook_deliveries_eval_idx ON webhook_deliveries (eval_id) WHERE eval_id IS NOT NULL;
