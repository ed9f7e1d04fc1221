package cluster_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
)

func TestNewElectorRejectsBadConfig(t *testing.T) {
	t.Parallel()
	id := cluster.Identity{NodeID: "n", Incarnation: uuid.New()}
	newE := func(cfg cluster.ElectorConfig) error {
		_, err := cluster.NewElector(cfg, nil, nil, id, cluster.NewMetrics(prometheus.NewRegistry()), discardLogger(), clock.Real{})
		return err
	}
	if err := newE(cluster.ElectorConfig{Role: "no-such-role"}); err == nil {
		t.Fatal("NewElector accepted an unknown role")
	}
	if err := newE(cluster.ElectorConfig{Role: cluster.RoleMaintenance, LeaseDuration: 900 * time.Millisecond, RefreshInterval: 400 * time.Millisecond}); err == nil {
		t.Fatal("NewElector accepted a refresh interval above lease/3")
	}
	if err := newE(cluster.ElectorConfig{Role: cluster.RoleMaintenance}); err != nil {
		t.Fatalf("NewElector with defaults: %v", err)
	}
}

func TestElectorOneLeaderThenHandoverOnStop(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)

	// Leader work checks, as it ends, that the lease is still its own: the lease must be given
	// up only after the leader work has returned.
	var leaseHeldAtExit [2]atomic.Bool
	onLead := func(i int) func(ctx context.Context, term *cluster.Term) {
		return func(ctx context.Context, term *cluster.Term) {
			<-ctx.Done()
			qctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var valid bool
			err := pool.QueryRow(qctx, `
SELECT lease_until > now() FROM leaders WHERE role = $1 AND node_id = $2 AND incarnation = $3 AND epoch = $4`,
				term.Role, term.NodeID, term.Incarnation, term.Epoch).Scan(&valid)
			leaseHeldAtExit[i].Store(err == nil && valid)
		}
	}
	a := startTestNode(t, pool, "node-a", fastElectorConfig(), onLead(0))
	b := startTestNode(t, pool, "node-b", fastElectorConfig(), onLead(1))
	nodes := []*testNode{a, b}

	waitFor(t, 5*time.Second, func() bool { return a.IsLeader() || b.IsLeader() }, "a leader to be elected")
	li := 0
	if b.IsLeader() {
		li = 1
	}
	leader, other := nodes[li], nodes[1-li]
	if other.IsLeader() {
		t.Fatal("both electors lead")
	}

	row, ok := readLeader(t, pool, cluster.RoleMaintenance)
	if !ok || row.Epoch != 1 || row.NodeID != leader.id.NodeID || row.Incarnation != leader.id.Incarnation || !row.Valid {
		t.Fatalf("leaders row %+v (exists %v), want epoch 1 held by %s", row, ok, leader.id.NodeID)
	}
	term := leader.Term()
	if term == nil || term.Epoch != 1 || term.NodeID != leader.id.NodeID {
		t.Fatalf("leader's Term() = %+v", term)
	}
	waitFor(t, 5*time.Second, func() bool { return leader.leads.Load() == 1 }, "the leader's LeaderFunc to run")
	if isLeaderMetric(t, leader) != 1 || isLeaderMetric(t, other) != 0 {
		t.Fatalf("is_leader metrics: leader %v, other %v", isLeaderMetric(t, leader), isLeaderMetric(t, other))
	}

	// Over several check and renewal intervals the roles stay put.
	observeLeadership(t, 800*time.Millisecond, func() {
		if !leader.IsLeader() || other.IsLeader() || other.leads.Load() != 0 {
			t.Fatalf("leadership moved without cause: leader %v, other %v (other's LeaderFunc ran %d times)",
				leader.IsLeader(), other.IsLeader(), other.leads.Load())
		}
	})
	if row, _ := readLeader(t, pool, cluster.RoleMaintenance); row.Epoch != 1 || !row.Valid {
		t.Fatalf("lease not kept alive by renewals: %+v", row)
	}

	// Stop resigns: the leader work ends first, then the lease is given up for the other node.
	leader.Stop()
	if leader.IsLeader() {
		t.Fatal("stopped elector still reports leadership")
	}
	if !termEnded(term) {
		t.Fatal("stopped elector's term context is still live")
	}
	if !leaseHeldAtExit[li].Load() {
		t.Fatal("the lease was given up before the leader work returned")
	}
	if row, _ := readLeader(t, pool, cluster.RoleMaintenance); row.Epoch == 1 && (row.Valid || !row.Resigned) {
		t.Fatalf("Stop did not resign the lease: %+v", row)
	}
	if got := leader.metric(t, "harmonia_ci_leader_step_downs_total", "role", cluster.RoleMaintenance, "kind", "resign"); got != 1 {
		t.Fatalf("resign step-downs = %v, want 1", got)
	}

	start := time.Now()
	waitFor(t, 3*time.Second, func() bool { return other.IsLeader() }, "the other elector to take over after the resignation")
	t.Logf("takeover after resignation took %s", time.Since(start))
	row, _ = readLeader(t, pool, cluster.RoleMaintenance)
	if row.Epoch != 2 || row.NodeID != other.id.NodeID || row.Incarnation != other.id.Incarnation || !row.Valid {
		t.Fatalf("leaders row after handover %+v, want epoch 2 held by %s", row, other.id.NodeID)
	}
	if got := other.Term(); got == nil || got.Epoch != 2 {
		t.Fatalf("new leader's term = %+v, want epoch 2", got)
	}
	waitFor(t, 5*time.Second, func() bool { return other.leads.Load() == 1 }, "the new leader's LeaderFunc to run")
	if leader.leads.Load() != 1 {
		t.Fatalf("old leader's LeaderFunc ran %d times, want 1", leader.leads.Load())
	}
	// A resigned lease is a handover, not a failover.
	if got := other.metric(t, "harmonia_ci_leader_failovers_total", "role", cluster.RoleMaintenance); got != 0 {
		t.Fatalf("failovers after a resignation = %v, want 0", got)
	}
}

