package cluster

// All SQL of the cluster package. Every write a node makes to its own row is guarded by its
// incarnation; every leader write by (node, incarnation, epoch); times come from now().

const (
	// $1 id, $2 roles, $3 endpoint, $4 hostname, $5 max_evals, $6 systems, $7 features,
	// $8 max_jobs, $9 version, $10 incarnation. Returns the incarnation the row had before
	// (NULL for a new node) so the caller can release what that process held.
	sqlNodeRegister = `
WITH prev AS (
    SELECT incarnation FROM nodes WHERE id = $1  -- snapshot; FOR UPDATE would skip the upserted row
), up AS (
    INSERT INTO nodes (id, roles, endpoint, hostname, max_evals, systems, features, max_jobs,
                       status, version, incarnation, started_at, last_seen, draining)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'joining', $9, $10, now(), now(), false)
    ON CONFLICT (id) DO UPDATE SET
        roles = EXCLUDED.roles, endpoint = EXCLUDED.endpoint, hostname = EXCLUDED.hostname,
        max_evals = EXCLUDED.max_evals, systems = EXCLUDED.systems, features = EXCLUDED.features,
        max_jobs = EXCLUDED.max_jobs, status = 'joining', version = EXCLUDED.version,
        incarnation = EXCLUDED.incarnation, started_at = now(), last_seen = now(),
        draining = false, current_jobs = 0, cpu_usage = 0, memory_usage = 0
    RETURNING id
)
SELECT (SELECT incarnation FROM prev) FROM up`

	// A previous incarnation's leases end now: it is gone (or, with a duplicate node id, about
	// to learn it was superseded), so nobody should wait for its lease to run out.
	sqlLeasesReleaseStale = `
UPDATE leaders SET lease_until = now(), renewed_at = now()
WHERE node_id = $1 AND incarnation <> $2 AND lease_until > now()`

	// $1 id, $2 incarnation, $3 status (joining|active|draining), $4 current_jobs, $5 cpu,
	// $6 memory, $7 speed factor (0: unchanged). A dead mark is undone by the node's own beat:
	// it was only slow, and anything reaped meanwhile is guarded by attempt. Returns nothing if
	// the row is gone or another incarnation owns it.
	sqlNodeBeat = `
UPDATE nodes SET
    last_seen = now(), current_jobs = $4, cpu_usage = $5, memory_usage = $6,
    speed_factor = CASE WHEN $7::float8 > 0 THEN $7::float8 ELSE speed_factor END,
    status = CASE WHEN draining THEN 'draining' ELSE $3 END
WHERE id = $1 AND incarnation = $2
RETURNING draining`

	// Re-creates a row that maintenance deleted while this node was unreachable.
	sqlNodeRevive = `
INSERT INTO nodes (id, roles, endpoint, hostname, max_evals, systems, features, max_jobs,
                   status, version, incarnation, started_at, last_seen, draining,
                   nix_version, nix_protocol)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $11, $9, $10, now(), now(), false, $12, $13)
ON CONFLICT (id) DO NOTHING`

	sqlNodeIncarnation = `SELECT incarnation FROM nodes WHERE id = $1`

	// $1 id, $2 incarnation, $3 nix_version, $4 nix_protocol.
	sqlNodeSetNix = `
UPDATE nodes SET nix_version = $3, nix_protocol = $4 WHERE id = $1 AND incarnation = $2`

	sqlNodeSetStatus = `
UPDATE nodes SET status = CASE WHEN draining THEN 'draining' ELSE $3 END, last_seen = now()
WHERE id = $1 AND incarnation = $2`

	sqlNodeStartDraining = `
UPDATE nodes SET draining = true, status = 'draining', last_seen = now()
WHERE id = $1 AND incarnation = $2`

	sqlNodeDeregister = `DELETE FROM nodes WHERE id = $1 AND incarnation = $2`

	// Remote drain: any live node. The node itself acts on it at its next heartbeat.
	sqlNodeRequestDrain = `
UPDATE nodes SET draining = true WHERE id = $1 AND status <> 'dead' RETURNING id`

	sqlNodeExists = `SELECT status FROM nodes WHERE id = $1`

	sqlNodesMarkDead = `
UPDATE nodes SET status = 'dead'
WHERE status <> 'dead' AND last_seen < now() - make_interval(secs => $1)
RETURNING id`

	// A dead row stays while anything is still claimed in its name, so the reaper can always
	// find the claims of a node by its row.
	sqlNodesDeleteDead = `
DELETE FROM nodes n
WHERE n.status = 'dead' AND n.last_seen < now() - make_interval(secs => $1)
  AND NOT EXISTS (SELECT 1 FROM build_jobs bj
                  WHERE bj.claimed_by = n.id AND bj.status IN ('building', 'uploading'))
  AND NOT EXISTS (SELECT 1 FROM evaluations e
                  WHERE e.claimed_by = n.id AND e.status = 'running')
RETURNING id`

	sqlNodesList = `
SELECT id, status, roles, draining, last_seen, current_jobs, max_jobs, endpoint, hostname,
       version, incarnation, started_at, systems, features, cpu_usage, memory_usage,
       EXTRACT(EPOCH FROM now() - last_seen)::float8, nix_version, nix_protocol
FROM nodes ORDER BY id`

	sqlNodesCountByStatus = `SELECT status, count(*) FROM nodes GROUP BY status`

	sqlLeadersList = `
SELECT role, node_id, incarnation, epoch, acquired_at, renewed_at, lease_until, lease_until > now()
FROM leaders ORDER BY role`

	sqlTryAdvisoryLock = `SELECT pg_try_advisory_lock($1, $2)`
	sqlAdvisoryUnlock  = `SELECT pg_advisory_unlock($1, $2)`

	// Holds the lock iff pg_locks says this session has it: a cheap check that the dedicated
	// session is alive and still ours.
	sqlAdvisoryLockHeld = `
SELECT EXISTS (SELECT 1 FROM pg_locks
               WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 AND objsubid = 2
                 AND granted AND pid = pg_backend_pid())`

	// Takes the lease for a new epoch. Only called while holding the role's advisory lock,
	// which proves every earlier holder's session has ended or unlocked, so the new epoch may
	// start at once. Returns the new epoch and the previous holder, if any (prev reads the
	// statement's snapshot: no FOR UPDATE, which would skip the row the upsert changes).
	// $1 role, $2 node, $3 incarnation, $4 lease.
	sqlLeaseAcquire = `
WITH prev AS (
    SELECT node_id, incarnation, lease_until, renewed_at FROM leaders WHERE role = $1
), up AS (
    INSERT INTO leaders AS l (role, node_id, incarnation, epoch, acquired_at, renewed_at, lease_until)
    VALUES ($1, $2, $3, 1, now(), now(), now() + make_interval(secs => $4))
    ON CONFLICT (role) DO UPDATE SET
        node_id = EXCLUDED.node_id, incarnation = EXCLUDED.incarnation, epoch = l.epoch + 1,
        acquired_at = now(), renewed_at = now(), lease_until = now() + make_interval(secs => $4)
    RETURNING epoch
)
SELECT up.epoch, prev.node_id, prev.incarnation,
       -- resigned leases end with lease_until = renewed_at
       COALESCE(prev.lease_until <> prev.renewed_at, false)
FROM up LEFT JOIN prev ON true`

	// $1 role, $2 node, $3 incarnation, $4 epoch, $5 lease. Zero rows: the term is over.
	sqlLeaseRenew = `
UPDATE leaders SET lease_until = now() + make_interval(secs => $5), renewed_at = now()
WHERE role = $1 AND node_id = $2 AND incarnation = $3 AND epoch = $4 AND lease_until > now()`

	sqlLeaseResign = `
UPDATE leaders SET lease_until = now(), renewed_at = now()
WHERE role = $1 AND node_id = $2 AND incarnation = $3 AND epoch = $4`

	// Sent after the unlock, so that woken standbys find the lock free.
	sqlNotifyResigned = `SELECT pg_notify('leaders', $1)`

	// The fence: the term still holds, and its row stays locked against a new epoch until the
	// caller's transaction ends.
	sqlLeaseFence = `
SELECT 1 FROM leaders
WHERE role = $1 AND node_id = $2 AND incarnation = $3 AND epoch = $4 AND lease_until > now()
FOR SHARE`

	// Ends the session of whoever still holds a role's lock after its lease ran out (a paused
	// or wedged leader: a SIGSTOPped process keeps its TCP session, and so its lock, forever).
	// Safe: a leader whose lease expired already stopped trusting itself and is fenced anyway.
	sqlPreemptExpiredHolder = `
SELECT pg_terminate_backend(l.pid)
FROM pg_locks l
WHERE l.locktype = 'advisory' AND l.classid = $1 AND l.objid = $2 AND l.objsubid = 2
  AND l.granted AND l.pid <> pg_backend_pid()
  -- advisory locks are per database; other databases on the server are not ours
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND EXISTS (SELECT 1 FROM leaders WHERE role = $3 AND lease_until < now() - make_interval(secs => $4))`

	sqlMaintenanceRecord = `
INSERT INTO maintenance_runs (role, task, node_id, epoch, affected) VALUES ($1, $2, $3, $4, $5)`

	sqlMaintenancePrune = `DELETE FROM maintenance_runs WHERE ran_at < now() - make_interval(secs => $1)`
)

// SET LOCAL takes no parameters; set_config(…, true) is the same setting for the rest of the
// transaction and does. $1 milliseconds.
const (
	sqlSetLockTimeout = `SELECT set_config('lock_timeout', $1::bigint::text, true)`
	sqlSetIdleTimeout = `SELECT set_config('idle_in_transaction_session_timeout', $1::bigint::text, true)`
)
