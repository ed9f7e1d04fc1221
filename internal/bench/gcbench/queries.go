package gcbench

// The benchmark's SQL, named for what it reads or writes.
const (
	// queryAnalyze gathers fresh planner statistics for the filled tables.
	queryAnalyze = `ANALYZE`

	// queryDerivationsAndEvals reads derivations and evaluations: a database the benchmark may fill holds none.
	queryDerivationsAndEvals = `SELECT (SELECT count(*) FROM derivations) + (SELECT count(*) FROM evaluations)`

	// queryDerivationsDelete deletes the derivations $1.
	queryDerivationsDelete = `DELETE FROM derivations WHERE drv_path = ANY($1)`

	// queryEvalAttrsCreate inserts evaluation $1's attributes: the roots $2.
	queryEvalAttrsCreate = `
INSERT INTO eval_attrs (eval_id, attr, drv_path)
SELECT $1, 'pkg' || i, drv FROM unnest($2::text[]) WITH ORDINALITY AS a(drv, i)`

	// queryEvalCreate inserts a succeeded evaluation of project $1 at commit $2.
	queryEvalCreate = `
INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status, started_at, finished_at)
VALUES ($1, 'https://example.invalid/bench', $2, 'main', 'succeeded', now(), now()) RETURNING id`

	// queryJobsFinish finishes project $1's jobs: those of $2 failed, the rest succeeded.
	queryJobsFinish = `
UPDATE build_jobs SET status = CASE WHEN drv_path = ANY($2) THEN 'failed' ELSE 'succeeded' END,
       claimed_by = 'bench', claimed_at = now() - interval '1 day', started_at = now() - interval '1 day',
       finished_at = now() - interval '1 day', exit_code = CASE WHEN drv_path = ANY($2) THEN 1 ELSE 0 END
WHERE project_id = $1`

	// queryProjectEvalsDelete deletes the evaluations of project $1.
	queryProjectEvalsDelete = `DELETE FROM evaluations WHERE project_id = $1`

	// queryProjectJobsDelete deletes the build jobs of project $1.
	queryProjectJobsDelete = `DELETE FROM build_jobs WHERE project_id = $1`
)
