package notify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

const wait = time.Second

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// newNotifier builds a notifier on a fresh database, stopped in t.Cleanup.
func newNotifier(t *testing.T, cfg Config) (*Notifier, *pgxpool.Pool) {
	t.Helper()
	pool := dbtest.NewPool(t)
	n := New(cfg, pool, testLogger(t), clock.Real{})
	t.Cleanup(n.Stop)
	return n, pool
}

func start(t *testing.T, n *Notifier) {
	t.Helper()
	if err := n.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
}

func subscribe(t *testing.T, n *Notifier, channel string) *Sub {
	t.Helper()
	s, err := n.Subscribe(channel)
	if err != nil {
		t.Fatalf("Subscribe(%q): %v", channel, err)
	}
	t.Cleanup(s.Close)
	return s
}

func pgNotify(t *testing.T, pool *pgxpool.Pool, channel, payload string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), "SELECT pg_notify($1, $2)", channel, payload); err != nil {
		t.Fatalf("pg_notify(%s, %s): %v", channel, payload, err)
	}
}

func waitResync(t *testing.T, s *Sub, what string) {
	t.Helper()
	select {
	case <-s.Resync:
	case <-time.After(5 * wait):
		t.Fatalf("%s: no Resync", what)
	}
}

func noResync(t *testing.T, s *Sub, what string) {
	t.Helper()
	select {
	case <-s.Resync:
		t.Fatalf("%s: unexpected Resync", what)
	default:
	}
}

func recv(t *testing.T, s *Sub, want Notification) {
	t.Helper()
	select {
	case got := <-s.C:
		if got != want {
			t.Fatalf("received %+v, want %+v", got, want)
		}
	case <-time.After(wait):
		t.Fatalf("no notification %+v within %v", want, wait)
	}
}

func nothing(t *testing.T, s *Sub, d time.Duration) {
	t.Helper()
	if d == 0 {
		select {
		case got, ok := <-s.C:
			t.Fatalf("unexpected notification %+v (open %v)", got, ok)
		default:
		}
		return
	}
	select {
	case got := <-s.C:
		t.Fatalf("unexpected notification %+v", got)
	case <-time.After(d):
	}
}

func TestFanOut(t *testing.T) {
	t.Parallel()
	n, pool := newNotifier(t, Config{})
	a1 := subscribe(t, n, "build_jobs")
	a2 := subscribe(t, n, "build_jobs")
	e := subscribe(t, n, "evaluations")
	start(t, n)
	for i, s := range []*Sub{a1, a2, e} {
		waitResync(t, s, fmt.Sprintf("initial connect, sub %d", i))
	}
	if !n.Connected() || n.Reconnects() != 0 || n.BackendPID() == 0 {
		t.Fatalf("Connected=%v Reconnects=%d BackendPID=%d after the first connect", n.Connected(), n.Reconnects(), n.BackendPID())
	}

	pgNotify(t, pool, "build_jobs", "x")
	recv(t, a1, Notification{"build_jobs", "x"})
	recv(t, a2, Notification{"build_jobs", "x"})
	nothing(t, e, 200*time.Millisecond)

	pgNotify(t, pool, "evaluations", "y")
	recv(t, e, Notification{"evaluations", "y"})
	nothing(t, a1, 0)
	nothing(t, a2, 0)
}

