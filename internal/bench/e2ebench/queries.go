package e2ebench

// The benchmark's SQL, named for what it reads or writes.
const (
	// sqlCacheEndpoints reads the active caches' endpoints and the signing keys, for the replay's substituters.
	sqlCacheEndpoints = `SELECT
    ARRAY(SELECT endpoint FROM nodes WHERE 'cache' = ANY(capabilities) AND status = 'active' ORDER BY id),
    ARRAY(SELECT public_key FROM signing_keys ORDER BY first_seen)`

	// sqlDeepJobs reads the projects' ($1) build jobs with their input derivations, in creation order.
	sqlDeepJobs = `SELECT bj.id, bj.project_id, bj.drv_path, bj.attempt, bj.created_at,
    coalesce(bj.started_at, bj.claimed_at), bj.finished_at,
    ARRAY(SELECT di.input_drv FROM derivation_inputs di WHERE di.referrer = bj.drv_path ORDER BY 1)
FROM build_jobs bj WHERE bj.project_id = ANY($1)
ORDER BY bj.created_at, bj.id`

	// sqlInputCount counts the input derivations of derivation $1.
	sqlInputCount = `SELECT count(*) FROM derivation_inputs WHERE referrer = $1`

	// sqlNow reads the database clock.
	sqlNow = `SELECT now()`

	// sqlProjectJobs reads the jobs of project $1 as jobRow.
	sqlProjectJobs = `SELECT id, drv_path, status, coalesce(claimed_by, ''), attempt, claimed_at, finished_at
FROM build_jobs WHERE project_id = $1 ORDER BY id`

	// sqlProjectMakespan reads seconds from project $1's first claim to its last finish (database clock).
	sqlProjectMakespan = `SELECT extract(epoch FROM max(finished_at) - min(claimed_at))::float8
FROM build_jobs WHERE project_id = $1`

	// sqlProjectPendingCount counts the pending jobs of project $1.
	sqlProjectPendingCount = `SELECT count(*) FROM build_jobs WHERE project_id = $1 AND status = 'pending'`

	// sqlProjectSucceededJobs reads the succeeded jobs of project $1.
	sqlProjectSucceededJobs = `SELECT id FROM build_jobs WHERE project_id = $1 AND status = 'succeeded'`

	// sqlUnsucceededJobs reads the jobs of projects $1 that have not succeeded.
	sqlUnsucceededJobs = `SELECT drv_path, status, coalesce(error_message, '') FROM build_jobs
WHERE project_id = ANY($1) AND status <> 'succeeded'`
)
