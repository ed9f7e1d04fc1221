package db

// Every advisory lock harmonia-ci takes has two keys, a class and an object. The class keeps
// ours apart from other applications' locks in the same database; the object names the lock.
// They are all here, so that two locks never share a key by accident (TestLockKeysUnique).

// LockClass is the class of the cluster's named locks ("HCI1"); the Lock* objects below are
// its objects.
const LockClass int32 = 0x48434931

// RequestLockClass is the class of the per-project evaluation-request locks ("HCIR"): a
// project's requests run one at a time. The object is the project id modulo 2^31-1, computed in
// SQL; two projects sharing it only wait for each other.
const RequestLockClass int32 = 0x48434952

// The objects of LockClass.
const (
	// LockMigrate (session lock) serialises migration runs across every node sharing the
	// database.
	LockMigrate int32 = 0
	// LockMaintenance (session lock) is held by the maintenance leader.
	LockMaintenance int32 = 1
	// LockEnqueue (transaction lock) serialises enqueues, which would otherwise each miss the
	// other's job and input and ready a dependent too early; a success takes it shared.
	LockEnqueue int32 = 2
	// LockJobNeed (transaction lock) is the job-need lock: evaluations commit their attributes,
	// and unneeded jobs are cancelled or collected, under it, so no job is dropped as unneeded
	// while an evaluation commits a need for it.
	LockJobNeed int32 = 3
	// LockGC (session lock) is held by the garbage collector's leader.
	LockGC int32 = 4
	// LockPublication is the publication lock: publishers hold it shared from their first
	// look at what the cache holds to the commit that makes it live; the garbage collector's
	// sweep takes it exclusively.
	LockPublication int32 = 5
)

// LockKeys lists every fixed lock key with its name (the keys test, and anyone who reads
// pg_locks).
func LockKeys() map[string][2]int32 {
	return map[string][2]int32{
		"migrate":     {LockClass, LockMigrate},
		"maintenance": {LockClass, LockMaintenance},
		"enqueue":     {LockClass, LockEnqueue},
		"job-need":    {LockClass, LockJobNeed},
		"gc":          {LockClass, LockGC},
		"publication": {LockClass, LockPublication},
	}
}
