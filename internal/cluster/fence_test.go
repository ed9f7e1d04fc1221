package cluster_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
)

// insertRun is a leader-only write: one maintenance_runs row tagged with task.
func insertRun(term *cluster.Term, task string) func(tx pgx.Tx) error {
	return func(tx pgx.Tx) error {
		_, err := tx.Exec(context.Background(), `
INSERT INTO maintenance_runs (role, task, node_id, epoch) VALUES ($1, $2, $3, $4)`,
			term.Role, task, term.NodeID, term.Epoch)
		return err
	}
}

func runCount(t testing.TB, pool *pgxpool.Pool, task string) int64 {
	t.Helper()
	return queryInt(t, pool, `SELECT count(*) FROM maintenance_runs WHERE task = $1`, task)
}

// slowConfig is for tests that hold a term while they work on it: the lease is long enough
// that no renewal happens during the test unless the test causes one.
func slowConfig() cluster.ElectorConfig {
	cfg := fastElectorConfig()
	cfg.CheckInterval = 100 * time.Millisecond
	cfg.LeaseDuration = 30 * time.Second
	cfg.RefreshInterval = 10 * time.Second
	return cfg
}

func TestRunFencedCommitsWithValidTerm(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := ctxTimeout(t, 10*time.Second)

	a := startTestNode(t, pool, "node-a", fastElectorConfig(), nil)
	term := a.firstTerm(t, 5*time.Second)
	if !term.Valid() {
		t.Fatal("fresh term is not valid")
	}
	if err := term.RunFenced(ctx, pool, insertRun(term, "ok")); err != nil {
		t.Fatalf("RunFenced with a valid term: %v", err)
	}
	if n := runCount(t, pool, "ok"); n != 1 {
		t.Fatalf("fenced write committed %d rows, want 1", n)
	}
	// An error from fn rolls back and is returned as is; the term stays.
	boom := errors.New("boom")
	err := term.RunFenced(ctx, pool, func(tx pgx.Tx) error {
		if err := insertRun(term, "rolled-back")(tx); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("RunFenced returned %v, want fn's error", err)
	}
	if n := runCount(t, pool, "rolled-back"); n != 0 {
		t.Fatal("a failed fenced transaction committed its write")
	}
	if !a.IsLeader() || a.Term() != term {
		t.Fatal("an error of the leader work ended the term")
	}
}

func TestRunFencedRefusedAfterNewerEpoch(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := ctxTimeout(t, 10*time.Second)

	a := startTestNode(t, pool, "node-a", slowConfig(), nil)
	term := a.firstTerm(t, 5*time.Second)

	// The leader pauses; meanwhile another node takes the role under a new epoch.
	mustExec(t, pool, `
UPDATE leaders SET node_id = 'other', incarnation = gen_random_uuid(), epoch = epoch + 1,
       acquired_at = now(), renewed_at = now(), lease_until = now() + interval '1 minute'
WHERE role = 'maintenance'`)

	err := term.RunFenced(ctx, pool, insertRun(term, "stale-write"))
	if !errors.Is(err, cluster.ErrNotLeader) {
		t.Fatalf("RunFenced after a newer epoch = %v, want ErrNotLeader", err)
	}
	if n := runCount(t, pool, "stale-write"); n != 0 {
		t.Fatalf("a write of the superseded epoch committed (%d rows)", n)
	}
	if !termEnded(term) || term.Valid() {
		t.Fatal("the refused term is still live")
	}
	if a.Term() == term {
		t.Fatal("the elector still hands out the refused term")
	}
	if got := a.metric(t, "harmonia_ci_leader_fenced_writes_total", "role", cluster.RoleMaintenance); got != 1 {
		t.Fatalf("fenced_writes = %v, want 1", got)
	}
	waitFor(t, 5*time.Second, func() bool {
		return a.metric(t, "harmonia_ci_leader_step_downs_total", "role", cluster.RoleMaintenance, "kind", "lost") == 1
	}, "the elector to step down after the refused write")
	// A second attempt with the dead term is refused without touching the database.
	if err := term.RunFenced(ctx, pool, insertRun(term, "stale-write")); !errors.Is(err, cluster.ErrNotLeader) {
		t.Fatalf("second RunFenced = %v, want ErrNotLeader", err)
	}
	if n := runCount(t, pool, "stale-write"); n != 0 {
		t.Fatal("a write of the superseded epoch committed")
	}
}

func TestRunFencedRefusedAfterLeaseExpired(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := ctxTimeout(t, 10*time.Second)

	a := startTestNode(t, pool, "node-a", slowConfig(), nil)
	term := a.firstTerm(t, 5*time.Second)

	mustExec(t, pool, `UPDATE leaders SET lease_until = now() - interval '1 second' WHERE role = 'maintenance'`)

	err := term.RunFenced(ctx, pool, insertRun(term, "expired-write"))
	if !errors.Is(err, cluster.ErrNotLeader) {
		t.Fatalf("RunFenced with an expired lease = %v, want ErrNotLeader", err)
	}
	if n := runCount(t, pool, "expired-write"); n != 0 {
		t.Fatalf("a write under an expired lease committed (%d rows)", n)
	}
	if !termEnded(term) || a.Term() == term {
		t.Fatal("the refused term is still live")
	}
	waitFor(t, 5*time.Second, func() bool {
		return a.metric(t, "harmonia_ci_leader_step_downs_total", "role", cluster.RoleMaintenance, "kind", "lost") == 1
	}, "the elector to step down after the refused write")
	// Having stepped down, the node may win the role again, but only under a newer epoch.
	waitFor(t, 5*time.Second, func() bool { return a.IsLeader() }, "re-election")
	if got := a.Term(); got == nil || got.Epoch <= term.Epoch {
		t.Fatalf("re-elected term %+v, want epoch > %d", got, term.Epoch)
	}
}

func TestFenceHoldsOffTheNextEpochUntilCommit(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := ctxTimeout(t, 15*time.Second)

	a := startTestNode(t, pool, "node-a", slowConfig(), nil)
	term := a.firstTerm(t, 5*time.Second)

	inside := make(chan struct{})
	release := make(chan struct{})
	fenced := make(chan error, 1)
	go func() {
		fenced <- term.RunFenced(ctx, pool, func(tx pgx.Tx) error {
			if err := insertRun(term, "fenced")(tx); err != nil {
				return err
			}
			close(inside)
			<-release
			return nil
		})
	}()
	select {
	case <-inside:
	case err := <-fenced:
		t.Fatalf("RunFenced returned early: %v", err)
	case <-ctx.Done():
		t.Fatal("fenced transaction did not start")
	}

	// A new epoch cannot begin while the fenced transaction of the current one is open.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '200ms'`); err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, `UPDATE leaders SET epoch = epoch + 1 WHERE role = 'maintenance'`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("epoch bump during an open fenced transaction: %v, want lock_timeout (55P03)", err)
	}
	_ = tx.Rollback(ctx)

	// Without a timeout the bump waits, and goes through once the fenced transaction commits.
	bumper, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer bumper.Release()
	var bumperPID int32
	if err := bumper.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&bumperPID); err != nil {
		t.Fatal(err)
	}
	bumped := make(chan error, 1)
	go func() {
		_, err := bumper.Exec(ctx, `UPDATE leaders SET epoch = epoch + 1 WHERE role = 'maintenance'`)
		bumped <- err
	}()
	waitFor(t, 5*time.Second, func() bool {
		return queryBool(t, pool, `SELECT coalesce((SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1), false)`, bumperPID)
	}, "the epoch bump to wait on the fenced transaction's row lock")
	select {
	case err := <-bumped:
		t.Fatalf("epoch bump finished while the fenced transaction was open: %v", err)
	default:
	}

	close(release)
	if err := <-fenced; err != nil {
		t.Fatalf("RunFenced: %v", err)
	}
	select {
	case err := <-bumped:
		if err != nil {
			t.Fatalf("epoch bump: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("epoch bump still blocked after the fenced transaction committed")
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM maintenance_runs WHERE task = 'fenced' AND epoch = $1`, term.Epoch); n != 1 {
		t.Fatalf("fenced write of epoch %d: %d rows, want 1", term.Epoch, n)
	}
	if row, _ := readLeader(t, pool, cluster.RoleMaintenance); row.Epoch < term.Epoch+1 {
		t.Fatalf("epoch after the bump = %d, want > %d", row.Epoch, term.Epoch)
	}
}

// TestLongFencedTransactionKeepsLeadership: a fenced transaction holds the lease row FOR SHARE,
// which also blocks the leader's own renewal. A fenced transaction that outlasts one check
// interval but ends well inside the lease must not cost the leader its term.
func TestLongFencedTransactionKeepsLeadership(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := ctxTimeout(t, 15*time.Second)

	cfg := fastElectorConfig()
	cfg.LeaseDuration = 3 * time.Second
	cfg.RefreshInterval = 200 * time.Millisecond
	cfg.CheckInterval = 50 * time.Millisecond
	a := startTestNode(t, pool, "node-a", cfg, nil)
	term := a.firstTerm(t, 5*time.Second)

	inside := make(chan struct{})
	release := make(chan struct{})
	fenced := make(chan error, 1)
	go func() {
		fenced <- term.RunFenced(ctx, pool, func(tx pgx.Tx) error {
			close(inside)
			<-release
			return insertRun(term, "long")(tx)
		})
	}()
	<-inside
	lockPID, ok := lockSessionPID(t, pool)
	if !ok {
		t.Fatal("no lock session")
	}
	// Hold the transaction until the renewal, due every 200ms, has been held up by it for
	// several check intervals.
	waitFor(t, 5*time.Second, func() bool {
		return queryBool(t, pool, `SELECT now() - renewed_at > interval '450 milliseconds' FROM leaders WHERE role = 'maintenance'`)
	}, "the renewal to be held up by the fenced transaction")
	close(release)
	if err := <-fenced; err != nil {
		t.Fatalf("RunFenced: %v", err)
	}
	// The next renewal goes through and the term carries on.
	var since time.Time
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&since); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() bool {
		return queryBool(t, pool, `SELECT renewed_at > $1 FROM leaders WHERE role = 'maintenance'`, since)
	}, "a renewal after the fenced transaction")
	if got := a.metric(t, "harmonia_ci_leader_step_downs_total", "role", cluster.RoleMaintenance, "kind", "lost"); got != 0 {
		t.Fatalf("the leader stepped down %v time(s) because its own fenced transaction delayed a renewal", got)
	}
	if a.Term() != term {
		t.Fatalf("term changed: now %+v, was epoch %d", a.Term(), term.Epoch)
	}
	if pid, _ := lockSessionPID(t, pool); pid != lockPID {
		t.Fatalf("the lock session changed (pid %d -> %d): a context timeout closed the session holding the lock", lockPID, pid)
	}
}

// TestPausedLeaderInsideFencedWriteDoesNotBlockFailover: a leader that is paused (SIGSTOP, a
// long GC or VM pause) in the middle of a fenced write keeps both its lock session and its
// fenced transaction open. Its lease runs out; the standby must take over within a few leases,
// and the paused write, when the leader resumes, must not commit.
//
// Not parallel: the standby preempts the paused lock session (see
// TestPreemptionStaysInItsOwnDatabase).
func TestPausedLeaderInsideFencedWriteDoesNotBlockFailover(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := ctxTimeout(t, 20*time.Second)

	clk := newPausableClock()
	a := newTestNodeWithClock(t, pool, "node-a", fastElectorConfig(), nil, clk)
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	term := a.firstTerm(t, 5*time.Second)

	// Freeze the leader's loop: no more checks or renewals.
	clk.Pause()
	select {
	case <-clk.parked:
	case <-time.After(5 * time.Second):
		t.Fatal("the elector loop did not park")
	}

	// And freeze it inside a fenced write.
	release := make(chan struct{})
	var once sync.Once
	resume := func() { once.Do(func() { close(release) }) }
	t.Cleanup(resume)
	inside := make(chan struct{})
	fenced := make(chan error, 1)
	go func() {
		fenced <- term.RunFenced(ctx, pool, func(tx pgx.Tx) error {
			if err := insertRun(term, "paused-write")(tx); err != nil {
				return err
			}
			close(inside)
			<-release
			return nil
		})
	}()
	select {
	case <-inside:
	case err := <-fenced:
		t.Fatalf("fenced write ended early: %v", err)
	}

	b := startTestNode(t, pool, "node-b", fastElectorConfig(), nil)

	// By its own clock the paused leader stops trusting its term before the lease runs out.
	waitFor(t, 2*time.Second, func() bool { return !term.Valid() && !a.IsLeader() }, "the paused leader's term to lapse locally")

	waitFor(t, 4*time.Second, b.IsLeader, "the standby to take over from a leader paused inside a fenced write")
	row, _ := readLeader(t, pool, cluster.RoleMaintenance)
	if row.NodeID != "node-b" || row.Epoch <= term.Epoch {
		t.Fatalf("leaders row %+v, want node-b with epoch > %d", row, term.Epoch)
	}

	// The paused leader resumes and tries to finish its write: too late.
	resume()
	if err := <-fenced; err == nil {
		t.Fatal("the paused leader's fenced write committed after a newer epoch began")
	}
	if n := runCount(t, pool, "paused-write"); n != 0 {
		t.Fatalf("%d rows of the paused epoch landed", n)
	}
}
