package cluster_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

func testNodeInfo(id string) cluster.NodeInfo {
	return cluster.NodeInfo{
		ID: id, Roles: []string{"builder", "frontend"}, Endpoint: "http://" + id + ":8080",
		Hostname: id + ".example", Systems: []string{testSystem}, Features: []string{"kvm"},
		MaxJobs: 4, MaxEvals: 2, Version: "test",
	}
}

func register(t testing.TB, pool *pgxpool.Pool, id string) *cluster.Registry {
	t.Helper()
	r := cluster.NewRegistry(pool, testNodeInfo(id), discardLogger())
	r.OnReregister(queue.ReleaseNode) // as the node wires it
	if err := r.Register(ctxTimeout(t, 10*time.Second)); err != nil {
		t.Fatalf("Register %s: %v", id, err)
	}
	return r
}

type nodeRow struct {
	Status      status.NodeStatus
	Incarnation uuid.UUID
	Draining    bool
	Roles       []string
	MaxJobs     int
	CurrentJobs int
	CPU         float32
}

func readNode(t testing.TB, pool *pgxpool.Pool, id string) (nodeRow, bool) {
	t.Helper()
	var n nodeRow
	err := pool.QueryRow(context.Background(), `
SELECT status, incarnation, draining, roles, max_jobs, current_jobs, cpu_usage FROM nodes WHERE id = $1`, id).
		Scan(&n.Status, &n.Incarnation, &n.Draining, &n.Roles, &n.MaxJobs, &n.CurrentJobs, &n.CPU)
	if err != nil {
		return n, false
	}
	return n, true
}

