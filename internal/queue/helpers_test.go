package queue_test

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	qt "github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// sys is the system of fixture jobs unless a test needs another: the default of
// `harmonia-ci bench worker --systems`.
const sys = "x86_64-linux"

// claimer is a builder of sys with no features.
func claimer(node string) queue.Claimer {
	return queue.Claimer{NodeID: node, Systems: []string{sys}}
}

// claim claims up to limit jobs for c and checks ClaimJobs respects the limit.
func claim(t testing.TB, pool *pgxpool.Pool, c queue.Claimer, limit int) []queue.Job {
	t.Helper()
	jobs, err := queue.ClaimJobs(qt.Ctx(t, 30*time.Second), pool, c, limit)
	if err != nil {
		t.Fatalf("ClaimJobs(%s, %d): %v", c.NodeID, limit, err)
	}
	if len(jobs) > limit {
		t.Fatalf("ClaimJobs(%s, %d) returned %d jobs", c.NodeID, limit, len(jobs))
	}
	for _, j := range jobs {
		if j.NodeID != c.NodeID {
			t.Fatalf("claimed job %d carries node %q, want %q", j.ID, j.NodeID, c.NodeID)
		}
	}
	return jobs
}

// claimOne claims exactly one job and fails the test otherwise.
func claimOne(t testing.TB, pool *pgxpool.Pool, c queue.Claimer) queue.Job {
	t.Helper()
	jobs := claim(t, pool, c, 1)
	if len(jobs) != 1 {
		t.Fatalf("%s claimed %d jobs, want 1", c.NodeID, len(jobs))
	}
	return jobs[0]
}

func succeed(t testing.TB, pool *pgxpool.Pool, j queue.Job) queue.Outcome {
	t.Helper()
	out, err := queue.Succeed(qt.Ctx(t, 30*time.Second), pool, j.Claim())
	if err != nil {
		t.Fatalf("Succeed(%s): %v", j.Claim(), err)
	}
	return out
}

func fail(t testing.TB, pool *pgxpool.Pool, j queue.Job, kind queue.FailKind) queue.Outcome {
	t.Helper()
	code := 1
	out, err := queue.Fail(qt.Ctx(t, 30*time.Second), pool, j.Claim(), queue.Failure{Kind: kind, ExitCode: &code})
	if err != nil {
		t.Fatalf("Fail(%s): %v", j.Claim(), err)
	}
	return out
}

// startNotifier starts a notifier on pool, stopped at the end of the test, and waits until its
// LISTEN session is up.
func startNotifier(t testing.TB, pool *pgxpool.Pool, cfg notify.Config) *notify.Notifier {
	t.Helper()
	n := notify.New(cfg, pool, qt.Logger(), clock.Real{})
	t.Cleanup(n.Stop)
	if err := n.Start(context.Background()); err != nil {
		t.Fatalf("start notifier: %v", err)
	}
	qt.WaitFor(t, 10*time.Second, n.Connected, "the notifier to connect")
	return n
}

// payloads collects the build_jobs notifications a subscription receives.
type payloads struct {
	mu  sync.Mutex
	got []map[string]string
}

// collect subscribes to build_jobs on n, waits until the LISTEN is in place, and gathers every
// notification until the test ends.
func collect(t testing.TB, n *notify.Notifier) *payloads {
	t.Helper()
	sub, err := n.Subscribe("build_jobs")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-sub.Resync:
	case <-time.After(10 * time.Second):
		t.Fatal("the build_jobs subscription was never LISTENed")
	}
	p := &payloads{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case note := <-sub.C:
				var m map[string]string
				if err := json.Unmarshal([]byte(note.Payload), &m); err != nil {
					m = map[string]string{"unparsable": note.Payload}
				}
				p.mu.Lock()
				p.got = append(p.got, m)
				p.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done; sub.Close() })
	return p
}

// withStatus returns the fixture names of notifications carrying status st, sorted.
func (p *payloads) withStatus(st status.JobStatus) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var names []string
	for _, m := range p.got {
		if m["status"] == string(st) && m["drv_path"] != "" {
			names = append(names, qt.NameOf(m["drv_path"]))
		}
	}
	slices.Sort(names)
	return names
}

// jobStatuses maps fixture names to job statuses.
func jobStatuses(t testing.TB, pool *pgxpool.Pool, names ...string) map[string]status.JobStatus {
	t.Helper()
	m := map[string]status.JobStatus{}
	for _, n := range names {
		m[n] = qt.Status(t, pool, n)
	}
	return m
}

// auditReadiness runs the audit query of the audit-readiness task outside any fence, in a
// transaction that is rolled back: it reports the jobs whose maintained count is wrong without
// fixing them.
func auditReadiness(t testing.TB, pool *pgxpool.Pool) int64 {
	t.Helper()
	task := qt.Task(t, queue.MaintenanceTasks(queue.MaintenanceConfig{}, qt.Logger()), "audit-readiness")
	ctx := qt.Ctx(t, 30*time.Second)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	n, err := task.Run(ctx, tx)
	if err != nil {
		t.Fatalf("audit readiness: %v", err)
	}
	return n
}

// inTx runs fn in a committed transaction.
func inTx(t testing.TB, pool *pgxpool.Pool, fn func(ctx context.Context, tx pgx.Tx) error) {
	t.Helper()
	ctx := qt.Ctx(t, 30*time.Second)
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return fn(ctx, tx) }); err != nil {
		t.Fatal(err)
	}
}

// startWorker starts a queue worker (logging warnings to the test), stopped at the end of the
// test.
func startWorker(t testing.TB, pool *pgxpool.Pool, cfg queue.WorkerConfig) *queue.Worker {
	t.Helper()
	w, err := queue.NewWorker(cfg, pool, qt.TestLogger(t), clock.Real{})
	if err != nil {
		t.Fatalf("NewWorker: %v", err)
	}
	if err := w.Start(context.Background()); err != nil {
		t.Fatalf("start worker: %v", err)
	}
	t.Cleanup(w.Stop)
	return w
}
