package session

// The sessions' SQL (table web_sessions). Expiry is the database's clock.
const (
	// A new session, valid for $5 seconds; expired sessions are deleted on the way.
	sqlSessionCreate = `
WITH expired AS (DELETE FROM web_sessions WHERE expires_at <= now())
INSERT INTO web_sessions (id, forge, user_id, login, expires_at)
VALUES ($1, $2, $3, $4, date_trunc('second', now() + make_interval(secs => $5)))
RETURNING expires_at`

	// Whether the session exists, is the cookie's user's, and has not expired.
	sqlSessionLive = `
SELECT expires_at > now() FROM web_sessions WHERE id = $1 AND forge = $2 AND user_id = $3`

	// Logout.
	sqlSessionDelete = `DELETE FROM web_sessions WHERE id = $1`
)
