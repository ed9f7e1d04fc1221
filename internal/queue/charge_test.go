package queue_test

import (
	"bytes"
	"context"
	"math"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	qt "github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// consumedSeconds reads a project's consumed builder time.
func consumedSeconds(t testing.TB, pool *pgxpool.Pool, project int64) float64 {
	t.Helper()
	var s float64
	if err := pool.QueryRow(context.Background(), `SELECT consumed_seconds FROM projects WHERE id = $1`, project).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestChargerFlush: recorded builder time reaches each project once, in one flush; time without
// a project, or of no length, is not recorded.
func TestChargerFlush(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := qt.Ctx(t, 30*time.Second)
	a, b := qt.NewProject(t, pool, "a", 100), qt.NewProject(t, pool, "b", 100)
	var c queue.Charger
	c.Add(&a, 1.5)
	c.Add(&b, 2)
	c.Add(&a, 0.25)
	c.Add(nil, 100)
	c.Add(&b, 0)
	c.Add(&b, -3)
	for range 2 { // the second flush has nothing left to write
		if err := c.Flush(ctx, pool); err != nil {
			t.Fatalf("Flush: %v", err)
		}
		if got := []float64{consumedSeconds(t, pool, a), consumedSeconds(t, pool, b)}; got[0] != 1.75 || got[1] != 2 {
			t.Fatalf("consumed seconds %v, want [1.75 2]", got)
		}
	}
}

// TestWorkerChargesOnceWhenStoppedMidFlush: a worker stopped while its periodic charge is in
// flight must not charge the same builder time again in its final flush.
//
// The race, made deterministic: the charge statement reaches the server and commits, and its
// reply is held back while Stop is called. Had Stop cancelled the flush, pgx would report the
// cancellation as the statement's error although the charge was applied, and the final flush
// would write it again (seen in about one run in ten of TestFairShareBetweenProjects before the
// fix).
func TestWorkerChargesOnceWhenStoppedMidFlush(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDB(t)
	observer, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(observer.Close)
	project := qt.NewProject(t, observer, "p", 100)
	qt.Enqueue(t, observer, &project, qt.Drv("job", sys))

	// The worker's pool: statements go as simple queries (their text is on the wire), and the
	// reply to the charge is held back until the test releases it.
	gate := newReplyGate("UPDATE projects p SET consumed_seconds")
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	cfg.ConnConfig.DialFunc = gate.dial
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	t.Cleanup(gate.release) // never leave a read blocked

	w := startWorker(t, pool, queue.WorkerConfig{
		Claimer: claimer("worker"), PollInterval: time.Minute, ChargeInterval: 200 * time.Millisecond, Handler: noop,
	})
	qt.WaitFor(t, 10*time.Second, func() bool { return consumedSeconds(t, observer, project) > 0 },
		"the worker's charge to be applied (its reply is held)")
	stopped := make(chan struct{})
	go func() { w.Stop(); close(stopped) }()
	// Stop must wait for the charge in flight rather than cancel it: a cancelled charge may
	// have committed and would then be kept and written again by the final flush.
	select {
	case <-stopped:
		t.Fatal("Stop returned while a charge was in flight")
	case <-gate.deadline:
		t.Fatal("Stop cancelled the charge in flight")
	case <-time.After(300 * time.Millisecond):
	}
	gate.release()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not return")
	}

	var took float64
	if err := observer.QueryRow(context.Background(), `
SELECT EXTRACT(EPOCH FROM finished_at - started_at) FROM build_jobs WHERE status = 'succeeded'`).Scan(&took); err != nil {
		t.Fatalf("the job did not succeed: %v", err)
	}
	if got := consumedSeconds(t, observer, project); math.Abs(got-took) > 1e-9 {
		t.Fatalf("project charged %.6fs for a job that took %.6fs (%.2f×): the charge whose reply Stop interrupted "+
			"was applied, kept as unsent, and flushed again", got, took, got/took)
	}
}

// replyGate holds back the server's reply on any connection that has sent a statement
// containing marker, until release; it reports when a deadline is set on such a connection.
type replyGate struct {
	marker   []byte
	open     chan struct{}
	once     sync.Once
	deadline chan struct{}
	dlOnce   sync.Once
}

func newReplyGate(marker string) *replyGate {
	return &replyGate{marker: []byte(marker), open: make(chan struct{}), deadline: make(chan struct{})}
}

func (g *replyGate) release() { g.once.Do(func() { close(g.open) }) }

func (g *replyGate) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &gatedConn{Conn: c, g: g}, nil
}

type gatedConn struct {
	net.Conn
	g    *replyGate
	mu   sync.Mutex
	held bool // sent the marked statement: hold its reply
}

func (c *gatedConn) Write(b []byte) (int, error) {
	if bytes.Contains(b, c.g.marker) {
		c.mu.Lock()
		c.held = true
		c.mu.Unlock()
	}
	return c.Conn.Write(b)
}

func (c *gatedConn) Read(b []byte) (int, error) {
	c.mu.Lock()
	held := c.held
	c.mu.Unlock()
	if held {
		<-c.g.open
	}
	return c.Conn.Read(b)
}

func (c *gatedConn) SetDeadline(t time.Time) error {
	c.noteDeadline(t)
	return c.Conn.SetDeadline(t)
}

func (c *gatedConn) SetReadDeadline(t time.Time) error {
	c.noteDeadline(t)
	return c.Conn.SetReadDeadline(t)
}

func (c *gatedConn) noteDeadline(t time.Time) {
	c.mu.Lock()
	held := c.held
	c.mu.Unlock()
	if held && !t.IsZero() {
		c.g.dlOnce.Do(func() { close(c.g.deadline) })
	}
}

// TestWorkerRecordedSuccess: a handler whose success is already recorded (the signer marks a
// job succeeded at build-complete) is not finished a second time, and its time is charged.
func TestWorkerRecordedSuccess(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	project := qt.NewProject(t, pool, "recorded", 100)
	qt.Enqueue(t, pool, &project, qt.Drv("recorded-job", sys))
	var finishes sync.WaitGroup
	finishes.Add(1)
	w := startWorker(t, pool, queue.WorkerConfig{
		Claimer: claimer("recorder"), MaxJobs: 1, PollInterval: 50 * time.Millisecond, ChargeInterval: 20 * time.Millisecond,
		Handler: func(ctx context.Context, job queue.Job) queue.Result {
			defer finishes.Done()
			time.Sleep(50 * time.Millisecond) // builder time to charge, not synchronisation
			if _, err := queue.Succeed(ctx, pool, job.Claim()); err != nil {
				return queue.Result{Err: err}
			}
			return queue.Result{Recorded: true}
		},
	})
	finishes.Wait()
	qt.WaitFor(t, 20*time.Second, func() bool { return consumedSeconds(t, pool, project) >= 0.05 }, "the build time to be charged")
	if s := qt.Status(t, pool, "recorded-job"); s != status.JobSucceeded {
		t.Fatalf("job %s, want succeeded", s)
	}
	w.Stop()
	if s := consumedSeconds(t, pool, project); s > 5 {
		t.Fatalf("charged %.2f s for a 50 ms build", s)
	}
}
