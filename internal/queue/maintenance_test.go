package queue_test

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	qt "github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// TestReaperReturnsDeadNodesClaims runs the queue's maintenance under two in-process electors
// on one database. Claims of a node whose heartbeat is older than the dead threshold go back to
// the queue with a retry counted, exactly once per death, and fail (with their dependents) once
// retries are used up; a live node's claims are never touched; the dead node's late finishes
// are refused; every reaper run is recorded under the one leader of its epoch, including after
// a handover.
func TestReaperReturnsDeadNodesClaims(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t, 16)
	ctx := qt.Ctx(t, 60*time.Second)
	// One system per job that is claimed, so each claim takes exactly the job meant.
	const sysX, sysU, sysW = "x-linux", "u-linux", "w-linux"
	qt.Enqueue(t, pool, nil,
		qt.Drv("x", sysX), qt.Drv("y", sysX, "x"), qt.Drv("y2", sysX, "y"),
		qt.Drv("u", sysU), qt.Drv("w", sysW))
	on := func(node string, systems ...string) queue.Claimer {
		return queue.Claimer{NodeID: node, Systems: systems}
	}

	// Live nodes beat every 100ms, well inside the 3s threshold; dead ones are backdated an hour.
	for _, n := range []qt.Node{{ID: "alive", Systems: []string{sysW}}, {ID: "survivor", Systems: []string{sysX}}} {
		qt.InsertNode(t, pool, n)
		qt.KeepAlive(t, pool, n.ID, 100*time.Millisecond)
	}
	w := claimOne(t, pool, on("alive", sysW))
	qt.InsertNode(t, pool, qt.Node{ID: "doomed-1", Systems: []string{sysX, sysU}})
	held := claim(t, pool, on("doomed-1", sysX, sysU), 2)
	if got := qt.Names(held); len(got) != 2 || got[0] != "u" || got[1] != "x" {
		t.Fatalf("doomed-1 claimed %v, want [u x]", got)
	}
	x1, u1 := held[1], held[0]
	if qt.NameOf(x1.DrvPath) != "x" {
		x1, u1 = u1, x1
	}
	if err := queue.MarkUploading(ctx, pool, u1.Claim()); err != nil {
		t.Fatal(err)
	}

	tasks := queue.MaintenanceTasks(queue.MaintenanceConfig{DeadThreshold: 3 * time.Second, ReapInterval: 50 * time.Millisecond}, qt.Logger())
	leaders := []*qt.Leader{
		qt.StartMaintainer(t, pool, "maint-a", qt.SteadyElector(), tasks),
		qt.StartMaintainer(t, pool, "maint-b", qt.SteadyElector(), tasks),
	}
	reapRuns := func() int64 {
		return qt.QueryInt(t, pool, `SELECT count(*) FROM maintenance_runs WHERE task = 'reap-dead-claims'`)
	}
	qt.WaitFor(t, 10*time.Second, func() bool { return reapRuns() > 0 }, "the reaper to run")

	// Death 1: a building and an uploading claim go back to the queue.
	qt.Backdate(t, pool, "doomed-1", time.Hour)
	qt.WaitFor(t, 10*time.Second, func() bool {
		x, u := qt.Job(t, pool, "x"), qt.Job(t, pool, "u")
		return x.Status == status.JobPending && u.Status == status.JobPending
	}, "the dead node's building and uploading jobs to be requeued")
	for _, name := range []string{"x", "u"} {
		if j := qt.Job(t, pool, name); j.RetryCount != 1 || j.ClaimedBy != nil || j.Attempt != 1 {
			t.Fatalf("reaped %v, want pending, unclaimed, 1 retry", j)
		}
	}
	checkHeldByAlive := func(when string) {
		t.Helper()
		if j := qt.Job(t, pool, "w"); j.Status != status.JobBuilding || j.ClaimedBy == nil || *j.ClaimedBy != "alive" || j.RetryCount != 0 || j.Attempt != w.Attempt {
			t.Fatalf("%s: the live node's job was touched: %v", when, j)
		}
	}
	checkHeldByAlive("after the first death")

	// The dead node's late writes change nothing.
	if _, err := queue.Succeed(ctx, pool, x1.Claim()); !qt.IsStale(err) {
		t.Fatalf("Succeed by the dead node: %v, want ErrStale", err)
	}
	if _, err := queue.Fail(ctx, pool, u1.Claim(), queue.Failure{Kind: queue.Permanent}); !qt.IsStale(err) {
		t.Fatalf("Fail by the dead node: %v, want ErrStale", err)
	}
	if err := queue.MarkUploading(ctx, pool, x1.Claim()); !qt.IsStale(err) {
		t.Fatalf("MarkUploading by the dead node: %v, want ErrStale", err)
	}
	if x, u := qt.Job(t, pool, "x"), qt.Job(t, pool, "u"); x.Status != status.JobPending || u.Status != status.JobPending || x.RetryCount != 1 || u.RetryCount != 1 {
		t.Fatalf("stale writes changed the jobs: %v; %v", x, u)
	}

	// Claimed again by a live node, the job is not reaped again for the old death, and the old
	// claim stays refused.
	x2 := claimOne(t, pool, on("survivor", sysX))
	if x2.ID != x1.ID || x2.Attempt != 2 || x2.RetryCount != 1 {
		t.Fatalf("re-claim: %+v", x2)
	}
	if _, err := queue.Succeed(ctx, pool, x1.Claim()); !qt.IsStale(err) {
		t.Fatalf("Succeed by the dead node after the re-claim: %v, want ErrStale", err)
	}
	runs := reapRuns()
	qt.WaitFor(t, 10*time.Second, func() bool { return reapRuns() >= runs+5 }, "five more reaper runs")
	if j := qt.Job(t, pool, "x"); j.Status != status.JobBuilding || *j.ClaimedBy != "survivor" || j.RetryCount != 1 || j.Attempt != 2 {
		t.Fatalf("a live node's re-claim was disturbed: %v", j)
	}
	checkHeldByAlive("after more reaper runs")
	if err := queue.Release(ctx, pool, x2.Claim()); err != nil {
		t.Fatal(err)
	}

	// Deaths 2 and 3 requeue it; after the handover, death 4 fails it and its dependents.
	for death := 2; death <= 4; death++ {
		node := fmt.Sprintf("doomed-%d", death)
		qt.InsertNode(t, pool, qt.Node{ID: node, Systems: []string{sysX}})
		xk := claimOne(t, pool, on(node, sysX))
		if qt.NameOf(xk.DrvPath) != "x" || xk.RetryCount != death-1 {
			t.Fatalf("death %d: claimed %+v", death, xk)
		}
		if death == 3 {
			handOver(t, leaders)
		}
		qt.Backdate(t, pool, node, time.Hour)
		want := status.JobPending
		if death == 4 {
			want = status.JobFailed
		}
		qt.WaitFor(t, 10*time.Second, func() bool { return qt.Status(t, pool, "x") == want }, "death %d: x %s", death, want)
		if j := qt.Job(t, pool, "x"); j.RetryCount != min(death, 3) {
			t.Fatalf("death %d: %v, want %d retries", death, j, min(death, 3))
		}
		if _, err := queue.Succeed(ctx, pool, xk.Claim()); !qt.IsStale(err) {
			t.Fatalf("death %d: Succeed by the dead node: %v, want ErrStale", death, err)
		}
	}
	if got := jobStatuses(t, pool, "x", "y", "y2"); !maps.Equal(got, map[string]status.JobStatus{"x": status.JobFailed, "y": status.JobDepFailed, "y2": status.JobDepFailed}) {
		t.Fatalf("after the last death: %v", got)
	}
	checkHeldByAlive("at the end")

	// Every reap was recorded once: x four times, u once, and y, y2 dep-failed.
	runs = reapRuns()
	qt.WaitFor(t, 10*time.Second, func() bool { return reapRuns() >= runs+2 }, "two more reaper runs")
	if n := qt.QueryInt(t, pool, `SELECT coalesce(sum(affected), 0) FROM maintenance_runs WHERE task = 'reap-dead-claims'`); n != 7 {
		t.Fatalf("reaper runs changed %d jobs in all, want 7 (every death reaped exactly once)", n)
	}
	checkRunsFenced(t, pool, leaders, "reap-dead-claims", 2)
}

