package publication

// The publication lock is the advisory lock (cluster.LockClass, lockObj); the statements spell
// the object id out.
const (
	lockObj         = 5
	sqlLockShared   = `SELECT pg_advisory_lock_shared($1, 5)`
	sqlUnlockShared = `SELECT pg_advisory_unlock_shared($1, 5)`
	sqlLock         = `SELECT pg_advisory_lock($1, 5)`
	sqlUnlock       = `SELECT pg_advisory_unlock($1, 5)`
	sqlXactLock     = `SELECT pg_advisory_xact_lock($1, 5)`
)