func TestOneListenBackend(t *testing.T) {
	t.Parallel()
	n, pool := newNotifier(t, Config{})
	var subs []*Sub
	for _, ch := range []string{"build_jobs", "build_jobs", "evaluations", "build_log", "leaders"} {
		subs = append(subs, subscribe(t, n, ch))
	}
	start(t, n)
	for _, s := range subs {
		waitResync(t, s, "initial connect")
	}
	subscribe(t, n, "nodes")
	subscribe(t, n, "leaders")

	rows, err := pool.Query(context.Background(), `
		SELECT pid FROM pg_stat_activity
		WHERE application_name = 'harmonia-ci listen' AND datname = current_database()`)
	if err != nil {
		t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	if len(pids) != 1 || uint32(pids[0]) != n.BackendPID() {
		t.Fatalf("LISTEN backends %v, want exactly [%d]", pids, n.BackendPID())
	}
}

func TestSubscribeAfterStart(t *testing.T) {
	t.Parallel()
	// No ping tick may rescue a late LISTEN: the new subscription must interrupt the wait.
	n, pool := newNotifier(t, Config{PingInterval: time.Minute})
	first := subscribe(t, n, "build_jobs")
	start(t, n)
	waitResync(t, first, "initial connect")

	late := subscribe(t, n, "leaders")
	// LISTEN happened before Subscribe returned: notify at once, without waiting for anything.
	pgNotify(t, pool, "leaders", "elected")
	recv(t, late, Notification{"leaders", "elected"})
	// A subscription made while connected gets its initial Resync too.
	waitResync(t, late, "late subscription")
	noResync(t, first, "existing subscriber")

	// A second subscriber on an already LISTENed channel needs no round trip.
	late2 := subscribe(t, n, "leaders")
	waitResync(t, late2, "second late subscription")
	pgNotify(t, pool, "leaders", "again")
	recv(t, late, Notification{"leaders", "again"})
	recv(t, late2, Notification{"leaders", "again"})
}

func TestSubscribeBeforeConnectWhileRunning(t *testing.T) {
	t.Parallel()
	n, pool := newNotifier(t, Config{})
	start(t, n)
	// Probably before the first connect completes; either way it is LISTENed and told.
	s := subscribe(t, n, "evaluations")
	waitResync(t, s, "subscription")
	pgNotify(t, pool, "evaluations", "1")
	recv(t, s, Notification{"evaluations", "1"})
}

func TestReconnect(t *testing.T) {
	t.Parallel()
	n, pool := newNotifier(t, Config{MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	s := subscribe(t, n, "build_jobs")
	other := subscribe(t, n, "evaluations")
	start(t, n)
	waitResync(t, s, "initial connect")
	waitResync(t, other, "initial connect")
	pid := n.BackendPID()

	var ok bool
	if err := pool.QueryRow(context.Background(), "SELECT pg_terminate_backend($1)", int32(pid)).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
	}
	waitResync(t, s, "reconnect")
	waitResync(t, other, "reconnect")
	if !n.Connected() {
		t.Fatal("not connected after the reconnect Resync")
	}
	if got := n.Reconnects(); got != 1 {
		t.Fatalf("Reconnects = %d, want 1", got)
	}
	if got := n.BackendPID(); got == 0 || got == pid {
		t.Fatalf("BackendPID = %d after reconnect (old %d)", got, pid)
	}
	pgNotify(t, pool, "build_jobs", "after")
	// A notification sent while disconnected may or may not arrive; none was sent here, so the
	// first one must be ours.
	recv(t, s, Notification{"build_jobs", "after"})
	pgNotify(t, pool, "evaluations", "after")
	recv(t, other, Notification{"evaluations", "after"})
}

func TestOverflow(t *testing.T) {
	t.Parallel()
	n, pool := newNotifier(t, Config{})
	stuck := subscribe(t, n, "build_log")
	reader := subscribe(t, n, "build_log")
	start(t, n)
	waitResync(t, stuck, "initial connect")
	waitResync(t, reader, "initial connect")

	// Drain reader continuously, so only stuck overflows.
	got := make(chan Notification, 1000)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case m := <-reader.C:
				got <- m
			case <-done:
				return
			}
		}
	}()
	t.Cleanup(func() { close(done); wg.Wait() })

	// Distinct payloads: PostgreSQL folds identical notifications within a transaction.
	if _, err := pool.Exec(context.Background(),
		"SELECT pg_notify('build_log', i::text) FROM generate_series(1, $1::int) i", BufferSize+10); err != nil {
		t.Fatal(err)
	}
	waitResync(t, stuck, "overflow")
	if l := len(stuck.C); l != BufferSize {
		t.Fatalf("stuck subscriber holds %d notifications, want %d", l, BufferSize)
	}

	// The loop is not blocked: the other subscriber still gets a later notification.
	pgNotify(t, pool, "build_log", "later")
	deadline := time.After(2 * wait)
	for {
		select {
		case m := <-got:
			if m.Payload == "later" {
				goto delivered
			}
		case <-deadline:
			t.Fatal("reader never got the later notification")
		}
	}
delivered:
	// The stuck subscriber keeps its first 64, in order, and dropped the rest.
	for i := 1; i <= BufferSize; i++ {
		recv(t, stuck, Notification{"build_log", fmt.Sprint(i)})
	}
	n.mu.Lock()
	dropped := stuck.dropped
	n.mu.Unlock()
	if dropped < 10 {
		t.Fatalf("dropped = %d, want >= 10", dropped)
	}
}

func TestLifecycle(t *testing.T) {
	t.Parallel()
	n, pool := newNotifier(t, Config{})
	n.Stop() // before Start
	n.Stop()

	for _, bad := range []string{"", "Build_jobs", "1abc", "build-jobs", "a b", `a"b`, "a;", strings.Repeat("a", 64), "été"} {
		if _, err := n.Subscribe(bad); err == nil {
			t.Errorf("Subscribe(%q) accepted", bad)
		}
	}
	for _, good := range []string{"_", "a", "build_jobs", "x9", strings.Repeat("a", 63)} {
		s, err := n.Subscribe(good)
		if err != nil {
			t.Errorf("Subscribe(%q): %v", good, err)
			continue
		}
		s.Close()
		s.Close()
	}

	s := subscribe(t, n, "build_jobs")
	start(t, n)
	waitResync(t, s, "initial connect")
	n.Stop()
	n.Stop()
	if n.Connected() || n.BackendPID() != 0 {
		t.Fatalf("after Stop: Connected=%v BackendPID=%d", n.Connected(), n.BackendPID())
	}
	// C stays open (a closed channel would be readable).
	nothing(t, s, 0)
	// Subscribing while stopped neither blocks nor fails.
	s2 := subscribe(t, n, "evaluations")

	// And the notifier can start again.
	start(t, n)
	waitResync(t, s, "restart")
	waitResync(t, s2, "restart")
	pgNotify(t, pool, "evaluations", "z")
	recv(t, s2, Notification{"evaluations", "z"})
}

