package queue_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	qt "github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

func noop(context.Context, queue.Job) queue.Result { return queue.Result{} }

// count counts build jobs with status (and, if node is not empty, claimed by node).
func count(t testing.TB, pool *pgxpool.Pool, st status.JobStatus, node string) int64 {
	t.Helper()
	return qt.QueryInt(t, pool, `SELECT count(*) FROM build_jobs WHERE status = $1 AND ($2 = '' OR claimed_by = $2)`, st, node)
}

// independent returns n derivations without inputs called prefix-0 … prefix-(n-1).
func independent(prefix string, n int) []queue.Derivation {
	var ds []queue.Derivation
	for i := range n {
		ds = append(ds, qt.Drv(fmt.Sprintf("%s-%d", prefix, i), sys))
	}
	return ds
}

// TestWorkerCatchesUpAfterListenerKilled: the worker's LISTEN session is killed and jobs are
// enqueued while it is down, so their notifications are lost; with a one-minute poll interval
// the worker still builds them all promptly, by catching up when the notifier reconnects.
//
// A wake-up from before the kill (a notification of the warm-up delivered late, the resync of
// the first LISTEN) can start a claim that waits on the enqueue's lock and takes the new jobs
// before the notifier is back. Then the round proves nothing about catching up: it is told
// apart (the jobs were claimed while the notifier was down) and played again.
func TestWorkerCatchesUpAfterListenerKilled(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t, 12)
	// A fixed reconnect delay of ~2s leaves room to enqueue while the session is down.
	n := startNotifier(t, pool, notify.Config{MinBackoff: 2 * time.Second, MaxBackoff: 2 * time.Second})
	var mu sync.Mutex
	var round string
	var early bool // a job of this round was claimed while the notifier was down
	w := startWorker(t, pool, queue.WorkerConfig{
		Claimer: claimer("worker"), MaxJobs: 4, PollInterval: time.Minute, Notifier: n, Handler: noop,
		ChargeInterval: time.Hour, // no charge writes to compete with the claims it watches
		ClaimFunc: func(_ time.Duration, jobs []queue.Job) {
			mu.Lock()
			defer mu.Unlock()
			for _, j := range jobs {
				if round != "" && strings.Contains(j.DrvPath, "-"+round+"-") && !n.Connected() {
					early = true
				}
			}
		},
	})
	qt.Enqueue(t, pool, nil, qt.Drv("warm-up", sys))
	qt.WaitFor(t, 20*time.Second, func() bool { return qt.Status(t, pool, "warm-up") == status.JobSucceeded }, "the worker to build a job")
	built := int64(1)
	for attempt := 1; ; attempt++ {
		qt.WaitFor(t, 20*time.Second, func() bool { return w.Running() == 0 && n.Connected() }, "the worker to be idle and listening")
		reconnects := n.Reconnects()
		pid := n.BackendPID()
		if pid == 0 {
			t.Fatal("the notifier has no LISTEN session")
		}
		var killed bool
		if err := pool.QueryRow(qt.Ctx(t, 10*time.Second), `SELECT pg_terminate_backend($1)`, int32(pid)).Scan(&killed); err != nil || !killed {
			t.Fatalf("terminate the LISTEN session %d: %v, %v", pid, killed, err)
		}
		qt.WaitFor(t, 20*time.Second, func() bool { return !n.Connected() }, "the notifier to notice its session is gone")
		// A chain and some independent jobs, enqueued in the gap.
		r := fmt.Sprintf("r%d", attempt)
		mu.Lock()
		round, early = r, false
		mu.Unlock()
		ds := append(independent("gap-"+r, 10), qt.Drv("chain-"+r+"-0", sys), qt.Drv("chain-"+r+"-1", sys, "chain-"+r+"-0"),
			qt.Drv("chain-"+r+"-2", sys, "chain-"+r+"-1"))
		qt.Enqueue(t, pool, nil, ds...)
		if n.Connected() || n.Reconnects() != reconnects {
			t.Fatal("setup: the notifier reconnected before the enqueue committed; its notification was not lost")
		}
		start := time.Now()
		built += int64(len(ds))
		qt.WaitFor(t, 15*time.Second, func() bool { return count(t, pool, status.JobSucceeded, "worker") == built },
			"the jobs enqueued while the listener was down to be built (poll interval 1m)")
		mu.Lock()
		stray := early
		mu.Unlock()
		if stray && attempt < 5 {
			t.Logf("round %d: a wake-up from before the kill claimed the new jobs; again", attempt)
			continue
		}
		if stray {
			t.Fatal("five rounds in a row, a wake-up from before the kill claimed the new jobs")
		}
		t.Logf("built %d jobs enqueued during the gap %s after the enqueue", len(ds), time.Since(start))
		if n.Reconnects() != reconnects+1 {
			t.Fatalf("reconnects = %d, want %d", n.Reconnects(), reconnects+1)
		}
		return
	}
}