func TestElectorStepsDownWhenLockSessionIsLost(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)

	// The first leader checks less often than the standby, so the standby is the one that
	// takes over (the loser of a session sits out two of its own check intervals).
	slow := fastElectorConfig()
	slow.CheckInterval = 100 * time.Millisecond
	a := startTestNode(t, pool, "node-a", slow, nil)
	term := a.firstTerm(t, 5*time.Second)
	b := startTestNode(t, pool, "node-b", fastElectorConfig(), nil)

	pid, ok := lockSessionPID(t, pool)
	if !ok {
		t.Fatal("no lock session holds the leader lock")
	}
	if !queryBool(t, pool, `SELECT pg_terminate_backend($1)`, pid) {
		t.Fatalf("could not terminate lock session %d", pid)
	}

	waitFor(t, 5*time.Second, func() bool { return termEnded(term) }, "the old leader's term context to be cancelled")
	waitFor(t, 5*time.Second, func() bool { return !a.IsLeader() && isLeaderMetric(t, a) == 0 },
		"the old leader to step down (IsLeader false, is_leader metric 0)")
	if got := a.metric(t, "harmonia_ci_leader_step_downs_total", "role", cluster.RoleMaintenance, "kind", "lost"); got != 1 {
		t.Fatalf("lost step-downs = %v, want 1", got)
	}

	waitFor(t, 5*time.Second, func() bool { return b.IsLeader() }, "the standby to take over")
	row, _ := readLeader(t, pool, cluster.RoleMaintenance)
	if row.Epoch <= term.Epoch || row.NodeID != b.id.NodeID || !row.Valid {
		t.Fatalf("leaders row after the lock session was lost: %+v, want node-b with epoch > %d", row, term.Epoch)
	}
	if got := b.Term(); got == nil || got.Epoch != row.Epoch {
		t.Fatalf("new leader's term %+v, leaders row epoch %d", got, row.Epoch)
	}
	// The old leader never resigned: the takeover is a failover.
	if got := b.metric(t, "harmonia_ci_leader_failovers_total", "role", cluster.RoleMaintenance); got != 1 {
		t.Fatalf("failovers = %v, want 1", got)
	}
	if a.IsLeader() || isLeaderMetric(t, b) != 1 {
		t.Fatalf("after takeover: a leads %v, b's is_leader %v", a.IsLeader(), isLeaderMetric(t, b))
	}
}

