package webhookbench

// The benchmark's SQL, named for what it reads or writes.
const (
	// sqlBenchJobs reads the fixture's build jobs, oldest first.
	sqlBenchJobs = `SELECT drv_path FROM build_jobs WHERE drv_path LIKE '%-bench-%' ORDER BY id`

	// sqlEvalCount counts every evaluation.
	sqlEvalCount = `SELECT count(*) FROM evaluations`

	// sqlJobSucceed sets job $1 succeeded and sends the queue's notification $2, as the signer does.
	sqlJobSucceed = `WITH u AS (UPDATE build_jobs SET status = 'succeeded', finished_at = now() WHERE drv_path = $1)
SELECT pg_notify('build_jobs', $2)`

	// sqlPendingReportedCount counts the evaluations whose pending build status reached the forge.
	sqlPendingReportedCount = `SELECT count(*) FROM evaluations WHERE reported_status LIKE '%"build":{"state":"pending"%'`

	// sqlProjectsFromRepos inserts a project per repository, named after it.
	sqlProjectsFromRepos = `INSERT INTO projects (repo_id, name) SELECT id, name FROM repositories`

	// sqlStatusFixture inserts evaluations of the first project, each with one pending build job as its last.
	sqlStatusFixture = `
WITH p AS (SELECT id FROM projects ORDER BY id LIMIT 1),
d AS (
    INSERT INTO derivations (drv_path, hash_part, name, system, nar_hash, nar_size)
    SELECT '/nix/store/' || lpad(to_hex(g), 32, 'a') || '-bench-' || g || '.drv', lpad(to_hex(g), 32, 'a'),
           'bench-' || g, 'x86_64-linux', 'sha256:0', 0
    FROM generate_series(1, $1) g
    RETURNING drv_path
), j AS (
    INSERT INTO build_jobs (drv_path, project_id, system) SELECT drv_path, (SELECT id FROM p), 'x86_64-linux' FROM d
    RETURNING drv_path
), e AS (
    INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status, finished_at)
    SELECT (SELECT id FROM p), 'http://gitea.invalid/x.git', lpad(to_hex(g), 40, 'b'), 'status-' || g, 'succeeded', now()
    FROM generate_series(1, $1) g
    RETURNING id, branch
)
INSERT INTO eval_attrs (eval_id, attr, drv_path)
SELECT e.id, 'pkg', d.drv_path FROM e JOIN d ON d.drv_path LIKE '%-bench-' || substr(e.branch, 8) || '.drv'`
)