// TestWorkerWakesWhenInputSucceeds: an idle worker with a one-minute poll interval claims a job
// promptly when another node's worker finishes its input: the success's announcement wakes it.
// Without a notifier (the control) the job waits for the poll.
func TestWorkerWakesWhenInputSucceeds(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		notifier bool
	}{{"woken by the notification", true}, {"control: polling only", false}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := dbtest.NewPool(t)
			// The input builds on another system, so only the other node can take it, and only
			// the idle worker can take the dependent.
			const inputSystem = "input-linux"
			qt.Enqueue(t, pool, nil, qt.Drv("input", inputSystem), qt.Drv("dependent", sys, "input"))
			finishInput := make(chan struct{})
			startWorker(t, pool, queue.WorkerConfig{
				Claimer: queue.Claimer{NodeID: "other-node", Systems: []string{inputSystem}}, PollInterval: 50 * time.Millisecond,
				Handler: func(ctx context.Context, _ queue.Job) queue.Result {
					select {
					case <-finishInput:
					case <-ctx.Done():
					}
					return queue.Result{}
				},
			})
			qt.WaitFor(t, 20*time.Second, func() bool { return count(t, pool, status.JobBuilding, "other-node") == 1 }, "the other node to build the input")

			var n *notify.Notifier
			idleAfter := int64(1) // claims the worker makes at start: one, plus one on the first Resync
			if tc.notifier {
				n = startNotifier(t, pool, notify.Config{})
				idleAfter = 2
			}
			var claims atomic.Int64
			claimedAt := make(chan time.Time, 1)
			startWorker(t, pool, queue.WorkerConfig{
				Claimer: claimer("idle-worker"), MaxJobs: 1, PollInterval: time.Minute, Notifier: n, Handler: noop,
				// The loop also wakes (and claims) to flush charges: with the default 1s that
				// would claim the job within the 2s bound without any notification.
				ChargeInterval: time.Hour,
				ClaimFunc: func(_ time.Duration, jobs []queue.Job) {
					claims.Add(1)
					if len(jobs) > 0 {
						claimedAt <- time.Now()
					}
				},
			})
			qt.WaitFor(t, 20*time.Second, func() bool { return claims.Load() >= idleAfter }, "the worker to look for work and go idle")

			start := time.Now()
			close(finishInput)
			qt.WaitFor(t, 20*time.Second, func() bool { return qt.Status(t, pool, "input") == status.JobSucceeded }, "the input to succeed")
			if !tc.notifier {
				qt.Observe(t, time.Second, func() {
					if s := qt.Status(t, pool, "dependent"); s != status.JobPending {
						t.Fatalf("a polling-only worker with a 1m poll interval claimed the dependent (%s): the control is broken", s)
					}
				})
				return
			}
			select {
			case at := <-claimedAt:
				t.Logf("claimed %s after the input's build ended", at.Sub(start))
			case <-time.After(2 * time.Second):
				t.Fatalf("the idle worker did not claim the dependent within 2s of its input's success (poll interval 1m); status %s",
					qt.Status(t, pool, "dependent"))
			}
			qt.WaitFor(t, 20*time.Second, func() bool { return qt.Status(t, pool, "dependent") == status.JobSucceeded }, "the dependent to be built")
		})
	}
}