func TestNoPingNeeded(t *testing.T) {
	t.Parallel()
	n, pool := newNotifier(t, Config{PingInterval: time.Minute})
	s := subscribe(t, n, "build_jobs")
	start(t, n)
	waitResync(t, s, "initial connect")
	for i := range 3 {
		pgNotify(t, pool, "build_jobs", fmt.Sprint(i))
		recv(t, s, Notification{"build_jobs", fmt.Sprint(i)})
	}
}

func TestUnlistenLastSubscriber(t *testing.T) {
	t.Parallel()
	n, pool := newNotifier(t, Config{PingInterval: time.Minute})
	x1 := subscribe(t, n, "leaders")
	x2 := subscribe(t, n, "leaders")
	start(t, n)
	waitResync(t, x1, "initial connect")
	waitResync(t, x2, "initial connect")

	listened := func(ch string) bool {
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.listened[ch]
	}
	x1.Close()
	pgNotify(t, pool, "leaders", "still")
	recv(t, x2, Notification{"leaders", "still"})
	x2.Close()
	// Subscribing a new channel while connected returns after a reconcile pass that also saw
	// the Close, so the UNLISTEN is done by then.
	subscribe(t, n, "nodes")
	if listened("leaders") {
		t.Fatal("leaders still LISTENed after its last subscriber left")
	}
	if !listened("nodes") {
		t.Fatal("nodes not LISTENed after Subscribe returned")
	}

	// Subscribing again LISTENs again.
	x3 := subscribe(t, n, "leaders")
	pgNotify(t, pool, "leaders", "back")
	recv(t, x3, Notification{"leaders", "back"})
}

func TestConcurrentSubscribers(t *testing.T) {
	t.Parallel()
	n, pool := newNotifier(t, Config{PingInterval: 20 * time.Millisecond})
	start(t, n)
	channels := []string{"a", "b", "c", "d"}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 30 {
				s, err := n.Subscribe(channels[(g+i)%len(channels)])
				if err != nil {
					t.Error(err)
					return
				}
				if i%3 == 0 {
					_, _ = pool.Exec(context.Background(), "SELECT pg_notify($1, 'p')", channels[i%len(channels)])
				}
				s.Close()
			}
		})
	}
	wg.Wait()
	s := subscribe(t, n, "a")
	waitResync(t, s, "subscription")
	pgNotify(t, pool, "a", "final")
	for {
		select {
		case m := <-s.C:
			if m.Payload == "final" {
				return
			}
		case <-time.After(wait):
			t.Fatal("no final notification")
		}
	}
}

// TestCancelledWaitKeepsSession pins the pgx behaviour the design relies on: cancelling
// WaitForNotification (deadline context watcher) leaves the session usable, whereas cancelling
// a running statement closes it.
func TestCancelledWaitKeepsSession(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	n := New(Config{}, pool, testLogger(t), clock.Real{})
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, n.connConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer closeConn(conn)
	if _, err := conn.Exec(ctx, "LISTEN build_jobs"); err != nil {
		t.Fatal(err)
	}

	for _, cancelKind := range []string{"cancel", "deadline"} {
		var wctx context.Context
		var cancel context.CancelFunc
		if cancelKind == "cancel" {
			wctx, cancel = context.WithCancel(ctx)
			time.AfterFunc(50*time.Millisecond, cancel) // while the wait blocks in a read
		} else {
			wctx, cancel = context.WithTimeout(ctx, 50*time.Millisecond)
		}
		pn, err := conn.WaitForNotification(wctx)
		cancel()
		if pn != nil || err == nil {
			t.Fatalf("%s: WaitForNotification = %v, %v; want an error", cancelKind, pn, err)
		}
		if cancelKind == "cancel" && !errors.Is(err, context.Canceled) {
			t.Fatalf("cancel: error %v, want context.Canceled", err)
		}
		if cancelKind == "deadline" && !pgconn.Timeout(err) {
			t.Fatalf("deadline: error %v, want a pgconn timeout", err)
		}
		if conn.IsClosed() {
			t.Fatalf("%s: session closed by a cancelled wait", cancelKind)
		}
		if err := conn.Ping(ctx); err != nil {
			t.Fatalf("%s: ping after cancelled wait: %v", cancelKind, err)
		}
		pgNotify(t, pool, "build_jobs", cancelKind)
		tctx, tcancel := context.WithTimeout(ctx, wait)
		pn, err = conn.WaitForNotification(tctx)
		tcancel()
		if err != nil || pn.Channel != "build_jobs" || pn.Payload != cancelKind {
			t.Fatalf("%s: notification after cancelled wait = %+v, %v", cancelKind, pn, err)
		}
	}

	// Contrast: a cancelled statement closes the session (hence: a timed-out ping or LISTEN
	// means reconnect).
	sctx, scancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = conn.Exec(sctx, "SELECT pg_sleep(10)")
	scancel()
	if err == nil || !conn.IsClosed() {
		t.Fatalf("cancelled statement: err %v, closed %v; want an error and a closed session", err, conn.IsClosed())
	}
}
