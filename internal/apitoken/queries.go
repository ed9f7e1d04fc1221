package apitoken

const (
	// A live token by its hash $1: id, name, forge, user id, login (NULL for a machine token),
	// admin, the repositories ("forge/full name") of a machine token's projects, and when it
	// was last used.
	sqlLookup = `
SELECT t.id, t.name, COALESCE(t.forge, ''), COALESCE(t.user_id, 0), COALESCE(t.login, ''), t.admin,
       ARRAY(SELECT r.forge || '/' || r.full_name FROM projects p JOIN repositories r ON r.id = p.repo_id
             WHERE p.id = ANY(t.project_ids) ORDER BY 1),
       t.last_used_at
FROM api_tokens t
WHERE t.token_hash = $1 AND t.revoked_at IS NULL AND t.expires_at > now()`

	// Token $1 used now; written at most once a minute per token.
	sqlTouch = `
UPDATE api_tokens SET last_used_at = now()
WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute')`

	// A user's token: $1 hash, $2 name, $3 days valid, $4 forge, $5 user id, $6 login; no row
	// when the user has $7 live tokens already.
	sqlInsertUser = `
INSERT INTO api_tokens (token_hash, name, expires_at, forge, user_id, login)
SELECT $1, $2, now() + make_interval(days => $3), $4, $5, $6
WHERE (SELECT count(*) FROM api_tokens
       WHERE forge = $4 AND user_id = $5 AND revoked_at IS NULL AND expires_at > now()) < $7
RETURNING id, expires_at`

	// A machine token: $1 hash, $2 name, $3 expiry, $4 admin, $5 project names; inserted only
	// when every project named exists (no row otherwise).
	sqlInsertMachine = `
INSERT INTO api_tokens (token_hash, name, expires_at, admin, project_ids)
SELECT $1, $2, $3, $4, COALESCE(s.ids, '{}')
FROM (SELECT array_agg(p.id ORDER BY p.id) AS ids, count(*) AS n
      FROM projects p WHERE p.name = ANY($5::text[])) s
WHERE s.n = cardinality(ARRAY(SELECT DISTINCT unnest($5::text[])))
RETURNING id`

	// Tokens, newest first, at most $3: user $2 of forge $1's, or with $1 = '' everyone's
	// (machine tokens included). Owner: "forge:login", "" for a machine token.
	sqlList = `
SELECT t.id, t.name, COALESCE(t.forge || ':' || t.login, ''), t.admin,
       ARRAY(SELECT p.name FROM projects p WHERE p.id = ANY(t.project_ids) ORDER BY p.name),
       t.expires_at, t.revoked_at, t.last_used_at, t.created_at,
       t.revoked_at IS NULL AND t.expires_at > now()
FROM api_tokens t
WHERE $1 = '' OR (t.forge = $1 AND t.user_id = $2)
ORDER BY t.id DESC
LIMIT $3`

	// Revoke token $1 now, if it is live and user $3 of forge $2's (with $2 = '': anyone's).
	sqlRevoke = `
UPDATE api_tokens SET revoked_at = now()
WHERE id = $1 AND revoked_at IS NULL AND ($2 = '' OR (forge = $2 AND user_id = $3))`
)
