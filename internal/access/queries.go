package access

// A project's repository, in mayReadRow's order (private, forge, full name, installation).
const (
	// $1 project name.
	sqlProjectRepo = `
SELECT r.is_private, r.forge, r.full_name, COALESCE(r.installation_id, 0)
FROM projects p JOIN repositories r ON r.id = p.repo_id
WHERE p.name = $1`

	// $1 project id.
	sqlProjectIDRepo = `
SELECT r.is_private, r.forge, r.full_name, COALESCE(r.installation_id, 0)
FROM projects p JOIN repositories r ON r.id = p.repo_id
WHERE p.id = $1`

	// $1 evaluation id.
	sqlEvalRepo = `
SELECT r.is_private, r.forge, r.full_name, COALESCE(r.installation_id, 0)
FROM evaluations e JOIN projects p ON p.id = e.project_id JOIN repositories r ON r.id = p.repo_id
WHERE e.id = $1`

	// The repositories build job $1 belongs to: the project it was queued for and the
	// evaluations that have its derivation as an attribute; one row with a NULL forge says the
	// job exists. No row: no such job.
	sqlJobRepos = `
WITH j AS (SELECT id, drv_path, project_id FROM build_jobs WHERE id = $1)
SELECT r.forge, r.full_name, COALESCE(r.installation_id, 0), r.is_private
FROM j JOIN projects p ON p.id = j.project_id JOIN repositories r ON r.id = p.repo_id
UNION
SELECT r.forge, r.full_name, COALESCE(r.installation_id, 0), r.is_private
FROM j
JOIN eval_attrs a ON a.drv_path = j.drv_path
JOIN evaluations e ON e.id = a.eval_id
JOIN projects p ON p.id = e.project_id
JOIN repositories r ON r.id = p.repo_id
UNION
SELECT NULL, '', 0, false FROM j`
)