// handOver stops whichever leader leads and waits for the other to take over.
func handOver(t testing.TB, leaders []*qt.Leader) {
	t.Helper()
	var cur, next *qt.Leader
	qt.WaitFor(t, 10*time.Second, func() bool {
		for i, l := range leaders {
			if l.IsLeader() {
				cur, next = l, leaders[1-i]
				return true
			}
		}
		return false
	}, "a leader")
	cur.Stop()
	qt.WaitFor(t, 10*time.Second, next.IsLeader, "%s to take over from %s", next.ID.NodeID, cur.ID.NodeID)
}

// checkRunsFenced checks that every maintenance run of task was recorded by the node that held
// the role for its epoch (as the electors' terms say), one node per epoch, and that the runs
// span at least minEpochs epochs.
func checkRunsFenced(t testing.TB, pool *pgxpool.Pool, leaders []*qt.Leader, task string, minEpochs int) {
	t.Helper()
	holder := map[int64]string{}
	for _, l := range leaders {
		for _, term := range l.AllTerms() {
			if prev, ok := holder[term.Epoch]; ok && prev != term.NodeID {
				t.Fatalf("epoch %d was given to both %s and %s", term.Epoch, prev, term.NodeID)
			}
			holder[term.Epoch] = term.NodeID
		}
	}
	rows, err := pool.Query(context.Background(), `
SELECT epoch, node_id, count(*) FROM maintenance_runs WHERE task = $1 GROUP BY epoch, node_id ORDER BY epoch`, task)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seen := map[int64]string{}
	for rows.Next() {
		var epoch, n int64
		var node string
		if err := rows.Scan(&epoch, &node, &n); err != nil {
			t.Fatal(err)
		}
		if other, ok := seen[epoch]; ok {
			t.Errorf("%s ran under epoch %d on two nodes: %s and %s", task, epoch, other, node)
		}
		seen[epoch] = node
		if holder[epoch] != node {
			t.Errorf("%d runs of %s recorded by %s under epoch %d, which was held by %q", n, task, node, epoch, holder[epoch])
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(seen) < minEpochs {
		t.Errorf("%s ran under %d epochs (%v), want at least %d", task, len(seen), seen, minEpochs)
	}
}

// TestFailUnsupported: a job pending past the grace that no live, non-draining builder can
// build (its system, or one of its required features, is missing) is failed, with its pending
// dependents; jobs a live builder supports and jobs still inside the grace are left alone.
func TestFailUnsupported(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	const grace = 3 * time.Second
	// A node that builds and leads: its worker and its maintenance share the failure counter.
	reg := prometheus.NewRegistry()
	// (The worker is built, never started: it would claim the supported jobs.)
	if _, err := queue.NewWorker(queue.WorkerConfig{Claimer: claimer("unsupported-metrics"), Registerer: reg,
		Handler: func(context.Context, queue.Job) queue.Result { return queue.Result{} }}, pool, qt.TestLogger(t), clock.Real{}); err != nil {
		t.Fatal(err)
	}
	cfg := queue.MaintenanceConfig{DeadThreshold: time.Minute, UnsupportedGrace: grace, Registerer: reg}
	task := qt.Task(t, queue.MaintenanceTasks(cfg, qt.Logger()), "fail-unsupported")
	term := qt.StartLeader(t, pool, "maint", qt.SteadyElector(), nil).NextTerm(t, 10*time.Second)

	for _, n := range []qt.Node{
		{ID: "x86-builder", Systems: []string{"x86_64-linux", "i686-linux"}, Features: []string{"big-parallel", "nixos-test"}},
		{ID: "riscv-draining", Systems: []string{"riscv64-linux"}, Draining: true, Status: status.NodeDraining},
		{ID: "kvm-silent", Systems: []string{"x86_64-linux"}, Features: []string{"kvm"}, SeenAgo: 10 * time.Minute},
		{ID: "arm-dead", Systems: []string{"aarch64-linux"}, Status: status.NodeDead},
		{ID: "mips-frontend", Roles: []string{"frontend"}, Systems: []string{"mips64-linux"}},
	} {
		qt.InsertNode(t, pool, n)
	}
	cases := []struct {
		drv  queue.Derivation
		want status.JobStatus
	}{
		{qt.Drv("plain", "x86_64-linux"), status.JobPending},
		{qt.Drv("other-system-of-a-builder", "i686-linux"), status.JobPending},
		{qt.WithFeatures(qt.Drv("features-a-builder-has", "x86_64-linux"), "big-parallel", "nixos-test"), status.JobPending},
		{qt.WithFeatures(qt.Drv("kvm", "x86_64-linux"), "kvm"), status.JobFailed}, // only a silent node has it
		{qt.WithFeatures(qt.Drv("kvm-and-big", "x86_64-linux"), "kvm", "big-parallel"), status.JobFailed},
		{qt.Drv("riscv", "riscv64-linux"), status.JobFailed},   // only a draining node
		{qt.Drv("aarch64", "aarch64-linux"), status.JobFailed}, // only a node marked dead
		{qt.Drv("mips", "mips64-linux"), status.JobFailed},     // only a node without the builder role
		{qt.Drv("riscv-dependent", "x86_64-linux", "riscv"), status.JobDepFailed},
		{qt.Drv("riscv-transitive", "x86_64-linux", "riscv-dependent"), status.JobDepFailed},
		{qt.Drv("supported-dependent", "x86_64-linux", "plain"), status.JobPending},
	}
	want := map[string]status.JobStatus{}
	for _, c := range cases {
		qt.Enqueue(t, pool, nil, c.drv)
		want[c.drv.Name] = c.want
	}
	qt.Exec(t, pool, `UPDATE build_jobs SET created_at = now() - interval '10 minutes'`)
	// Enqueued now: inside the grace.
	qt.Enqueue(t, pool, nil, qt.Drv("riscv-fresh", "riscv64-linux"))
	want["riscv-fresh"] = status.JobPending

	changed := qt.RunTask(t, pool, term, task)
	got := jobStatuses(t, pool, slices.Collect(maps.Keys(want))...)
	if !maps.Equal(got, want) {
		for name, w := range want {
			if got[name] != w {
				t.Errorf("%s: %s, want %s", name, got[name], w)
			}
		}
		t.FailNow()
	}
	if changed != 7 {
		t.Fatalf("fail-unsupported reported %d jobs changed, want 7 (5 failed, 2 dep-failed)", changed)
	}
	for kind, n := range map[string]float64{"unsupported": 5, "dep-failed": 2, "permanent": 0, "transient": 0} {
		if got := failures(t, reg, kind); got != n {
			t.Errorf("harmonia_ci_build_failures_total{kind=%q} = %v, want %v", kind, got, n)
		}
	}

	// Once the grace has passed, the fresh job goes the same way; supported jobs still stay.
	qt.WaitFor(t, 10*grace, func() bool {
		qt.RunTask(t, pool, term, task)
		return qt.Status(t, pool, "riscv-fresh") == status.JobFailed
	}, "the unsupported job to be failed after the grace")
	for _, name := range []string{"plain", "other-system-of-a-builder", "features-a-builder-has", "supported-dependent"} {
		if s := qt.Status(t, pool, name); s != status.JobPending {
			t.Fatalf("%s became %s, want pending (a live builder supports it)", name, s)
		}
	}
}

// TestDecayShares: the decay task multiplies every project's consumed builder time by the
// factor (0.95 by default).
func TestDecayShares(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		factor float64
		want   float64
	}{
		{"default", 0, 0.95},
		{"configured", 0.5, 0.5},
		{"out of range takes the default", 1.5, 0.95},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := dbtest.NewPool(t)
			consumed := map[int64]float64{}
			for i, c := range []float64{100, 0, 40, 3.5} {
				id := qt.NewProject(t, pool, fmt.Sprintf("p%d", i), 100)
				qt.Exec(t, pool, `UPDATE projects SET consumed_seconds = $2 WHERE id = $1`, id, c)
				consumed[id] = c
			}
			task := qt.Task(t, queue.MaintenanceTasks(queue.MaintenanceConfig{DecayFactor: tc.factor}, qt.Logger()), "decay-shares")
			term := qt.StartLeader(t, pool, "maint", qt.SteadyElector(), nil).NextTerm(t, 10*time.Second)
			for round := 1; round <= 2; round++ {
				if n := qt.RunTask(t, pool, term, task); n != 3 {
					t.Fatalf("round %d: decay changed %d projects, want the 3 with consumed time", round, n)
				}
				for id, c := range consumed {
					var got float64
					if err := pool.QueryRow(context.Background(), `SELECT consumed_seconds FROM projects WHERE id = $1`, id).Scan(&got); err != nil {
						t.Fatal(err)
					}
					if want := c * math.Pow(tc.want, float64(round)); math.Abs(got-want) > 1e-9 {
						t.Fatalf("round %d: project %d consumed %v, want %v", round, id, got, want)
					}
				}
			}
		})
	}
}

