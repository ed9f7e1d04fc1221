// Package slots is the claim loop the builder's worker and the evaluator share: N slots, a wait
// for a notification, a freed slot or a poll tick, then a claim for every free slot, each claim
// run in a slot of its own. What a claim is, how it is claimed, run, renewed and finished stays
// with the role; the guards that make those safe are in its SQL.
package slots

import (
	"context"
	"sync"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
)

// DefaultPollInterval is how often a Runner claims without a wake-up.
const DefaultPollInterval = 5 * time.Second

// Config configures a Runner of claims of type C.
type Config[C any] struct {
	// Slots is how many claims run at once. Default 1.
	Slots int
	// PollInterval: the runner claims at least this often even without a wake-up, the fallback
	// for a lost notification. Default DefaultPollInterval.
	PollInterval time.Duration
	// Gate admits claims; once it is closed (the node drains) nothing more is claimed. Each
	// running claim holds it until Run returns. Default: a gate of the runner's own.
	Gate *cluster.InFlight
	// Interested tells whether a notification can mean work this runner may claim; nil: every
	// one does.
	Interested func(payload string) bool
	// Claim claims at most n (n > 0). Fewer than n means nothing more is ready now.
	Claim func(ctx context.Context, n int) ([]C, error)
	// Claimed, if set, is told every claim's latency and result (logs, metrics); not a claim
	// that failed because ctx ended.
	Claimed func(latency time.Duration, claims []C, err error)
	// Run runs a claim in its slot; its context ends when the runner's does. It may call free
	// to give the slot up before it returns (work that is off the slot, like an upload): the
	// gate stays held until Run returns.
	Run func(ctx context.Context, c C, free func())
	// Release hands back a claim the gate refused (the node began draining meanwhile).
	Release func(c C)
}

// Runner keeps up to Slots claims running. Its zero value is not usable; see New.
type Runner[C any] struct {
	cfg   Config[C]
	clock clock.Clock
	wake  chan struct{}
	wg    sync.WaitGroup

	mu      sync.Mutex
	running int
}

// New returns a runner; Loop runs it. Claim, Run and Release are required.
func New[C any](cfg Config[C], clk clock.Clock) *Runner[C] {
	if cfg.Claim == nil || cfg.Run == nil || cfg.Release == nil {
		panic("slots: Claim, Run and Release are required")
	}
	cfg.Slots = max(cfg.Slots, 1)
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.Gate == nil {
		cfg.Gate = &cluster.InFlight{}
	}
	if clk == nil {
		clk = clock.Real{}
	}
	return &Runner[C]{cfg: cfg, clock: clk, wake: make(chan struct{}, 1)}
}

// Running is the number of claims holding a slot now.
func (r *Runner[C]) Running() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.running
}

// Loop claims until ctx ends, then waits for the running claims to return. It wakes on sub's
// notifications and resyncs (sub may be nil: polling only), on a freed slot and on the poll
// timer; the caller owns sub.
func (r *Runner[C]) Loop(ctx context.Context, sub *notify.Sub) {
	defer r.wg.Wait()
	var notes <-chan notify.Notification
	var resync <-chan struct{}
	if sub != nil {
		notes, resync = sub.C, sub.Resync
	}
	poll := r.clock.After(r.cfg.PollInterval)
	claim := true
	for {
		if claim {
			r.fill(ctx)
		}
		claim = true
		select {
		case <-ctx.Done():
			return
		case n := <-notes:
			claim = r.cfg.Interested == nil || r.cfg.Interested(n.Payload)
		case <-resync:
		case <-r.wake:
		case <-poll:
			poll = r.clock.After(r.cfg.PollInterval)
		}
	}
}

// fill claims for the free slots, unless the node drains.
func (r *Runner[C]) fill(ctx context.Context) {
	for ctx.Err() == nil {
		r.mu.Lock()
		free := r.cfg.Slots - r.running
		r.mu.Unlock()
		if free <= 0 || r.cfg.Gate.Closed() {
			return
		}
		start := time.Now()
		claims, err := r.cfg.Claim(ctx, free)
		if r.cfg.Claimed != nil && (err == nil || ctx.Err() == nil) { // not the stop's own error
			r.cfg.Claimed(time.Since(start), claims, err)
		}
		if err != nil {
			return
		}
		for _, c := range claims {
			r.launch(ctx, c)
		}
		if len(claims) < free {
			return // nothing more is ready
		}
	}
}

// launch runs a claim in a slot of its own.
func (r *Runner[C]) launch(ctx context.Context, c C) {
	release, ok := r.cfg.Gate.Acquire()
	if !ok {
		// The node began draining between the check and the claim.
		r.cfg.Release(c)
		return
	}
	r.mu.Lock()
	r.running++
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer release()
		var once sync.Once
		free := func() {
			once.Do(func() {
				r.mu.Lock()
				r.running--
				r.mu.Unlock()
				select {
				case r.wake <- struct{}{}:
				default:
				}
			})
		}
		defer free()
		r.cfg.Run(ctx, c, free)
	}()
}
