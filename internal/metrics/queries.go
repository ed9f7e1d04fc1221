package metrics

// sqlSnapshot is the collector's one query. Every branch reads either a partial index (the live
// statuses of build_jobs and evaluations: terminal ones grow forever and are never counted) or a
// small table (nodes, projects). Rows are (kind, label a, label b, value). A project is labelled
// by its name only when it is public and enabled; a private or disabled one by "#" and its id
// (no name starts with "#"), since /metrics answers anyone.
const sqlSnapshot = `
SELECT 'jobs', status, system, count(*)::float8 FROM build_jobs
  WHERE status = 'pending' GROUP BY status, system
UNION ALL
SELECT 'jobs', status, system, count(*)::float8 FROM build_jobs
  WHERE status IN ('building', 'uploading') GROUP BY status, system
UNION ALL
SELECT 'ready', '', '', count(*)::float8 FROM build_jobs
  WHERE status = 'pending' AND ready
UNION ALL
SELECT 'oldest_ready', '', '', COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8 FROM build_jobs
  WHERE status = 'pending' AND ready
UNION ALL
SELECT 'blocked', '', '', count(*)::float8 FROM build_jobs
  WHERE status = 'pending' AND blocked_inputs > 0
UNION ALL
SELECT 'node_jobs', id, '', current_jobs::float8 FROM nodes
  WHERE status <> 'dead' AND 'builder' = ANY(roles)
UNION ALL
SELECT 'node_max_jobs', id, '', max_jobs::float8 FROM nodes
  WHERE status <> 'dead' AND 'builder' = ANY(roles)
UNION ALL
SELECT 'project', CASE WHEN p.enabled AND NOT r.is_private THEN p.name ELSE '#' || p.id END, '',
       p.consumed_seconds::float8
  FROM projects p JOIN repositories r ON r.id = p.repo_id
UNION ALL
SELECT 'evals', 'queued', '', count(*)::float8 FROM evaluations WHERE status = 'queued'
UNION ALL
SELECT 'evals', 'running', '', count(*)::float8 FROM evaluations WHERE status = 'running'
UNION ALL
SELECT 'gc_last_success', '', '', EXTRACT(EPOCH FROM max(finished_at))::float8 FROM gc_runs
  WHERE status = 'succeeded' HAVING count(*) > 0`