// TestElectorPreemptsExpiredHolder is not parallel: preempting terminates sessions on the
// whole server, so it must not run next to other tests' leaders (see
// TestPreemptionStaysInItsOwnDatabase).
func TestElectorPreemptsExpiredHolder(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := ctxTimeout(t, 10*time.Second)

	// A wedged leader: it still holds the lock on a live session, but its lease ran out long ago.
	wedged := rawConn(t, pool)
	var got bool
	if err := wedged.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, db.LockClass, db.LockMaintenance).Scan(&got); err != nil || !got {
		t.Fatalf("take the leader lock: %v %v", got, err)
	}
	mustExec(t, pool, `
INSERT INTO leaders (role, node_id, incarnation, epoch, acquired_at, renewed_at, lease_until)
VALUES ('maintenance', 'wedged', gen_random_uuid(), 7, now() - interval '1 hour', now() - interval '70 seconds', now() - interval '10 seconds')`)

	b := startTestNode(t, pool, "node-b", fastElectorConfig(), nil)
	term := b.firstTerm(t, 5*time.Second)
	if term.Epoch != 8 {
		t.Fatalf("epoch after preempting the wedged holder = %d, want 8", term.Epoch)
	}
	row, _ := readLeader(t, pool, cluster.RoleMaintenance)
	if row.Epoch != 8 || row.NodeID != "node-b" || !row.Valid {
		t.Fatalf("leaders row %+v, want node-b at epoch 8", row)
	}
	if _, err := wedged.Exec(ctx, `SELECT 1`); err == nil {
		t.Fatal("the wedged holder's session survived the preemption")
	}
	if got := b.metric(t, "harmonia_ci_leader_failovers_total", "role", cluster.RoleMaintenance); got != 1 {
		t.Fatalf("failovers = %v, want 1", got)
	}
}

// TestElectorDoesNotPreemptHolderWithValidLease: a standby must leave a live leader alone.
func TestElectorDoesNotPreemptHolderWithValidLease(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := ctxTimeout(t, 10*time.Second)

	holder := rawConn(t, pool)
	var got bool
	if err := holder.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, db.LockClass, db.LockMaintenance).Scan(&got); err != nil || !got {
		t.Fatalf("take the leader lock: %v %v", got, err)
	}
	mustExec(t, pool, `
INSERT INTO leaders (role, node_id, incarnation, epoch, lease_until)
VALUES ('maintenance', 'alive', gen_random_uuid(), 3, now() + interval '1 minute')`)

	b := startTestNode(t, pool, "node-b", fastElectorConfig(), nil)
	waitFor(t, 5*time.Second, func() bool {
		return b.metric(t, "harmonia_ci_leader_elections_total", "role", cluster.RoleMaintenance) >= 5
	}, "five election attempts")
	if b.IsLeader() {
		t.Fatal("standby took the role from a holder with a valid lease")
	}
	if _, err := holder.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatalf("the live holder's session was ended: %v", err)
	}
	if row, _ := readLeader(t, pool, cluster.RoleMaintenance); row.Epoch != 3 || row.NodeID != "alive" {
		t.Fatalf("leaders row changed: %+v", row)
	}
}

// TestPreemptionStaysInItsOwnDatabase: advisory locks are per database, so two deployments
// sharing one PostgreSQL server (or one deployment's database next to another's) each have
// their own leader lock. Preempting a wedged holder in one database must not end the session
// of the lock's holder in another.
func TestPreemptionStaysInItsOwnDatabase(t *testing.T) {
	pool := dbtest.NewPool(t)
	neighbour := dbtest.NewPool(t)
	ctx := ctxTimeout(t, 10*time.Second)

	// The neighbouring database's healthy leader holds (LockClass, 1) in its own database.
	bystander := rawConn(t, neighbour)
	var got bool
	if err := bystander.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, db.LockClass, db.LockMaintenance).Scan(&got); err != nil || !got {
		t.Fatalf("bystander: take the leader lock: %v %v", got, err)
	}
	mustExec(t, neighbour, `
INSERT INTO leaders (role, node_id, incarnation, epoch, lease_until)
VALUES ('maintenance', 'neighbour', gen_random_uuid(), 1, now() + interval '1 minute')`)

	// Our database has a wedged holder with an expired lease.
	wedged := rawConn(t, pool)
	if err := wedged.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, db.LockClass, db.LockMaintenance).Scan(&got); err != nil || !got {
		t.Fatalf("wedged: take the leader lock: %v %v", got, err)
	}
	mustExec(t, pool, `
INSERT INTO leaders (role, node_id, incarnation, epoch, lease_until)
VALUES ('maintenance', 'wedged', gen_random_uuid(), 1, now() - interval '10 seconds')`)

	b := startTestNode(t, pool, "node-b", fastElectorConfig(), nil)
	b.firstTerm(t, 5*time.Second)
	if _, err := bystander.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatalf("preempting the wedged holder in database A ended the leader-lock session in database B: %v", err)
	}
}
