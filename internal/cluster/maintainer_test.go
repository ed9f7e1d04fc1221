package cluster_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

func TestMaintainerNodeTasks(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)

	insertNode(t, pool, "fresh", status.NodeActive, 0)
	insertNode(t, pool, "silent", status.NodeActive, time.Minute)
	insertNode(t, pool, "silent-draining", status.NodeDraining, time.Minute)
	insertNode(t, pool, "long-dead", status.NodeDead, 2*time.Hour)
	insertNode(t, pool, "recently-dead", status.NodeDead, time.Minute)
	insertNode(t, pool, "dead-building", status.NodeDead, 2*time.Hour)
	insertNode(t, pool, "dead-uploading", status.NodeDead, 2*time.Hour)
	insertNode(t, pool, "dead-evaluating", status.NodeDead, 2*time.Hour)
	insertJob(t, pool, insertDerivation(t, pool, "held"), status.JobBuilding, "dead-building", 0)
	insertJob(t, pool, insertDerivation(t, pool, "held-upload"), status.JobUploading, "dead-uploading", 0)
	insertEvaluation(t, pool, insertProject(t, pool, "p"), "c1", status.EvalRunning, "dead-evaluating")
	// An old run that the prune task removes.
	mustExec(t, pool, `
INSERT INTO maintenance_runs (role, task, node_id, epoch, ran_at)
VALUES ('maintenance', 'ancient', 'someone', 1, now() - interval '2 days')`)

	tasks := cluster.NodeTasks(cluster.NodeTasksConfig{
		Interval:      50 * time.Millisecond,
		DeadThreshold: 30 * time.Second,
		DeadRetention: time.Hour,
	}, discardLogger())
	maint := cluster.NewMaintainer(pool, tasks, discardLogger(), clock.Real{})
	a := startTestNode(t, pool, "leader-1", fastElectorConfig(), maint.Lead)
	term := a.firstTerm(t, 5*time.Second)

	waitFor(t, 5*time.Second, func() bool {
		s1, _ := nodeStatus(t, pool, "silent")
		s2, _ := nodeStatus(t, pool, "silent-draining")
		return s1 == status.NodeDead && s2 == status.NodeDead
	}, "silent nodes to be marked dead")
	waitFor(t, 5*time.Second, func() bool {
		_, ok := nodeStatus(t, pool, "long-dead")
		return !ok
	}, "the long-dead node's row to be deleted")

	if s, _ := nodeStatus(t, pool, "fresh"); s != status.NodeActive {
		t.Fatalf("a live node was changed to %q", s)
	}
	for _, id := range []string{"recently-dead", "dead-building", "dead-uploading", "dead-evaluating"} {
		if s, ok := nodeStatus(t, pool, id); !ok || s != status.NodeDead {
			t.Fatalf("node %s: status %q exists %v, want kept as dead", id, s, ok)
		}
	}

	// Every run is recorded under the leader's epoch and node id.
	for _, task := range []string{"mark-dead-nodes", "delete-dead-nodes", "prune-maintenance-runs"} {
		waitFor(t, 5*time.Second, func() bool { return runCount(t, pool, task) > 0 }, "a maintenance_runs row for %s", task)
	}
	if n := queryInt(t, pool, `
SELECT count(*) FROM maintenance_runs
WHERE task <> 'ancient' AND (role <> 'maintenance' OR node_id <> $1 OR epoch <> $2)`, term.NodeID, term.Epoch); n != 0 {
		t.Fatalf("%d maintenance runs not recorded under the leader (node %s, epoch %d)", n, term.NodeID, term.Epoch)
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM maintenance_runs WHERE task = 'mark-dead-nodes' AND affected = 2`); n != 1 {
		t.Fatalf("mark-dead-nodes runs with affected = 2: %d, want exactly 1", n)
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM maintenance_runs WHERE task = 'delete-dead-nodes' AND affected = 1`); n != 1 {
		t.Fatalf("delete-dead-nodes runs with affected = 1: %d, want exactly 1", n)
	}
	if n := runCount(t, pool, "ancient"); n != 0 {
		t.Fatal("prune-maintenance-runs kept a run older than the retention")
	}

	// Stop waits for the leader work, which ends with the term; the lease is resigned after.
	a.Stop()
	if !termEnded(term) {
		t.Fatal("term still live after Stop")
	}
	if row, _ := readLeader(t, pool, cluster.RoleMaintenance); row.Valid {
		t.Fatalf("lease still valid after Stop: %+v", row)
	}
}

