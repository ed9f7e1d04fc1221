package queue_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	qt "github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// attemptRow is a build_attempts row as the tests compare it.
type attemptRow struct {
	Attempt  int
	Node     string
	Status   status.AttemptStatus
	ExitCode *int
	Error    string
	LogKey   string
	Timed    bool // claimed_at and started_at are set, and finished_at is not before them
}

func attempts(t testing.TB, pool interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, jobID int64) []attemptRow {
	t.Helper()
	rows, err := pool.Query(qt.Ctx(t, 30*time.Second), `
SELECT attempt, COALESCE(node, ''), status, exit_code, COALESCE(error, ''), COALESCE(log_key, ''),
       claimed_at IS NOT NULL AND started_at IS NOT NULL AND finished_at >= started_at
FROM build_attempts WHERE job_id = $1 ORDER BY attempt`, jobID)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (attemptRow, error) {
		var a attemptRow
		err := row.Scan(&a.Attempt, &a.Node, &a.Status, &a.ExitCode, &a.Error, &a.LogKey, &a.Timed)
		return a, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func sameAttempts(a, b []attemptRow) bool {
	return slices.EqualFunc(a, b, func(x, y attemptRow) bool {
		return x.Attempt == y.Attempt && x.Node == y.Node && x.Status == y.Status && x.Error == y.Error &&
			x.LogKey == y.LogKey && x.Timed == y.Timed &&
			(x.ExitCode == nil) == (y.ExitCode == nil) && (x.ExitCode == nil || *x.ExitCode == *y.ExitCode)
	})
}

func ptr[T any](v T) *T { return &v }

// TestEveryAttemptIsRecorded: each way a claim ends (a transient failure, a release, a
// permanent failure, a rebuild's success, a lost node's release, a cancel) leaves one
// build_attempts row with its node, times, result, error and its own log, the latest log_url
// staying the job's.
func TestEveryAttemptIsRecorded(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := qt.Ctx(t, 30*time.Second)
	project := qt.NewProject(t, pool, "p", 100)
	qt.Enqueue(t, pool, &project, qt.Drv("a", sys), qt.Drv("b", sys), qt.Drv("c", sys))
	drv := qt.DrvPath("a")
	b1, b2 := claimer("b1"), claimer("b2")
	jobID := qt.Job(t, pool, "a").ID
	// Only a is claimable until the others are held.
	qt.Exec(t, pool, `UPDATE build_jobs SET priority = 10 WHERE drv_path = $1`, drv)

	// 1: a transient failure with its log: the job goes back to the queue.
	j := claimOne(t, pool, b1)
	if _, err := queue.Fail(ctx, pool, j.Claim(), queue.Failure{Kind: queue.Transient, ExitCode: ptr(100),
		Message: "out of disk", LogKey: queue.AttemptLogKey(drv, j.Attempt)}); err != nil {
		t.Fatal(err)
	}
	// 2: given back by a draining node.
	j = claimOne(t, pool, b2)
	if err := queue.Release(ctx, pool, j.Claim()); err != nil {
		t.Fatal(err)
	}
	// 3: a permanent failure, with its log.
	j = claimOne(t, pool, b1)
	if _, err := queue.Fail(ctx, pool, j.Claim(), queue.Failure{Kind: queue.Permanent, ExitCode: ptr(1),
		Message: "builder failed", LogKey: queue.AttemptLogKey(drv, j.Attempt)}); err != nil {
		t.Fatal(err)
	}
	// 4: rebuilt, then succeeded with its log.
	if n, err := queue.Rebuild(ctx, pool, jobID, queue.PriorityBoost); err != nil || n != 1 {
		t.Fatalf("Rebuild = %d, %v", n, err)
	}
	j = claimOne(t, pool, b2)
	b := &pgx.Batch{}
	var out queue.Outcome
	queue.QueueSucceed(b, j.Claim(), queue.AttemptLogKey(drv, j.Attempt), &out)
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	want := []attemptRow{
		{Attempt: 1, Node: "b1", Status: status.AttemptRetried, ExitCode: ptr(100), Error: "out of disk", LogKey: "log/" + qt.Hash("a") + "-a.drv.1", Timed: true},
		{Attempt: 2, Node: "b2", Status: status.AttemptInterrupted, Timed: true},
		{Attempt: 3, Node: "b1", Status: status.AttemptFailed, ExitCode: ptr(1), Error: "builder failed", LogKey: "log/" + qt.Hash("a") + "-a.drv.3", Timed: true},
		{Attempt: 4, Node: "b2", Status: status.AttemptSucceeded, ExitCode: ptr(0), LogKey: "log/" + qt.Hash("a") + "-a.drv.4", Timed: true},
	}
	if got := attempts(t, pool, jobID); !sameAttempts(got, want) {
		t.Fatalf("attempts of a:\n got %+v\nwant %+v", got, want)
	}
	if got := qt.Job(t, pool, "a"); got.Attempt != 4 {
		t.Fatalf("job a: attempt %d, want 4", got.Attempt)
	}
	// As `job show` lists them.
	info, err := queue.GetJob(ctx, pool, jobID)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Attempts) != len(want) {
		t.Fatalf("GetJob: %d attempts, want %d", len(info.Attempts), len(want))
	}
	for i, a := range info.Attempts {
		if w := want[i]; a.Attempt != w.Attempt || a.Node != w.Node || a.Status != w.Status || a.Error != w.Error ||
			a.LogKey != w.LogKey || a.StartedAt == nil || a.FinishedAt.Before(*a.StartedAt) {
			t.Errorf("GetJob: attempt %+v, want %+v", a, w)
		}
	}

	// A lost node's claims go back (its re-registration), and a cancel ends a running attempt;
	// an attempt that uploaded nothing does not take the previous attempt's log.
	qt.Exec(t, pool, `UPDATE build_jobs SET log_url = 'log/' || substring(drv_path FROM 12) || '.0' WHERE drv_path = $1`, qt.DrvPath("b"))
	jb := claimOne(t, pool, b1)
	inTx(t, pool, func(ctx context.Context, tx pgx.Tx) error { return queue.ReleaseNode(ctx, tx, "b1") })
	jc := claimOne(t, pool, b2)
	if jc.ID == jb.ID {
		jc = claimOne(t, pool, b2)
	}
	if err := queue.Cancel(ctx, pool, jc.ID); err != nil {
		t.Fatal(err)
	}
	if got, want := attempts(t, pool, jb.ID), []attemptRow{{Attempt: 1, Node: "b1", Status: status.AttemptInterrupted, Timed: true}}; !sameAttempts(got, want) {
		t.Fatalf("attempts of the released job: %+v, want %+v", got, want)
	}
	if got, want := attempts(t, pool, jc.ID), []attemptRow{{Attempt: jc.Attempt, Node: "b2", Status: status.AttemptCancelled, Timed: true}}; !sameAttempts(got, want) {
		t.Fatalf("attempts of the cancelled job: %+v, want %+v", got, want)
	}
}
