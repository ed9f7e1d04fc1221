package apiv1

// The API's SQL. Lists are paged by keyset, never OFFSET.

const (
	// Every project with its repository and its latest evaluation (0: none), by name.
	sqlProjects = `
SELECT p.id, p.name, p.enabled, r.forge, r.full_name, r.clone_url, r.is_private,
       COALESCE(r.installation_id, 0), r.default_branch, COALESCE(e.id, 0), COALESCE(e.status, '')
FROM projects p
JOIN repositories r ON r.id = p.repo_id
LEFT JOIN LATERAL (
    SELECT id, status FROM evaluations WHERE project_id = p.id ORDER BY id DESC LIMIT 1
) e ON true
ORDER BY p.name`

	// A project by name, in sqlProjects' columns. $1 name.
	sqlProject = `
SELECT p.id, p.name, p.enabled, r.forge, r.full_name, r.clone_url, r.is_private,
       COALESCE(r.installation_id, 0), r.default_branch, COALESCE(e.id, 0), COALESCE(e.status, '')
FROM projects p
JOIN repositories r ON r.id = p.repo_id
LEFT JOIN LATERAL (
    SELECT id, status FROM evaluations WHERE project_id = p.id ORDER BY id DESC LIMIT 1
) e ON true
WHERE p.name = $1`

	// The latest evaluation of each branch (pull requests apart), the default branch first,
	// then the most recently evaluated. $1 project id, $2 default branch, $3 limit.
	sqlBranches = `
SELECT id FROM (
    SELECT DISTINCT ON (branch) id, branch FROM evaluations
    WHERE project_id = $1 AND pr_number IS NULL
    ORDER BY branch, id DESC
) b
ORDER BY branch = $2 DESC, id DESC
LIMIT $3`

	// The latest evaluation of each pull request, the most recently evaluated first.
	// $1 project id, $2 limit.
	sqlPulls = `
SELECT id FROM (
    SELECT DISTINCT ON (pr_number) id FROM evaluations
    WHERE project_id = $1 AND pr_number IS NOT NULL
    ORDER BY pr_number, id DESC
) p
ORDER BY id DESC
LIMIT $2`

	// A page of an evaluation's attributes by name, after $2 (NULL: from the first), with
	// their build and, for a dep-failed one, the nearest failed or cancelled build below it.
	// $1 evaluation id, $3 only failed ones, $4 limit. The status is the build's, or
	// "cached" (no build needed), "eval-error" or "detached" (its build no longer wanted).
	sqlAttrs = `
SELECT ea.attr, COALESCE(ea.drv_path, ''), COALESCE(ea.error, ''), COALESCE(j.id, 0),
       CASE WHEN ea.drv_path IS NULL THEN 'eval-error' WHEN ea.detached_at IS NOT NULL THEN 'detached'
            WHEN j.id IS NULL THEN 'cached' ELSE j.status END,
       COALESCE(j.claimed_by, ''), j.started_at, j.finished_at, COALESCE(j.error_message, ''), j.exit_code,
       COALESCE(cause.id, 0)
FROM eval_attrs ea
LEFT JOIN build_jobs j ON j.drv_path = ea.drv_path
LEFT JOIN LATERAL (
    WITH RECURSIVE down (id, drv_path, status, depth) AS (
        SELECT i.id, i.drv_path, i.status, 1
        FROM derivation_inputs di
        JOIN build_jobs i ON i.drv_path = di.input_drv
        WHERE j.status = 'dep-failed' AND di.referrer = j.drv_path
          AND i.status IN ('failed', 'cancelled', 'dep-failed')
      UNION
        SELECT i.id, i.drv_path, i.status, d.depth + 1
        FROM down d
        JOIN derivation_inputs di ON di.referrer = d.drv_path
        JOIN build_jobs i ON i.drv_path = di.input_drv
        WHERE d.status = 'dep-failed' AND i.status IN ('failed', 'cancelled', 'dep-failed')
    )
    SELECT down.id FROM down
    WHERE down.status IN ('failed', 'cancelled')
    ORDER BY down.depth, down.status <> 'failed', down.id
    LIMIT 1
) cause ON true
WHERE ea.eval_id = $1
  AND ($2::text IS NULL OR ea.attr > $2)
  AND (NOT $3 OR ea.drv_path IS NULL OR (ea.detached_at IS NULL AND j.status IN ('failed', 'dep-failed')))
ORDER BY ea.attr
LIMIT $4`

	// A build's derivation name. $1 job id.
	sqlJobName = `
SELECT COALESCE(d.name, '') FROM build_jobs j LEFT JOIN derivations d ON d.drv_path = j.drv_path
WHERE j.id = $1`

	// A build's status, archived log key and live tail (NULL: none). $1 job id.
	sqlLogState = `
SELECT j.status, COALESCE(j.log_url, ''), t.log_tail
FROM build_jobs j
LEFT JOIN build_log_tails t ON t.build_job_id = j.id
WHERE j.id = $1`

	// Unfinished jobs: how many are ready, waiting for their inputs, building or uploading.
	sqlQueueCounts = `
SELECT count(*) FILTER (WHERE status = 'pending' AND ready)::int,
       count(*) FILTER (WHERE status = 'pending' AND NOT ready)::int,
       count(*) FILTER (WHERE status = 'building')::int,
       count(*) FILTER (WHERE status = 'uploading')::int
FROM build_jobs WHERE status IN ('pending', 'building', 'uploading')`

	// A page of unfinished jobs, oldest first, after job $1 (0: from the first), with their
	// project's repository for the visibility rule. $2 limit.
	sqlQueueJobs = `
SELECT j.id, COALESCE(d.name, ''), j.system, j.status, j.ready, j.priority, COALESCE(j.claimed_by, ''),
       j.created_at, j.started_at, COALESCE(p.name, ''),
       COALESCE(r.is_private, false), COALESCE(r.forge, ''), COALESCE(r.full_name, ''), COALESCE(r.installation_id, 0)
FROM build_jobs j
LEFT JOIN derivations d ON d.drv_path = j.drv_path
LEFT JOIN projects p ON p.id = j.project_id
LEFT JOIN repositories r ON r.id = p.repo_id
WHERE j.status IN ('pending', 'building', 'uploading') AND j.id > $1
ORDER BY j.id
LIMIT $2`

	// The recorded actions on build job $1, newest first, at most $2.
	sqlJobActions = `
SELECT action, actor, token_id, token_name, message, at FROM action_log
WHERE job_id = $1 ORDER BY id DESC LIMIT $2`
)
