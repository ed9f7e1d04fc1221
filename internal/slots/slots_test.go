package slots_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/slots"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

// fakeQueue hands out claims 0..n-1 and records what happened to them.
type fakeQueue struct {
	mu       sync.Mutex
	next, n  int
	claims   []int // the n asked for, per claim
	released []int
	finish   map[int]chan struct{} // closed by the test to end a claim's run
	early    bool                  // runs free their slot before they end
	peak     int
	running  int
	onClaim  func()
}

func newFakeQueue(n int) *fakeQueue {
	q := &fakeQueue{n: n, finish: map[int]chan struct{}{}}
	for i := range n {
		q.finish[i] = make(chan struct{})
	}
	return q
}

func (q *fakeQueue) claim(_ context.Context, n int) ([]int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.claims = append(q.claims, n)
	var got []int
	for ; n > 0 && q.next < q.n; n-- {
		got = append(got, q.next)
		q.next++
	}
	if q.onClaim != nil {
		q.onClaim()
	}
	return got, nil
}

func (q *fakeQueue) run(ctx context.Context, c int, free func()) {
	q.mu.Lock()
	q.running++
	q.peak = max(q.peak, q.running)
	q.mu.Unlock()
	if q.early {
		q.mu.Lock()
		q.running--
		q.mu.Unlock()
		free()
	}
	select {
	case <-q.finish[c]:
	case <-ctx.Done():
	}
	if !q.early {
		q.mu.Lock()
		q.running--
		q.mu.Unlock()
	}
}

func (q *fakeQueue) release(c int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.released = append(q.released, c)
}

func (q *fakeQueue) claimed() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.next
}

// TestRunner: the runner never runs more than Slots claims, fills a freed slot at once (the
// poll timer is an hour away), stops claiming once the gate closes, and hands back a claim the
// gate refused.
func TestRunner(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		slots int
		jobs  int
		early bool
	}{
		{name: "one slot", slots: 1, jobs: 4},
		{name: "three slots", slots: 3, jobs: 7},
		{name: "slots freed early", slots: 2, jobs: 5, early: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			q := newFakeQueue(tt.jobs)
			q.early = tt.early
			gate := &cluster.InFlight{}
			r := slots.New(slots.Config[int]{
				Slots: tt.slots, PollInterval: time.Hour, Gate: gate,
				Claim: q.claim, Run: q.run, Release: q.release,
			}, clock.Real{})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); r.Loop(ctx, nil) }()
			t.Cleanup(func() { cancel(); <-done })

			if tt.early {
				// Every run frees its slot at once: everything is claimed while all still run.
				waittest.For(t, 10*time.Second, func() bool { return q.claimed() == tt.jobs }, "all %d claimed", tt.jobs)
				if got := gate.Count(); got != tt.jobs {
					t.Errorf("gate holds %d, want %d: runs hold it until they return", got, tt.jobs)
				}
			} else {
				for i := range tt.jobs {
					want := min(i+tt.slots, tt.jobs)
					waittest.For(t, 10*time.Second, func() bool { return q.claimed() == want && r.Running() == want-i },
						"%d claimed and %d running", want, want-i)
					close(q.finish[i])
				}
				waittest.For(t, 10*time.Second, func() bool { return r.Running() == 0 }, "all finished")
				q.mu.Lock()
				if q.peak > tt.slots {
					t.Errorf("%d ran at once, want at most %d", q.peak, tt.slots)
				}
				q.mu.Unlock()
			}
			cancel()
			<-done
			if got := gate.Count(); got != 0 {
				t.Errorf("gate holds %d after Loop returned, want 0", got)
			}
		})
	}
}

// TestRunnerGate: a closed gate stops claims; a claim made as it closed is handed back.
func TestRunnerGate(t *testing.T) {
	t.Parallel()
	q := newFakeQueue(3)
	gate := &cluster.InFlight{}
	q.onClaim = gate.Close // the node drains while the claim is in flight
	r := slots.New(slots.Config[int]{
		Slots: 2, PollInterval: time.Millisecond, Gate: gate,
		Claim: q.claim, Run: q.run, Release: q.release,
	}, clock.Real{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Loop(ctx, nil) }()
	defer func() { cancel(); <-done }()
	waittest.For(t, 10*time.Second, func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return len(q.released) == 2
	}, "both claims handed back")
	// The poll timer fires every millisecond: a runner that claimed past the closed gate would
	// do so within the window.
	waittest.Hold(t, 50*time.Millisecond, func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		if len(q.claims) != 1 {
			t.Fatalf("%d claims, want 1: nothing is claimed once the gate is closed", len(q.claims))
		}
	})
	if r.Running() != 0 {
		t.Errorf("Running() = %d, want 0", r.Running())
	}
}
