package publication

// The publication lock is the advisory lock ($1 db.LockClass, $2 db.LockPublication).
const (
	sqlLockShared   = `SELECT pg_advisory_lock_shared($1, $2)`
	sqlUnlockShared = `SELECT pg_advisory_unlock_shared($1, $2)`
	sqlLock         = `SELECT pg_advisory_lock($1, $2)`
	sqlUnlock       = `SELECT pg_advisory_unlock($1, $2)`
	sqlXactLock     = `SELECT pg_advisory_xact_lock($1, $2)`
)
