package gc

const (
	// The job-need lock ($1 db.LockClass, $2 db.LockJobNeed): evaluations commit their
	// attributes and cancel unneeded jobs under it, so no job is deleted as unneeded while an
	// evaluation commits a need.
	sqlNeedLock = `SELECT pg_advisory_xact_lock($1, $2)`

	sqlNow = `SELECT now()`
)

// The database step, in order, in one transaction. $1 is a number of seconds throughout.
const (
	// Evaluations past their retention (their own, else $1), by creation time so that skipped
	// and never-claimed ones go too. Kept: running ones, the newest finished evaluation of each
	// project's default branch (a quiet project keeps its last build), and any evaluation a
	// kept one reuses the results of. Attributes cascade.
	sqlDeleteEvaluations = `
WITH newest AS (
    SELECT DISTINCT ON (e.project_id) e.id
    FROM evaluations e
    JOIN projects p ON p.id = e.project_id
    JOIN repositories r ON r.id = p.repo_id
    WHERE e.branch = r.default_branch AND e.status IN ('succeeded', 'failed', 'skipped')
    ORDER BY e.project_id, e.id DESC
), expired AS (
    SELECT e.id FROM evaluations e
    WHERE e.created_at < now() - CASE WHEN e.retention_seconds IS NULL THEN $1
                                    ELSE LEAST(e.retention_seconds, COALESCE($2, e.retention_seconds)) END * interval '1 second'
      AND e.status <> 'running'
      AND e.id NOT IN (SELECT id FROM newest)
)
DELETE FROM evaluations e USING expired x
WHERE e.id = x.id
  AND NOT EXISTS (SELECT 1 FROM evaluations k
                  WHERE k.reuses_eval_id = e.id AND k.id NOT IN (SELECT id FROM expired))`

	sqlCreateLive = `CREATE TEMP TABLE gc_live (drv_path TEXT PRIMARY KEY) ON COMMIT DROP`

	// The live derivations: the closures of the remaining evaluations' attributes, of jobs in
	// flight, and of whatever was created within the grace period $1 (work that is being
	// enqueued, by any path).
	sqlFillLive = `
INSERT INTO gc_live
WITH RECURSIVE live(drv_path) AS (
    SELECT drv_path FROM (
        SELECT a.drv_path FROM eval_attrs a WHERE a.drv_path IS NOT NULL
        UNION
        SELECT j.drv_path FROM build_jobs j
        WHERE j.status IN ('building', 'uploading') OR j.created_at >= now() - $1 * interval '1 second'
        UNION
        SELECT d.drv_path FROM derivations d WHERE d.created_at >= now() - $1 * interval '1 second'
    ) roots
    UNION
    SELECT di.input_drv FROM live l JOIN derivation_inputs di ON di.referrer = l.drv_path
)
SELECT drv_path FROM live`

	sqlAnalyzeLive = `ANALYZE gc_live`

	// Jobs nothing live needs, never one that is building or uploading.
	sqlDeleteJobs = `
DELETE FROM build_jobs j
WHERE j.status NOT IN ('building', 'uploading')
  AND NOT EXISTS (SELECT 1 FROM gc_live l WHERE l.drv_path = j.drv_path)`

	// Derivations nothing live needs and no job builds (outputs and inputs cascade).
	sqlDeleteDerivations = `
DELETE FROM derivations d
WHERE NOT EXISTS (SELECT 1 FROM gc_live l WHERE l.drv_path = d.drv_path)
  AND NOT EXISTS (SELECT 1 FROM build_jobs j WHERE j.drv_path = d.drv_path)`

	// Logs past log retention go even when their build is kept; the sweep deletes the objects.
	sqlExpireLogs = `
UPDATE build_jobs SET log_url = NULL
WHERE log_url IS NOT NULL AND finished_at < now() - $1 * interval '1 second'`

	// Each attempt's own log expires with the log retention too, counted with the jobs' logs.
	sqlExpireAttemptLogs = `
UPDATE build_attempts SET log_key = NULL
WHERE log_key IS NOT NULL AND finished_at < now() - $1 * interval '1 second'`

	// Webhook deliveries are remembered only to make forge retries no-ops; forges retry for
	// hours, not for the log retention.
	sqlDeleteDeliveries = `DELETE FROM webhook_deliveries WHERE received_at < now() - $1 * interval '1 second'`
)