// TestMaintainerWritesNothingUnderAnOldEpoch: once a newer epoch has begun, no write of the
// old one lands: the core guarantee of fencing, checked on the maintenance log.
func TestMaintainerWritesNothingUnderAnOldEpoch(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)

	tick := cluster.Task{Name: "tick", Interval: 5 * time.Millisecond, Run: func(ctx context.Context, tx pgx.Tx) (int64, error) {
		return 0, nil
	}}
	maint := cluster.NewMaintainer(pool, []cluster.Task{tick, tick, tick}, discardLogger(), clock.Real{})
	a := startTestNode(t, pool, "node-a", slowConfig(), maint.Lead)
	term := a.firstTerm(t, 5*time.Second)
	waitFor(t, 5*time.Second, func() bool { return runCount(t, pool, "tick") >= 10 }, "the leader to be running its tasks")

	// Another node takes the role; the marker row is written in the same statement, after the
	// new epoch holds the row.
	marker := queryInt(t, pool, `
WITH bump AS (
    UPDATE leaders SET node_id = 'other', incarnation = gen_random_uuid(), epoch = epoch + 1,
           acquired_at = now(), renewed_at = now(), lease_until = now() + interval '1 minute'
    WHERE role = 'maintenance' RETURNING epoch
)
INSERT INTO maintenance_runs (role, task, node_id, epoch) SELECT 'maintenance', 'takeover', 'other', epoch FROM bump
RETURNING id`)

	waitFor(t, 5*time.Second, func() bool { return termEnded(term) }, "the old term to end")
	waitFor(t, 5*time.Second, func() bool {
		return a.metric(t, "harmonia_ci_leader_fenced_writes_total", "role", cluster.RoleMaintenance) >= 1 ||
			a.metric(t, "harmonia_ci_leader_step_downs_total", "role", cluster.RoleMaintenance, "kind", "lost") >= 1
	}, "the old leader to notice")
	if n := queryInt(t, pool, `SELECT count(*) FROM maintenance_runs WHERE epoch = $1 AND id > $2`, term.Epoch, marker); n != 0 {
		t.Fatalf("%d writes of epoch %d landed after epoch %d began", n, term.Epoch, term.Epoch+1)
	}
}

// A task's Prepare runs first; the write it returns runs fenced and is recorded; a nil write
// records nothing.
func TestMaintainerPrepareThenFencedWrite(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	var prepared, wrote atomic.Int64
	task := cluster.Task{Name: "two-step", Interval: 5 * time.Millisecond,
		Prepare: func(ctx context.Context) (func(context.Context, pgx.Tx) (int64, error), error) {
			if prepared.Add(1)%2 == 0 {
				return nil, nil // nothing to write this time
			}
			return func(ctx context.Context, tx pgx.Tx) (int64, error) {
				wrote.Add(1)
				return 1, nil
			}, nil
		}}
	maint := cluster.NewMaintainer(pool, []cluster.Task{task}, discardLogger(), clock.Real{})
	a := startTestNode(t, pool, "node-a", slowConfig(), maint.Lead)
	a.firstTerm(t, 5*time.Second)
	waitFor(t, 5*time.Second, func() bool { return runCount(t, pool, "two-step") >= 3 }, "recorded runs")
	a.Stop()
	runs, w, p := int64(runCount(t, pool, "two-step")), wrote.Load(), prepared.Load()
	// A write cut off by Stop may not have committed; every recorded run had a write.
	if runs > w || w > (p+1)/2 {
		t.Errorf("%d runs recorded, %d fenced writes, %d prepares: a nil write must record nothing", runs, w, p)
	}
}
