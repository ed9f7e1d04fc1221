package gcbench

// The benchmark's SQL, named for what it reads or writes.
const (
	// sqlAnalyze gathers fresh planner statistics for the filled tables.
	sqlAnalyze = `ANALYZE`

	// sqlDerivationsAndEvals reads derivations and evaluations: a database the benchmark may fill holds none.
	sqlDerivationsAndEvals = `SELECT (SELECT count(*) FROM derivations) + (SELECT count(*) FROM evaluations)`

	// sqlDerivationsDelete deletes the derivations $1.
	sqlDerivationsDelete = `DELETE FROM derivations WHERE drv_path = ANY($1)`

	// sqlEvalAttrsCreate inserts evaluation $1's attributes: the roots $2.
	sqlEvalAttrsCreate = `
INSERT INTO eval_attrs (eval_id, attr, drv_path)
SELECT $1, 'pkg' || i, drv FROM unnest($2::text[]) WITH ORDINALITY AS a(drv, i)`

	// sqlEvalCreate inserts a succeeded evaluation of project $1 at commit $2.
	sqlEvalCreate = `
INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status, started_at, finished_at)
VALUES ($1, 'https://example.invalid/bench', $2, 'main', 'succeeded', now(), now()) RETURNING id`

	// sqlJobsFinish finishes project $1's jobs: those of $2 failed, the rest succeeded.
	sqlJobsFinish = `
UPDATE build_jobs SET status = CASE WHEN drv_path = ANY($2) THEN 'failed' ELSE 'succeeded' END,
       claimed_by = 'bench', claimed_at = now() - interval '1 day', started_at = now() - interval '1 day',
       finished_at = now() - interval '1 day', exit_code = CASE WHEN drv_path = ANY($2) THEN 1 ELSE 0 END
WHERE project_id = $1`

	// sqlProjectEvalsDelete deletes the evaluations of project $1.
	sqlProjectEvalsDelete = `DELETE FROM evaluations WHERE project_id = $1`

	// sqlProjectJobsDelete deletes the build jobs of project $1.
	sqlProjectJobsDelete = `DELETE FROM build_jobs WHERE project_id = $1`
)