// TestDrainingWorkerClaimsNothing: a worker whose gate is closed (its node drains) claims
// nothing while ready jobs wait, whether it drained before starting or while building.
func TestDrainingWorkerClaimsNothing(t *testing.T) {
	t.Parallel()
	t.Run("gate closed before start", func(t *testing.T) {
		t.Parallel()
		pool := dbtest.NewPool(t)
		qt.Enqueue(t, pool, nil, independent("ready", 5)...)
		gate := &cluster.InFlight{}
		gate.Close()
		var claims atomic.Int64
		w := startWorker(t, pool, queue.WorkerConfig{
			Claimer: claimer("draining"), MaxJobs: 4, PollInterval: 50 * time.Millisecond, Gate: gate, Handler: noop,
			ClaimFunc: func(time.Duration, []queue.Job) { claims.Add(1) },
		})
		qt.Observe(t, 400*time.Millisecond, func() { // eight poll intervals
			if c, p := claims.Load(), count(t, pool, status.JobPending, ""); c != 0 || p != 5 || w.Running() != 0 {
				t.Fatalf("a draining worker claimed: %d claims, %d of 5 jobs still pending, %d running", c, p, w.Running())
			}
		})
		// The jobs were claimable all along.
		startWorker(t, pool, queue.WorkerConfig{Claimer: claimer("open"), MaxJobs: 4, PollInterval: 50 * time.Millisecond, Handler: noop})
		qt.WaitFor(t, 20*time.Second, func() bool { return count(t, pool, status.JobSucceeded, "open") == 5 }, "another worker to build the jobs")
	})
	t.Run("drains while building", func(t *testing.T) {
		t.Parallel()
		pool := dbtest.NewPool(t)
		qt.Enqueue(t, pool, nil, independent("ready", 5)...)
		gate := &cluster.InFlight{}
		finish := make(chan struct{})
		startWorker(t, pool, queue.WorkerConfig{
			Claimer: claimer("node"), MaxJobs: 1, PollInterval: 50 * time.Millisecond, Gate: gate,
			Handler: func(ctx context.Context, _ queue.Job) queue.Result {
				select {
				case <-finish:
				case <-ctx.Done():
				}
				return queue.Result{}
			},
		})
		qt.WaitFor(t, 20*time.Second, func() bool { return count(t, pool, status.JobBuilding, "node") == 1 }, "the worker to claim a job")
		drained := make(chan int, 1)
		go func() { drained <- gate.Wait(context.Background()) }() // the node starts draining
		qt.WaitFor(t, 20*time.Second, gate.Closed, "the gate to close")
		close(finish)
		if left := <-drained; left != 0 {
			t.Fatalf("drain ended with %d builds in flight", left)
		}
		qt.WaitFor(t, 20*time.Second, func() bool { return count(t, pool, status.JobSucceeded, "node") == 1 }, "the running build to finish")
		qt.Observe(t, 400*time.Millisecond, func() {
			if b, p := count(t, pool, status.JobBuilding, ""), count(t, pool, status.JobPending, ""); b != 0 || p != 4 {
				t.Fatalf("after draining: %d building, %d pending; want 0 and 4", b, p)
			}
		})
	})
}

