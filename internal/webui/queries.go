package webui

// The web UI's SQL. Each page's statements are a block of their own; lists are paged by keyset
// (WHERE id < $before ORDER BY id DESC LIMIT n), never OFFSET.

// Dashboard.
const (
	// Every project with its latest evaluation and that evaluation's attribute jobs by status
	// (an attribute without a job had its outputs cached: it counts as succeeded).
	sqlDashboardProjects = `
SELECT p.id, p.name, r.forge, r.full_name, r.clone_url, p.enabled,
       e.id, e.commit_sha, e.branch, e.status, e.created_at,
       COALESCE(c.total, 0), COALESCE(c.succeeded, 0), COALESCE(c.failed, 0),
       COALESCE(c.running, 0), COALESCE(c.pending, 0)
FROM projects p
JOIN repositories r ON r.id = p.repo_id
LEFT JOIN LATERAL (
    SELECT id, commit_sha, branch, status, created_at FROM evaluations
    WHERE project_id = p.id ORDER BY id DESC LIMIT 1
) e ON true
LEFT JOIN LATERAL (
    SELECT count(*)::int AS total,
           count(*) FILTER (WHERE j.id IS NULL OR j.status = 'succeeded')::int AS succeeded,
           count(*) FILTER (WHERE j.status IN ('failed', 'dep-failed'))::int AS failed,
           count(*) FILTER (WHERE j.status IN ('building', 'uploading'))::int AS running,
           count(*) FILTER (WHERE j.status = 'pending')::int AS pending
    FROM (SELECT DISTINCT drv_path FROM eval_attrs WHERE eval_id = e.id AND drv_path IS NOT NULL) a
    LEFT JOIN build_jobs j ON j.drv_path = a.drv_path
) c ON e.id IS NOT NULL
ORDER BY p.name`

	// The global bar: jobs waiting and running, nodes online.
	sqlQueueBar = `
SELECT count(*) FILTER (WHERE status = 'pending')::int,
       count(*) FILTER (WHERE status = 'building')::int,
       count(*) FILTER (WHERE status = 'uploading')::int,
       (SELECT count(*)::int FROM nodes WHERE status IN ('active', 'draining'))
FROM build_jobs WHERE status IN ('pending', 'building', 'uploading')`
)
