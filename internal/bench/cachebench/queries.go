package cachebench

// The benchmark's SQL.
const (
	// sqlPrivateProject adds project $1 on a private repository of its own.
	sqlPrivateProject = `
WITH repo AS (
    INSERT INTO repositories (forge, owner, name, full_name, clone_url, is_private)
    VALUES ('bench', 'bench', $1, 'bench/' || $1, 'https://example.invalid/' || $1, true) RETURNING id
)
INSERT INTO projects (repo_id, name) SELECT id, $1 FROM repo`
)