// TestWorkerNeverExceedsMaxJobs: a worker with two slots whose builds block holds exactly two
// claims, and claims the next job only when a build finishes.
func TestWorkerNeverExceedsMaxJobs(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t, 8)
	const node = "two-slots"
	qt.Enqueue(t, pool, nil, independent("job", 6)...)
	finish := make(chan struct{})
	var finished atomic.Int64
	w := startWorker(t, pool, queue.WorkerConfig{
		Claimer: claimer(node), MaxJobs: 2, PollInterval: 50 * time.Millisecond,
		Handler: func(ctx context.Context, _ queue.Job) queue.Result {
			select {
			case <-finish:
				finished.Add(1)
			case <-ctx.Done():
			}
			return queue.Result{}
		},
	})

	// A sampler watches the node's claims for the whole test.
	var mu sync.Mutex
	var most int64
	var samples int
	ctx, cancel := context.WithCancel(context.Background())
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for ctx.Err() == nil {
			var n int64
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM build_jobs WHERE claimed_by = $1 AND status = 'building'`, node).Scan(&n); err == nil {
				mu.Lock()
				most, samples = max(most, n), samples+1
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}()

	qt.WaitFor(t, 20*time.Second, func() bool { return count(t, pool, status.JobBuilding, node) == 2 }, "two claims")
	qt.Observe(t, 400*time.Millisecond, func() { // eight poll intervals with both slots busy
		if b, p := count(t, pool, status.JobBuilding, node), count(t, pool, status.JobPending, ""); b != 2 || p != 4 || w.Running() > 2 {
			t.Fatalf("with both slots busy: %d building, %d pending, %d running; want 2, 4, ≤2", b, p, w.Running())
		}
	})
	finish <- struct{}{} // one build ends: one slot frees
	qt.WaitFor(t, 20*time.Second, func() bool {
		return count(t, pool, status.JobSucceeded, node) == 1 && count(t, pool, status.JobBuilding, node) == 2
	}, "the freed slot to be refilled")
	if p := count(t, pool, status.JobPending, ""); p != 3 {
		t.Fatalf("after one slot freed: %d pending, want 3 (exactly one more claimed)", p)
	}
	close(finish)
	qt.WaitFor(t, 10*time.Second, func() bool { return count(t, pool, status.JobSucceeded, node) == 6 }, "all jobs to be built")
	cancel()
	<-sampled
	if most > 2 || samples == 0 {
		t.Fatalf("the node held up to %d claims at once (%d samples), want at most 2", most, samples)
	}
	if finished.Load() != 6 {
		t.Fatalf("%d builds finished, want 6", finished.Load())
	}
}

// TestContinueFreesTheSlot: a handler that returns a continuation (the builder's upload and
// signing) frees its slot at once, so the next job is claimed while the first one's
// continuation still runs; the first job's result is the continuation's, and a draining node
// waits for it.
func TestContinueFreesTheSlot(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t, 8)
	const node = "one-slot"
	qt.Enqueue(t, pool, nil, independent("cont", 2)...)
	uploading := make(chan struct{})
	release := make(chan struct{})
	var continued atomic.Int64
	gate := &cluster.InFlight{}
	w := startWorker(t, pool, queue.WorkerConfig{
		Claimer: claimer(node), MaxJobs: 1, PollInterval: 50 * time.Millisecond, Gate: gate,
		Handler: func(ctx context.Context, job queue.Job) queue.Result {
			if !strings.HasSuffix(job.DrvPath, "cont-0.drv") {
				return queue.Result{}
			}
			return queue.Result{Continue: func(ctx context.Context) queue.Result {
				continued.Add(1)
				close(uploading)
				select {
				case <-release:
				case <-ctx.Done():
				}
				return queue.Result{Err: fmt.Errorf("upload refused"), Kind: queue.Permanent}
			}}
		},
	})
	<-uploading
	qt.WaitFor(t, 20*time.Second, func() bool { return qt.Status(t, pool, "cont-1") == status.JobSucceeded },
		"the second job to be built while the first one's continuation runs")
	if s := qt.Status(t, pool, "cont-0"); s != status.JobBuilding {
		t.Fatalf("the first job is %s while its continuation runs, want building", s)
	}
	if w.Running() != 0 {
		t.Fatalf("Running() = %d with only a continuation left, want 0", w.Running())
	}
	gate.Close()
	if n := gate.Count(); n != 1 {
		t.Fatalf("%d units in flight with a continuation running, want 1 (a drain waits for it)", n)
	}
	close(release)
	qt.WaitFor(t, 20*time.Second, func() bool { return qt.Status(t, pool, "cont-0") == status.JobFailed },
		"the continuation's result to be recorded")
	if left := gate.Wait(qt.Ctx(t, 20*time.Second)); left != 0 {
		t.Fatalf("the node did not drain after the continuation ended: %d in flight", left)
	}
	if continued.Load() != 1 {
		t.Fatalf("the continuation ran %d times, want 1", continued.Load())
	}
}

// TestWorkerStartTwice: a second Start neither subscribes again nor runs a second claim loop,
// and after Stop the worker's subscription is gone.
func TestWorkerStartTwice(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t, 4)
	n := startNotifier(t, pool, notify.Config{})
	var claims atomic.Int64
	w := startWorker(t, pool, queue.WorkerConfig{
		Claimer: claimer("twice"), PollInterval: time.Hour, Notifier: n, Handler: noop,
		ClaimFunc: func(time.Duration, []queue.Job) { claims.Add(1) },
	})
	// The loop claims at its start and again on the resync of its LISTEN.
	qt.WaitFor(t, 10*time.Second, func() bool { return n.Connected() && claims.Load() >= 2 }, "the first claims")
	base := claims.Load()
	if err := w.Start(context.Background()); err != nil {
		t.Fatalf("second Start: %v", err)
	}
	if got := n.Subscribers("build_jobs"); got != 1 {
		t.Errorf("%d build_jobs subscriptions after two Starts, want 1", got)
	}
	// A second loop would claim at once on its own start; the poll timer is an hour away.
	waittest.Hold(t, 200*time.Millisecond, func() {
		if got := claims.Load(); got != base {
			t.Fatalf("%d claims after the second Start, want %d", got, base)
		}
	})
	w.Stop()
	if got := n.Subscribers("build_jobs"); got != 0 {
		t.Errorf("%d build_jobs subscriptions after Stop, want 0", got)
	}
}
