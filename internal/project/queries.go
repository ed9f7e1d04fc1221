package project

import (
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	// A repository added by hand has forge 'git' and its clone URL as its full name.
	// $1 URL, $2 name, $3 default branch, $4 private.
	sqlInsertRepository = `
INSERT INTO repositories (forge, owner, name, full_name, clone_url, default_branch, is_private)
VALUES ('git', '', $2, $1, $1, $3, $4)
RETURNING id`

	// Marks repository $1 private ($2) if it was added by URL; no row for a forge's.
	sqlSetURLRepoPrivateByID = `UPDATE repositories SET is_private = $2 WHERE id = $1 AND forge = 'git'`

	// Marks project $1's repository private ($2) if it was added by URL; no row for a forge's.
	sqlSetURLRepoPrivate = `
UPDATE repositories r SET is_private = $2
FROM projects p
WHERE p.name = $1 AND r.id = p.repo_id AND r.forge = 'git'`

	// The statements that return projects list the columns in scanProject's order.
	sqlInsertProject = `
WITH p AS (
    INSERT INTO projects (repo_id, name, scheduling_shares) VALUES ($1, $2, $3)
    RETURNING *
)
SELECT p.id, p.name, r.clone_url, r.default_branch, p.scheduling_shares, p.enabled, p.created_at,
       r.id, r.forge, r.full_name, p.pr_enabled, p.pr_trust, p.poll_interval, r.is_private, p.promote_pr_outputs
FROM p JOIN repositories r ON r.id = p.repo_id`

	sqlListProjects = `
SELECT p.id, p.name, r.clone_url, r.default_branch, p.scheduling_shares, p.enabled, p.created_at,
       r.id, r.forge, r.full_name, p.pr_enabled, p.pr_trust, p.poll_interval, r.is_private, p.promote_pr_outputs
FROM projects p JOIN repositories r ON r.id = p.repo_id
ORDER BY p.name`

	// $1 name
	sqlProjectByName = `
SELECT p.id, p.name, r.clone_url, r.default_branch, p.scheduling_shares, p.enabled, p.created_at,
       r.id, r.forge, r.full_name, p.pr_enabled, p.pr_trust, p.poll_interval, r.is_private, p.promote_pr_outputs
FROM projects p JOIN repositories r ON r.id = p.repo_id
WHERE p.name = $1`

	// $1 forge, $2 full name
	sqlProjectByRepo = `
SELECT p.id, p.name, r.clone_url, r.default_branch, p.scheduling_shares, p.enabled, p.created_at,
       r.id, r.forge, r.full_name, p.pr_enabled, p.pr_trust, p.poll_interval, r.is_private, p.promote_pr_outputs
FROM projects p JOIN repositories r ON r.id = p.repo_id
WHERE r.forge = $1 AND r.full_name = $2`

	// $1 repository id
	sqlProjectByRepoID = `
SELECT p.id, p.name, r.clone_url, r.default_branch, p.scheduling_shares, p.enabled, p.created_at,
       r.id, r.forge, r.full_name, p.pr_enabled, p.pr_trust, p.poll_interval, r.is_private, p.promote_pr_outputs
FROM projects p JOIN repositories r ON r.id = p.repo_id
WHERE r.id = $1`

	// Enabled projects, not of forge git, whose poll interval has passed.
	sqlDuePolls = `
SELECT p.id, p.name, r.clone_url, r.default_branch, p.scheduling_shares, p.enabled, p.created_at,
       r.id, r.forge, r.full_name, p.pr_enabled, p.pr_trust, p.poll_interval, r.is_private, p.promote_pr_outputs
FROM projects p JOIN repositories r ON r.id = p.repo_id
WHERE p.enabled AND p.poll_interval > 0 AND r.forge <> 'git'
  AND (p.last_polled IS NULL OR p.last_polled + p.poll_interval * interval '1 second' <= now())
ORDER BY p.id`

	// $1 name, $2 shares, $3 enabled, $4 branch (NULL = unchanged)
	sqlUpdateProject = `
WITH p AS (
    UPDATE projects SET scheduling_shares = COALESCE($2, scheduling_shares),
                        enabled = COALESCE($3, enabled)
    WHERE name = $1
    RETURNING repo_id
)
UPDATE repositories r SET default_branch = COALESCE($4, r.default_branch)
FROM p WHERE r.id = p.repo_id`

	// $1 forge, $2 owner, $3 name, $4 full name, $5 clone URL, $6 private, $7 default branch,
	// $8 installation (0: none), $9 the forge's id of the repository (0: unknown, kept)
	sqlUpsertRepository = `
INSERT INTO repositories (forge, owner, name, full_name, clone_url, is_private, default_branch, installation_id, forge_id, last_synced)
VALUES ($1, $2, $3, $4, $5, $6, $7, NULLIF($8, 0), NULLIF($9, 0), now())
ON CONFLICT (forge, full_name) DO UPDATE
SET owner = EXCLUDED.owner, name = EXCLUDED.name, clone_url = EXCLUDED.clone_url,
    is_private = EXCLUDED.is_private, default_branch = EXCLUDED.default_branch,
    installation_id = EXCLUDED.installation_id,
    forge_id = COALESCE(EXCLUDED.forge_id, repositories.forge_id), last_synced = now()`

	// The statements that return repositories list the columns in scanRepository's order.
	// $1 forge ("" all), $2 substring of the name ("" all)
	sqlListRepositories = `
SELECT r.id, r.forge, r.full_name, r.clone_url, r.default_branch, r.is_private,
       COALESCE(r.installation_id, 0), COALESCE(r.hook_id, ''), COALESCE(r.last_synced, 'epoch'::timestamptz),
       COALESCE(p.name, ''), COALESCE(p.enabled, false), COALESCE(r.forge_id, 0)
FROM repositories r LEFT JOIN projects p ON p.repo_id = r.id
WHERE ($1 = '' OR r.forge = $1) AND ($2 = '' OR strpos(lower(r.full_name), lower($2)) > 0)
ORDER BY r.forge, r.full_name`

	sqlRepositoryByID = `
SELECT r.id, r.forge, r.full_name, r.clone_url, r.default_branch, r.is_private,
       COALESCE(r.installation_id, 0), COALESCE(r.hook_id, ''), COALESCE(r.last_synced, 'epoch'::timestamptz),
       COALESCE(p.name, ''), COALESCE(p.enabled, false), COALESCE(r.forge_id, 0)
FROM repositories r LEFT JOIN projects p ON p.repo_id = r.id
WHERE r.id = $1`

	// $1 repository, $2 hook id ('' none), $3 the base URL it was registered for
	sqlSetHook   = `UPDATE repositories SET hook_id = NULLIF($2, ''), hook_url = $3 WHERE id = $1`
	sqlClearHook = `UPDATE repositories SET hook_id = NULL, hook_url = NULL WHERE id = $1 AND hook_id = $2`

	// Enabled projects of forges $1 whose hook was registered before hooks had a secret each,
	// or ($3) for another base URL than $2/webhook/{forge}.
	sqlStaleHooks = `
SELECT r.id, r.forge, r.full_name, r.clone_url, r.default_branch, r.is_private,
       COALESCE(r.installation_id, 0), COALESCE(r.hook_id, ''), COALESCE(r.last_synced, 'epoch'::timestamptz),
       COALESCE(p.name, ''), COALESCE(p.enabled, false), COALESCE(r.forge_id, 0)
FROM repositories r JOIN projects p ON p.repo_id = r.id
WHERE p.enabled AND r.forge = ANY($1) AND r.forge_id IS NOT NULL
  AND (r.hook_url IS NULL OR ($3 AND r.hook_url <> $2 || '/webhook/' || r.forge))
ORDER BY r.id`

	// $1 repository, $2 name of a new project
	sqlEnableProject = `
INSERT INTO projects (repo_id, name, enabled) VALUES ($1, $2, true)
ON CONFLICT (repo_id) DO UPDATE SET enabled = true`

	sqlDisableProject = `UPDATE projects SET enabled = false WHERE repo_id = $1`

	// $1 repository, $2 shares, $3 pr_enabled, $4 pr_trust, $5 poll_interval seconds (NULL: unchanged)
	sqlProjectSettings = `
UPDATE projects SET scheduling_shares = COALESCE($2, scheduling_shares),
                    pr_enabled = COALESCE($3, pr_enabled),
                    pr_trust = COALESCE($4, pr_trust),
                    poll_interval = COALESCE($5, poll_interval),
                    promote_pr_outputs = COALESCE($6, promote_pr_outputs)
WHERE repo_id = $1`

	sqlNameTaken = `SELECT EXISTS (SELECT 1 FROM projects WHERE name = $1)`

	sqlMarkPolled = `UPDATE projects SET last_polled = now() WHERE id = ANY($1)`
)

// scanProject reads a row of the statements that return projects, in their column order.
func scanProject(row pgx.CollectableRow) (Project, error) {
	var p Project
	var poll int
	err := row.Scan(&p.ID, &p.Name, &p.RepoURL, &p.Branch, &p.Shares, &p.Enabled, &p.CreatedAt,
		&p.RepoID, &p.Forge, &p.FullName, &p.PREnabled, &p.PRTrust, &poll, &p.Private, &p.PromotePROutputs)
	p.PollInterval = time.Duration(poll) * time.Second
	return p, err
}

// scanRepository reads a row of the statements that return repositories, in their column order.
func scanRepository(row pgx.CollectableRow) (Repository, error) {
	var r Repository
	err := row.Scan(&r.ID, &r.Forge, &r.FullName, &r.CloneURL, &r.DefaultBranch, &r.Private,
		&r.InstallationID, &r.HookID, &r.LastSynced, &r.Project, &r.Enabled, &r.ForgeID)
	return r, err
}