// The mark step.
const (
	// The hash parts of every store path the database keeps: derivations, their outputs and
	// their sources.
	sqlLivePaths = `
SELECT substring(drv_path FROM 12 FOR 32) FROM derivations
UNION ALL
SELECT substring(output_path FROM 12 FOR 32) FROM derivation_outputs WHERE output_path IS NOT NULL
UNION ALL
SELECT substring(src FROM 12 FOR 32) FROM derivations, unnest(input_srcs) AS src`

	// The same, for what was created at or after $1 (the recheck before deleting).
	sqlNewPaths = `
SELECT substring(d.drv_path FROM 12 FOR 32) FROM derivations d WHERE d.created_at >= $1
UNION ALL
SELECT substring(o.output_path FROM 12 FOR 32)
FROM derivations d JOIN derivation_outputs o ON o.drv_path = d.drv_path
WHERE d.created_at >= $1 AND o.output_path IS NOT NULL
UNION ALL
SELECT substring(src FROM 12 FOR 32) FROM derivations d, unnest(d.input_srcs) AS src
WHERE d.created_at >= $1`

	// Which of the outputs $1 (hash parts; live, without a narinfo when marked) the signer has
	// published since: it records their NAR hash after writing the narinfo, under the
	// publication lock. Asking the database spares a narinfo read per pending build.
	sqlPublishedOf = `
SELECT substring(output_path FROM 12 FOR 32) FROM derivation_outputs
WHERE nar_hash IS NOT NULL AND substring(output_path FROM 12 FOR 32) = ANY($1)`

	// The basenames of the derivations whose log is live: unfinished jobs and those finished
	// within log retention $1.
	sqlLiveLogs = `
SELECT substring(drv_path FROM 12) FROM build_jobs
WHERE finished_at IS NULL OR finished_at >= now() - $1 * interval '1 second'
UNION ALL
SELECT substring(drv_path FROM 12) || '.' || attempt FROM build_jobs
WHERE status IN ('building', 'uploading')
UNION ALL
SELECT substring(log_key FROM 5) FROM build_attempts
WHERE log_key IS NOT NULL AND finished_at >= now() - $1 * interval '1 second'`

	// Which of the logs $1 (basenames: <drv> for the latest, <drv>.<attempt> for an attempt's)
	// are live now (the recheck): a job's latest log, the log of an attempt that is running,
	// or of one that ended within the retention.
	sqlLiveLogsOf = `
SELECT substring(drv_path FROM 12) FROM build_jobs
WHERE drv_path = ANY(ARRAY(SELECT '/nix/store/' || b FROM unnest($1::text[]) AS t(b)))
  AND (finished_at IS NULL OR finished_at >= now() - $2 * interval '1 second')
UNION ALL
SELECT substring(drv_path FROM 12) || '.' || attempt FROM build_jobs
WHERE status IN ('building', 'uploading')
  AND substring(drv_path FROM 12) || '.' || attempt = ANY($1)
UNION ALL
SELECT substring(log_key FROM 5) FROM build_attempts
WHERE log_key = ANY(ARRAY(SELECT 'log/' || b FROM unnest($1::text[]) AS t(b)))
  AND finished_at >= now() - $2 * interval '1 second'`
)

// The record of runs and requests.
const (
	sqlStartRun = `
INSERT INTO gc_runs (node_id, epoch, evaluations_deleted, jobs_deleted, derivations_deleted,
                     logs_expired, deliveries_deleted)
VALUES ($1, $2, $3, $4, $5, $6, $7)
RETURNING id, started_at`

	sqlFinishRun = `
UPDATE gc_runs SET finished_at = now(), status = $2, error = $3, objects_scanned = $4,
       objects_deleted = $5, bytes_deleted = $6
WHERE id = $1`

	sqlInterrupted = `
UPDATE gc_runs SET status = 'failed', finished_at = now(), error = 'interrupted: the GC leader stopped or lost its term'
WHERE status = 'running'`

	// Requests the run about to start serves: those made before it started (the started_at it
	// records), which is what harmonia-ci gc waits for.
	sqlTakeRequests = `DELETE FROM gc_requests WHERE requested_at <= now()`

	// Whether a run is due: none succeeded within $1 seconds, or an operator asked since the
	// last run started.
	sqlDue = `
SELECT NOT EXISTS (SELECT 1 FROM gc_runs
                   WHERE status = 'succeeded' AND started_at >= now() - $1 * interval '1 second')
    OR EXISTS (SELECT 1 FROM gc_requests r
               WHERE r.requested_at >= COALESCE((SELECT max(started_at) FROM gc_runs), '-infinity'))`

	// An operator's request: the GC leader wakes on the notification.
	sqlRequest     = `INSERT INTO gc_requests DEFAULT VALUES RETURNING requested_at`
	sqlNotifyWake  = `SELECT pg_notify('gc_request', '')`
	sqlRunSince    = `SELECT id, status, COALESCE(error, ''), evaluations_deleted, jobs_deleted, derivations_deleted, logs_expired, deliveries_deleted, objects_scanned, objects_deleted, bytes_deleted FROM gc_runs WHERE started_at >= $1 ORDER BY id LIMIT 1`
	sqlLeaderValid = `SELECT node_id FROM leaders WHERE role = $1 AND lease_until > now()`
)