func TestRegistryLifecycle(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := ctxTimeout(t, 20*time.Second)

	r := register(t, pool, "node-1")
	if r.ID() != "node-1" {
		t.Fatalf("ID() = %q", r.ID())
	}
	row, ok := readNode(t, pool, "node-1")
	if !ok {
		t.Fatal("Register did not create the node row")
	}
	if row.Status != status.NodeJoining || row.Incarnation != r.Incarnation() || row.Draining {
		t.Fatalf("after Register: %+v, want status joining, incarnation %s, not draining", row, r.Incarnation())
	}
	if r.Incarnation() == uuid.Nil {
		t.Fatal("Register used the nil incarnation")
	}
	if !slices.Equal(row.Roles, []string{"builder", "frontend"}) || row.MaxJobs != 4 {
		t.Fatalf("node info not stored: %+v", row)
	}

	if err := r.SetStatus(ctx, status.NodeActive); err != nil {
		t.Fatalf("SetStatus: %v", err)
	}
	if row, _ := readNode(t, pool, "node-1"); row.Status != status.NodeActive {
		t.Fatalf("status after SetStatus(active) = %q", row.Status)
	}

	// last_seen comes from the database clock: push it into the past, beat, and compare with
	// now() read from the database before and after the beat.
	mustExec(t, pool, `UPDATE nodes SET last_seen = now() - interval '1 hour' WHERE id = 'node-1'`)
	var before, after, lastSeen time.Time
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	draining, err := r.Beat(ctx, cluster.Load{CurrentJobs: 3, CPU: 0.5, Memory: 0.25})
	if err != nil {
		t.Fatalf("Beat: %v", err)
	}
	if draining {
		t.Fatal("Beat reported draining for a node nobody asked to drain")
	}
	if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT last_seen FROM nodes WHERE id = 'node-1'`).Scan(&lastSeen); err != nil {
		t.Fatal(err)
	}
	if lastSeen.Before(before) || lastSeen.After(after) {
		t.Fatalf("last_seen %s not within the database's now() around the beat [%s, %s]", lastSeen, before, after)
	}
	if row, _ := readNode(t, pool, "node-1"); row.CurrentJobs != 3 || row.CPU != 0.5 || row.Status != status.NodeActive {
		t.Fatalf("after Beat: %+v, want current_jobs 3, cpu 0.5, status active", row)
	}

	// An operator's drain request reaches the node at its next beat.
	if err := cluster.RequestDrain(ctx, pool, "node-1"); err != nil {
		t.Fatalf("RequestDrain: %v", err)
	}
	draining, err = r.Beat(ctx, cluster.Load{})
	if err != nil {
		t.Fatalf("Beat after drain request: %v", err)
	}
	if !draining {
		t.Fatal("Beat after RequestDrain reported draining=false")
	}
	if row, _ := readNode(t, pool, "node-1"); row.Status != status.NodeDraining || !row.Draining {
		t.Fatalf("after drain request and beat: %+v, want status draining", row)
	}
	// The process cannot talk its way out of an operator's drain.
	if err := r.SetStatus(ctx, status.NodeActive); err != nil {
		t.Fatalf("SetStatus: %v", err)
	}
	if row, _ := readNode(t, pool, "node-1"); row.Status != status.NodeDraining {
		t.Fatalf("SetStatus(active) on a drained node made the status %q", row.Status)
	}

	if err := r.Deregister(ctx); err != nil {
		t.Fatalf("Deregister: %v", err)
	}
	if _, ok := readNode(t, pool, "node-1"); ok {
		t.Fatal("Deregister left the node row")
	}
}

func TestRequestDrainUnknownOrDeadNode(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := ctxTimeout(t, 10*time.Second)

	err := cluster.RequestDrain(ctx, pool, "no-such-node")
	if !errors.Is(err, cluster.ErrNodeNotFound) {
		t.Fatalf("RequestDrain(unknown) = %v, want ErrNodeNotFound", err)
	}
	insertNode(t, pool, "dead-node", status.NodeDead, time.Hour)
	if err := cluster.RequestDrain(ctx, pool, "dead-node"); !errors.Is(err, cluster.ErrNodeNotFound) {
		t.Fatalf("RequestDrain(dead) = %v, want ErrNodeNotFound", err)
	}
}

func TestReRegistrationReleasesWhatThePreviousIncarnationHeld(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := ctxTimeout(t, 20*time.Second)
	const id = "builder-1"

	old := register(t, pool, id)

	building := insertJob(t, pool, insertDerivation(t, pool, "building"), status.JobBuilding, id, 0)
	uploading := insertJob(t, pool, insertDerivation(t, pool, "uploading"), status.JobUploading, id, 1)
	exhaustedDrv := insertDerivation(t, pool, "exhausted")
	exhausted := insertJob(t, pool, exhaustedDrv, status.JobBuilding, id, 3)
	dependentDrv := insertDerivation(t, pool, "dependent")
	dependent := insertJob(t, pool, dependentDrv, status.JobPending, "", 0)
	insertDependency(t, pool, dependentDrv, exhaustedDrv)
	transitiveDrv := insertDerivation(t, pool, "transitive")
	transitive := insertJob(t, pool, transitiveDrv, status.JobPending, "", 0)
	insertDependency(t, pool, transitiveDrv, dependentDrv)
	unrelated := insertJob(t, pool, insertDerivation(t, pool, "unrelated"), status.JobPending, "", 0)
	othersJob := insertJob(t, pool, insertDerivation(t, pool, "others"), status.JobBuilding, "builder-2", 0)

	project := insertProject(t, pool, "proj")
	runningEval := insertEvaluation(t, pool, project, "c1", status.EvalRunning, id)
	othersEval := insertEvaluation(t, pool, project, "c2", status.EvalRunning, "builder-2")

	mustExec(t, pool, `
INSERT INTO leaders (role, node_id, incarnation, epoch, lease_until)
VALUES ('maintenance', $1, $2, 4, now() + interval '1 minute')`, id, old.Incarnation())

	// Wake-ups for the released work are sent at commit.
	listener, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Release()
	if _, err := listener.Exec(ctx, `LISTEN build_jobs`); err != nil {
		t.Fatal(err)
	}

	fresh := register(t, pool, id)
	if fresh.Incarnation() == old.Incarnation() {
		t.Fatal("a new Registry reused the old incarnation")
	}
	if row, _ := readNode(t, pool, id); row.Incarnation != fresh.Incarnation() || row.Status != status.NodeJoining {
		t.Fatalf("node row after re-registration: %+v, want incarnation %s, joining", row, fresh.Incarnation())
	}

	if j := readJob(t, pool, building); j.Status != status.JobPending || j.ClaimedBy != nil || j.Retries != 1 {
		t.Fatalf("building job after re-registration: %+v, want pending, unclaimed, retry 1", j)
	}
	if j := readJob(t, pool, uploading); j.Status != status.JobPending || j.ClaimedBy != nil || j.Retries != 2 {
		t.Fatalf("uploading job after re-registration: %+v, want pending, unclaimed, retry 2", j)
	}
	if j := readJob(t, pool, exhausted); j.Status != status.JobFailed || j.Retries != 3 {
		t.Fatalf("job out of retries after re-registration: %+v, want failed, retry 3", j)
	}
	if j := readJob(t, pool, dependent); j.Status != status.JobDepFailed {
		t.Fatalf("pending dependent of the failed job: %+v, want dep-failed", j)
	}
	if j := readJob(t, pool, transitive); j.Status != status.JobDepFailed {
		t.Fatalf("pending transitive dependent of the failed job: %+v, want dep-failed", j)
	}
	if j := readJob(t, pool, unrelated); j.Status != status.JobPending {
		t.Fatalf("unrelated pending job: %+v, want untouched", j)
	}
	if j := readJob(t, pool, othersJob); j.Status != status.JobBuilding || j.ClaimedBy == nil || *j.ClaimedBy != "builder-2" {
		t.Fatalf("another node's job: %+v, want untouched", j)
	}

	var evalStatus status.EvalStatus
	var evalClaim *string
	if err := pool.QueryRow(ctx, `SELECT status, claimed_by FROM evaluations WHERE id = $1`, runningEval).Scan(&evalStatus, &evalClaim); err != nil {
		t.Fatal(err)
	}
	if evalStatus != status.EvalQueued || evalClaim != nil {
		t.Fatalf("running evaluation of the old incarnation: status %q claimed_by %v, want queued and unclaimed", evalStatus, evalClaim)
	}
	if err := pool.QueryRow(ctx, `SELECT status FROM evaluations WHERE id = $1`, othersEval).Scan(&evalStatus); err != nil {
		t.Fatal(err)
	}
	if evalStatus != status.EvalRunning {
		t.Fatalf("another node's evaluation: status %q, want running", evalStatus)
	}

	if queryBool(t, pool, `SELECT lease_until > now() FROM leaders WHERE role = 'maintenance'`) {
		t.Fatal("the old incarnation's lease is still valid after re-registration")
	}

	// Notifications: the failed job and its dep-failed dependents, and a wake-up for the system.
	want := map[string]bool{
		`{"drv_path":"` + exhaustedDrv + `","status":"failed"}`:      false,
		`{"drv_path":"` + dependentDrv + `","status":"dep-failed"}`:  false,
		`{"drv_path":"` + transitiveDrv + `","status":"dep-failed"}`: false,
		`{"system":"` + testSystem + `"}`:                            false,
	}
	for missing := len(want); missing > 0; {
		nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		n, err := listener.Conn().WaitForNotification(nctx)
		cancel()
		if err != nil {
			t.Fatalf("waiting for build_jobs notifications (still missing some of %v): %v", want, err)
		}
		var norm map[string]string
		if err := json.Unmarshal([]byte(n.Payload), &norm); err != nil {
			t.Fatalf("notification payload %q: %v", n.Payload, err)
		}
		canon, _ := json.Marshal(norm)
		if seen, ok := want[string(canon)]; ok && !seen {
			want[string(canon)] = true
			missing--
		}
	}

	// The old process learns at its next beat that the node id is no longer its own.
	if _, err := old.Beat(ctx, cluster.Load{}); !errors.Is(err, cluster.ErrSuperseded) {
		t.Fatalf("old incarnation's Beat = %v, want ErrSuperseded", err)
	}
	if _, err := fresh.Beat(ctx, cluster.Load{}); err != nil {
		t.Fatalf("new incarnation's Beat: %v", err)
	}
	// Nor can it delete the row that is no longer its own.
	if err := old.Deregister(ctx); err != nil {
		t.Fatalf("old Deregister: %v", err)
	}
	if row, ok := readNode(t, pool, id); !ok || row.Incarnation != fresh.Incarnation() {
		t.Fatalf("old incarnation's Deregister removed or changed the new row: %+v (exists %v)", row, ok)
	}
}

func TestBeatRecreatesDeletedRow(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := ctxTimeout(t, 10*time.Second)

	r := register(t, pool, "node-1")
	if err := r.SetStatus(ctx, status.NodeActive); err != nil {
		t.Fatal(err)
	}
	// Maintenance deleted the row while the node was unreachable.
	mustExec(t, pool, `DELETE FROM nodes WHERE id = 'node-1'`)

	draining, err := r.Beat(ctx, cluster.Load{CurrentJobs: 1})
	if err != nil {
		t.Fatalf("Beat on a deleted row: %v", err)
	}
	if draining {
		t.Fatal("re-created row reported draining")
	}
	row, ok := readNode(t, pool, "node-1")
	if !ok {
		t.Fatal("Beat did not re-create the node row")
	}
	if row.Incarnation != r.Incarnation() || row.Status != status.NodeActive {
		t.Fatalf("re-created row: %+v, want incarnation %s and status active", row, r.Incarnation())
	}
	if queryBool(t, pool, `SELECT now() - last_seen > interval '10 seconds' FROM nodes WHERE id = 'node-1'`) {
		t.Fatal("re-created row has a stale last_seen")
	}
	// And the node keeps beating normally afterwards.
	if _, err := r.Beat(ctx, cluster.Load{}); err != nil {
		t.Fatalf("Beat after re-creation: %v", err)
	}
}

func TestBeatUndoesDeadMark(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := ctxTimeout(t, 10*time.Second)

	r := register(t, pool, "node-1")
	if err := r.SetStatus(ctx, status.NodeActive); err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, `UPDATE nodes SET status = 'dead' WHERE id = 'node-1'`)
	if _, err := r.Beat(ctx, cluster.Load{}); err != nil {
		t.Fatalf("Beat: %v", err)
	}
	if s, _ := nodeStatus(t, pool, "node-1"); s != status.NodeActive {
		t.Fatalf("status after a beat of a node marked dead = %q, want active", s)
	}
}

func TestHeartbeatCallsOnSupersededOnce(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)

	old := register(t, pool, "node-1")
	register(t, pool, "node-1") // another process took the id

	var superseded, beats atomic.Int32
	hb := cluster.NewHeartbeat(cluster.HeartbeatConfig{
		Interval: 50 * time.Millisecond,
		OnSuperseded: func(err error) {
			if !errors.Is(err, cluster.ErrSuperseded) {
				t.Errorf("OnSuperseded(%v), want ErrSuperseded", err)
			}
			superseded.Add(1)
		},
		BeatFunc: func(error) { beats.Add(1) },
	}, old, cluster.NewMetrics(prometheus.NewRegistry()), discardLogger(), clock.Real{})
	if err := hb.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hb.Stop)

	// The loop must end by itself once it learns the id is taken.
	select {
	case <-hb.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("heartbeat kept running after the node id was superseded")
	}
	if n := superseded.Load(); n != 1 {
		t.Fatalf("OnSuperseded called %d times (over %d beats), want exactly once", n, beats.Load())
	}
}

func TestHeartbeatDrainAndFailures(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := ctxTimeout(t, 10*time.Second)

	r := register(t, pool, "node-1")
	reg := prometheus.NewRegistry()
	var drains, beats, failed atomic.Int32
	hb := cluster.NewHeartbeat(cluster.HeartbeatConfig{
		Interval: 30 * time.Millisecond,
		LoadFunc: func() cluster.Load { return cluster.Load{CurrentJobs: 2} },
		OnDrain:  func() { drains.Add(1) },
		BeatFunc: func(err error) {
			beats.Add(1)
			if err != nil {
				failed.Add(1)
			}
		},
	}, r, cluster.NewMetrics(reg), discardLogger(), clock.Real{})
	if err := hb.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hb.Stop)

	waitFor(t, 5*time.Second, func() bool {
		return queryInt(t, pool, `SELECT current_jobs FROM nodes WHERE id = 'node-1'`) == 2
	}, "heartbeat to report the load")
	if err := cluster.RequestDrain(ctx, pool, "node-1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() bool { return drains.Load() > 0 }, "OnDrain after a drain request")
	seen := beats.Load()
	waitFor(t, 5*time.Second, func() bool { return beats.Load() >= seen+3 }, "three more beats")
	if n := drains.Load(); n != 1 {
		t.Fatalf("OnDrain called %d times, want once", n)
	}
	if s, _ := nodeStatus(t, pool, "node-1"); s != status.NodeDraining {
		t.Fatalf("status = %q, want draining", s)
	}
	if failed.Load() != 0 || metricValue(t, reg, "harmonia_ci_heartbeat_failures_total") != 0 {
		t.Fatalf("%d beats failed", failed.Load())
	}
	hb.Stop()
}
