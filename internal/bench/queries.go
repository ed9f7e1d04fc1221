package bench

// The harness's SQL.
const (
	sqlServerVersion = `SELECT current_setting('server_version')`

	// sqlProjectCreate adds project $1 with scheduling share $2 on a repository of its own.
	sqlProjectCreate = `
WITH repo AS (
    INSERT INTO repositories (forge, owner, name, full_name, clone_url)
    VALUES ('bench', 'bench', $1, 'bench/' || $1, 'https://example.invalid/' || $1) RETURNING id
)
INSERT INTO projects (repo_id, name, scheduling_shares) SELECT id, $1, $2 FROM repo RETURNING id`
)