// TestAuditRepairsReadyFlag checks that the readiness audit compares the ready flag with the
// count as well as the count with the truth: ready is written beside blocked_inputs by the
// readiness triggers, and a flag out of step with its count would hide a job from the claim
// (or offer a blocked one) with every count right.
func TestAuditRepairsReadyFlag(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t, 4)
	ctx := qt.Ctx(t, 30*time.Second)
	qt.Enqueue(t, pool, nil, qt.Drv("a", "x-linux"), qt.Drv("b", "x-linux", "a"))
	qt.Exec(t, pool, `UPDATE build_jobs SET ready = NOT ready`)
	task := qt.Task(t, queue.MaintenanceTasks(queue.MaintenanceConfig{}, qt.Logger()), "audit-readiness")
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n, err := task.Run(ctx, tx)
	if err == nil {
		err = tx.Commit(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("audit repaired %d jobs, want 2", n)
	}
	var wrong int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM build_jobs WHERE ready <> (blocked_inputs = 0)`).Scan(&wrong); err != nil {
		t.Fatal(err)
	}
	if wrong != 0 {
		t.Fatalf("%d jobs still have a ready flag out of step with their count", wrong)
	}
	if got := claim(t, pool, queue.Claimer{NodeID: "n", Systems: []string{"x-linux"}}, 2); len(got) != 1 || qt.NameOf(got[0].DrvPath) != "a" {
		t.Fatalf("claimed %v after the audit, want [a]", qt.Names(got))
	}
}
