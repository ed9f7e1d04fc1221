package e2ebench

// The benchmark's SQL, named for what it reads or writes.
const (
	// queryCacheEndpoints reads the active caches' endpoints and the signing keys, for the replay's substituters.
	queryCacheEndpoints = `SELECT
    ARRAY(SELECT endpoint FROM nodes WHERE 'cache' = ANY(capabilities) AND status = 'active' ORDER BY id),
    ARRAY(SELECT public_key FROM signing_keys ORDER BY first_seen)`

	// queryDeepJobs reads the projects' ($1) build jobs with their input derivations, in creation order.
	queryDeepJobs = `SELECT bj.id, bj.project_id, bj.drv_path, bj.attempt, bj.created_at,
    coalesce(bj.started_at, bj.claimed_at), bj.finished_at,
    ARRAY(SELECT di.input_drv FROM derivation_inputs di WHERE di.referrer = bj.drv_path ORDER BY 1)
FROM build_jobs bj WHERE bj.project_id = ANY($1)
ORDER BY bj.created_at, bj.id`

	// queryInputCount counts the input derivations of derivation $1.
	queryInputCount = `SELECT count(*) FROM derivation_inputs WHERE referrer = $1`

	// queryNow reads the database clock.
	queryNow = `SELECT now()`

	// queryProjectJobs reads the jobs of project $1 as jobRow.
	queryProjectJobs = `SELECT id, drv_path, status, coalesce(claimed_by, ''), attempt, claimed_at, finished_at
FROM build_jobs WHERE project_id = $1 ORDER BY id`

	// queryProjectMakespan reads seconds from project $1's first claim to its last finish (database clock).
	queryProjectMakespan = `SELECT extract(epoch FROM max(finished_at) - min(claimed_at))::float8
FROM build_jobs WHERE project_id = $1`

	// queryProjectPendingCount counts the pending jobs of project $1.
	queryProjectPendingCount = `SELECT count(*) FROM build_jobs WHERE project_id = $1 AND status = 'pending'`

	// queryProjectSucceededJobs reads the succeeded jobs of project $1.
	queryProjectSucceededJobs = `SELECT id FROM build_jobs WHERE project_id = $1 AND status = 'succeeded'`

	// queryUnsucceededJobs reads the jobs of projects $1 that have not succeeded.
	queryUnsucceededJobs = `SELECT drv_path, status, coalesce(error_message, '') FROM build_jobs
WHERE project_id = ANY($1) AND status <> 'succeeded'`
)
