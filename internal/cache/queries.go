package cache

const (
	// Whether any project's repository is private: when none is, every path is public and no
	// path is looked up. (Quarantined outputs are marked in their narinfo; see
	// Visibility.MayReadQuarantined.)
	sqlAnyPrivate = `
SELECT EXISTS (SELECT 1 FROM projects p JOIN repositories r ON r.id = p.repo_id WHERE r.is_private)`

	// The projects that have the store paths of hash part $1 (a derivation's, or an output's of
	// one), each with its repository's privacy: through the build jobs queued for them and the
	// evaluations that have them as attributes; and whether the path is a released output (a
	// built row of it is not quarantined: a trusted job built it, or a trusted evaluation
	// promoted it; that never changes back). Always one row at least; a NULL id: no project's.
	// Outputs are found by the index on their hash part (migration 0021).
	sqlPathProjects = `
WITH d AS (
    SELECT drv_path FROM derivations WHERE hash_part = $1
    UNION
    SELECT drv_path FROM derivation_outputs WHERE substr(output_path, 12, 32) = $1
), rel AS (
    SELECT EXISTS (SELECT 1 FROM derivation_outputs
                   WHERE substr(output_path, 12, 32) = $1 AND nar_hash IS NOT NULL AND NOT quarantined) AS released
)
SELECT s.id, COALESCE(s.is_private, false), rel.released
FROM rel LEFT JOIN (
    SELECT p.id, r.is_private
    FROM d JOIN build_jobs j ON j.drv_path = d.drv_path
    JOIN projects p ON p.id = j.project_id JOIN repositories r ON r.id = p.repo_id
    UNION
    SELECT p.id, r.is_private
    FROM d JOIN eval_attrs a ON a.drv_path = d.drv_path
    JOIN evaluations e ON e.id = a.eval_id
    JOIN projects p ON p.id = e.project_id JOIN repositories r ON r.id = p.repo_id
) s ON true`

	// The projects of a live cache token by its hash $1; no row: no such token, or expired or
	// revoked, or a user's token whose projects the frontends have not refreshed from the
	// forge for an hour (it fails closed while the forge or the refresh is away).
	sqlCacheTokenProjects = `
SELECT project_ids FROM cache_tokens
WHERE token_hash = $1 AND revoked_at IS NULL AND expires_at > now()
  AND (user_id IS NULL OR refreshed_at > now() - interval '1 hour')`

	// $1 hash, $2 note, $3 project names, $4 expiry; inserted only when every project named
	// exists (no row otherwise).
	sqlCacheTokenInsert = `
INSERT INTO cache_tokens (token_hash, note, project_ids, expires_at)
SELECT $1, $2, s.ids, $4
FROM (SELECT array_agg(p.id ORDER BY p.id) AS ids, count(*) AS n
      FROM projects p WHERE p.name = ANY($3::text[])) s
WHERE s.n = cardinality(ARRAY(SELECT DISTINCT unnest($3::text[])))
RETURNING id`

	// Every cache token, newest first, with its projects' names and whose it is ("forge:login"
	// for a user's, "" for an admin's).
	sqlCacheTokenList = `
SELECT t.id, t.note, ARRAY(SELECT p.name FROM projects p WHERE p.id = ANY(t.project_ids) ORDER BY p.name),
       t.expires_at, t.revoked_at, t.created_at, COALESCE(t.forge || ':' || t.login, '')
FROM cache_tokens t ORDER BY t.id DESC`

	// $1 token id: revoked now, if not already.
	sqlCacheTokenRevoke = `
UPDATE cache_tokens SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL`
)
