package overview

// The overview's queries, run in one read-only REPEATABLE READ transaction so that every number
// on the screen is of the same moment. Nodes and leaders come from the cluster package's queries.
const (
	// sqlQueue counts the live jobs by system and status. Each branch reads one partial index
	// (pending; building and uploading): terminal jobs grow forever and are never scanned.
	sqlQueue = `
SELECT system, status, count(*) FROM build_jobs WHERE status = 'pending' GROUP BY system, status
UNION ALL
SELECT system, status, count(*) FROM build_jobs WHERE status IN ('building', 'uploading') GROUP BY system, status
ORDER BY 1, 2`

	// sqlReadiness splits the pending jobs into ready (every input succeeded)
	// and blocked, with the age of the oldest ready one (NULL when none is ready), and reads the
	// database's clock, which every other age on the screen is measured against.
	sqlReadiness = `
SELECT count(*) FILTER (WHERE ready),
       count(*) FILTER (WHERE blocked_inputs > 0),
       EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE ready))::float8,
       now()
FROM build_jobs WHERE status = 'pending'`

	// sqlEvaluations counts the evaluations waiting for an evaluator and those being evaluated.
	sqlEvaluations = `
SELECT count(*) FILTER (WHERE status = 'queued'), count(*) FILTER (WHERE status = 'running')
FROM evaluations WHERE status IN ('queued', 'running')`

	// sqlLastGC reads the newest garbage collection, whatever its outcome, and when the newest
	// successful one finished; no row when none ever ran. gc_runs has one row per run (daily by
	// default): it stays small.
	sqlLastGC = `
SELECT g.id, g.node_id, g.status, g.started_at, g.finished_at, COALESCE(g.error, ''),
       g.evaluations_deleted, g.jobs_deleted, g.derivations_deleted, g.logs_expired,
       g.deliveries_deleted, g.objects_scanned, g.objects_deleted, g.bytes_deleted,
       (SELECT max(finished_at) FROM gc_runs WHERE status = 'succeeded')
FROM gc_runs g ORDER BY g.started_at DESC, g.id DESC LIMIT 1`
)
