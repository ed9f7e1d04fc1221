package eval

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// unit is a part of an evaluation's attribute tree that one walker process takes: the attribute
// at Path walked with Force levels below it walked without recurseForDerivations, or, with
// Names, those children of the set at Path (a slice of a set too large for one walker). A walk
// starts with a unit per root; walkers report the large sets they meet as new units.
type unit struct {
	Path  []string `json:"path"`
	Force int      `json:"force"`
	Names []string `json:"names,omitempty"`
	// alone: the retry of one attribute whose walker went past the per-worker memory limit;
	// past it again, the attribute fails.
	alone bool
	// A unit of the evaluation's table (units.go): its row and the claim's attempt (id 0: a
	// root, in the node's own queue), and what an earlier attempt of it walked already.
	id, evalID  int64
	attempt     int
	evalAttempt int
	skip        []string
}

// defaultSplitAbove: a set with more children than this is shared between workers. A walker
// process costs its start (about 0.1 s for a small project on a 2-core machine) and the
// project's root import (seconds for nixpkgs), and a cheap derivation about 0.3 ms: units of
// at least half of it keep that cost a small part of each unit.
const defaultSplitAbove = 1000

// walkPool runs one walk with up to Workers walker processes at once. Units wait in a queue; an
// idle worker takes the next one and starts a walker process on it, which may report more
// units (the large sets it meets). The walk ends when the queue is empty and no worker is busy,
// or at the first error, which stops every worker.
type walkPool struct {
	r       *NixRunner
	spec    Spec
	base    walkSpec // the walker's spec without units
	dir     string
	nonce   string
	workers int
	split   int

	emitMu sync.Mutex
	emit   func(Attr) error

	// shared, if set, is the evaluation's table of units: split units go there, for any node.
	shared *sharedUnits

	mu      sync.Mutex
	changed chan struct{} // closed and replaced at every change of the queue, busy or err
	queue   []unit
	busy    int
	err     error                   // the first error: it ends the walk
	cancel  context.CancelCauseFunc // stops every worker's walker at the first error
}

func newWalkPool(r *NixRunner, spec Spec, base walkSpec, dir, nonce string, shared *sharedUnits, emit func(Attr) error) *walkPool {
	p := &walkPool{r: r, spec: spec, base: base, dir: dir, nonce: nonce, emit: emit, workers: max(r.Workers, 1),
		shared: shared, changed: make(chan struct{})}
	// One worker alone walks everything in one process; units in the table may go to others.
	if p.workers > 1 || shared != nil {
		p.split = r.SplitAbove
		if p.split <= 0 {
			p.split = defaultSplitAbove
		}
	}
	return p
}

// signal wakes the workers waiting for a change; p.mu is held.
func (p *walkPool) signal() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// walk walks roots and everything they lead to.
func (p *walkPool) walk(ctx context.Context, roots []unit) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	p.cancel = cancel
	mw := newMemoryWatch(p.r.MaxMemoryPerWorker, p.r.MaxMemory, p.r.DaemonPid, p.r.memoryError(), cancel)
	defer mw.close()
	p.queue = roots
	var wg sync.WaitGroup
	for range p.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.work(ctx, mw)
		}()
	}
	wg.Wait()
	if mw.exceeded() {
		return p.r.memoryError()
	}
	if p.err != nil {
		return p.err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w", ErrCancelled, context.Cause(ctx))
	}
	return nil
}

// work is one worker: it walks units until there are none left, the walk failed, or ctx ended.
func (p *walkPool) work(ctx context.Context, mw *memoryWatch) {
	for {
		units, ok := p.take(ctx)
		if !ok {
			return
		}
		err := (&walker{pool: p, mw: mw, units: units}).walk(ctx)
		if err != nil {
			p.fail(ctx, err)
		}
		if err == nil && units[0].id != 0 {
			// Marked done in the transaction that commits the last of its attributes.
			err = p.report(ctx, Attr{unit: units[0].id, unitAttempt: units[0].attempt, unitDone: true})
		}
		p.mu.Lock()
		p.busy--
		failed := p.err != nil
		p.signal()
		p.mu.Unlock()
		if failed {
			return
		}
	}
}

// fail ends the walk with err, unless it already ended: every worker's walker is stopped.
func (p *walkPool) fail(ctx context.Context, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil && ctx.Err() == nil {
		p.err = err
		p.cancel(err)
		p.signal()
	}
}

// take waits for units to walk: false once the walk is over. One worker takes every queued
// unit into one process; several take one each, so a unit left over goes to whoever is idle. A
// retry is always taken alone. With the evaluation's table, a worker with nothing queued here
// claims a unit from it; the walk is over when nothing is queued anywhere and no worker here is
// busy, and for the claimant also when no other node walks a unit.
func (p *walkPool) take(ctx context.Context) ([]unit, bool) {
	for {
		p.mu.Lock()
		if p.err != nil || ctx.Err() != nil {
			p.mu.Unlock()
			return nil, false
		}
		if len(p.queue) > 0 {
			defer p.mu.Unlock()
			return p.takeQueued(), true
		}
		changed := p.changed
		if p.shared == nil {
			idle := p.busy == 0
			p.mu.Unlock()
			if idle {
				return nil, false
			}
			select {
			case <-changed:
			case <-ctx.Done():
			}
			continue
		}
		p.busy++ // claiming: the walk is not over meanwhile
		p.mu.Unlock()
		u, ok, err := p.shared.claim(ctx)
		if ok {
			return []unit{u}, true
		}
		// No signal: a worker waiting here polls the table anyway, and one woken by every failed
		// claim would wake the others in turn.
		p.mu.Lock()
		p.busy--
		idle := p.busy == 0 && len(p.queue) == 0
		p.mu.Unlock()
		if err != nil {
			p.fail(ctx, err)
			return nil, false
		}
		if idle {
			if !p.shared.owner {
				return nil, false
			}
			open, err := p.shared.open(ctx)
			if err != nil {
				p.fail(ctx, err)
				return nil, false
			}
			if !open {
				return nil, false
			}
		}
		select {
		case <-changed:
		case <-ctx.Done():
		case <-time.After(p.shared.poll):
		}
	}
}

// takeQueued takes the next units of the node's own queue, which is not empty; p.mu is held.
func (p *walkPool) takeQueued() []unit {
	n := 1
	if p.workers == 1 && !p.queue[0].alone {
		for n < len(p.queue) && !p.queue[n].alone {
			n++
		}
	}
	units := slices.Clone(p.queue[:n])
	p.queue = p.queue[n:]
	p.busy++
	return units
}

// push queues units for any worker: in the evaluation's table when it has one, handed on by
// the walker of parent (nil: the roots) from attribute handed, or else in the node's queue.
func (p *walkPool) push(ctx context.Context, parent *unit, handed string, retry bool, units ...unit) error {
	if p.shared != nil {
		if err := p.shared.insert(ctx, parent, handed, retry, units); err != nil {
			return err
		}
		units = nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.queue = append(p.queue, units...)
	p.signal()
	return nil
}

// splitUnits cuts the children of a reported set into units: about four per worker, so workers
// that finish early find more, and none smaller than half the split threshold.
func (p *walkPool) splitUnits(path []string, force int, names []string) []unit {
	size := max((len(names)+4*p.workers-1)/(4*p.workers), p.split/2, 1)
	var units []unit
	for chunk := range slices.Chunk(names, size) {
		units = append(units, unit{Path: path, Force: force, Names: chunk})
	}
	return units
}

// report passes a to the walk's emit, one worker at a time; nothing once the walk is over.
func (p *walkPool) report(ctx context.Context, a Attr) error {
	p.emitMu.Lock()
	defer p.emitMu.Unlock()
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w", ErrCancelled, context.Cause(ctx))
	}
	err := p.emit(a)
	if err != nil {
		p.fail(ctx, err) // before another worker reports
	}
	return err
}

// walker walks one batch of units in walker processes: again without an attribute an
// uncatchable error stopped Nix in, or one that took it past its memory limit.
type walker struct {
	pool   *walkPool
	mw     *memoryWatch
	units  []unit
	done   map[string]bool // attributes reported, and sets handed on as units
	failed []Attr          // caught errors, probed at the end for their message
}

func (w *walker) walk(ctx context.Context) error {
	p := w.pool
	w.done = map[string]bool{}
	ws := p.base
	ws.Units, ws.Split = w.units, p.split
	if len(w.units) == 1 && len(w.units[0].skip) > 0 {
		for _, a := range w.units[0].skip {
			w.done[a] = true
		}
		ws.Skip = slices.Clone(w.units[0].skip)
	}
	for {
		before := len(w.done)
		res, err := p.r.run(ctx, w.mw, p.dir, p.nonce, p.spec, ws, func(rec record) error { return w.record(ctx, rec) })
		if err != nil {
			return err
		}
		if res.ok {
			break
		}
		if err := w.restart(ctx, res, len(w.done) > before); err != nil {
			return err
		}
		ws.Skip = ws.Skip[:0]
		for a := range w.done {
			ws.Skip = append(ws.Skip, a)
		}
	}
	for _, a := range w.failed {
		msg, err := p.r.probe(ctx, w.mw, p.dir, p.nonce, p.spec, ws, a.Path)
		if err != nil {
			return err
		}
		a.Error = msg
		if err := w.report(ctx, a); err != nil {
			return err
		}
	}
	return nil
}

// record takes one record of the walker process.
func (w *walker) record(ctx context.Context, rec record) error {
	if rec.Split != nil {
		w.done[*rec.Split] = true
		return w.pool.push(ctx, w.tableUnit(), *rec.Split, false, w.pool.splitUnits(rec.Path, rec.Force, rec.Names)...)
	}
	w.done[rec.Attr] = true
	a := Attr{Name: rec.Attr, Path: rec.Path, DrvPath: rec.Drv, Error: rec.Error}
	if rec.Failed {
		w.failed = append(w.failed, a) // probed at the end, for the message
		return nil
	}
	return w.report(ctx, a)
}

// tableUnit is the unit of the evaluation's table the walker walks, nil if it walks roots.
func (w *walker) tableUnit() *unit {
	if len(w.units) == 1 && w.units[0].id != 0 {
		return &w.units[0]
	}
	return nil
}

// report reports a, naming the unit of the table it was found in.
func (w *walker) report(ctx context.Context, a Attr) error {
	if u := w.tableUnit(); u != nil {
		a.unit, a.unitAttempt = u.id, u.attempt
	}
	return w.pool.report(ctx, a)
}

// errNoProgress: a walker process went past its memory limit between attributes, without
// reporting anything since the last restart.
var errNoProgress = errors.New("a worker went past eval.max_memory_per_worker outside any attribute")

// restart handles a walker process that stopped before the end of its units: the attribute at
// fault is recorded (an uncatchable error), retried alone (the first time past the memory
// limit) or failed (past it alone), and the rest is walked again without it.
func (w *walker) restart(ctx context.Context, res runResult, progressed bool) error {
	p := w.pool
	switch {
	case res.overWorker:
		attr := ""
		if res.culprit != nil {
			attr = *res.culprit
		}
		if p.r.OnRestart != nil {
			p.r.OnRestart(attr)
		}
		if res.culprit == nil {
			if !progressed {
				return fmt.Errorf("%w (%d MiB)", errNoProgress, p.r.MaxMemoryPerWorker>>20)
			}
			return nil
		}
		w.done[attr] = true
		if len(w.units) == 1 && w.units[0].alone && slices.Equal(w.units[0].Path, res.culpritPath) {
			return w.report(ctx, Attr{Name: attr, Path: res.culpritPath, Error: p.r.workerMemoryMessage()})
		}
		return p.push(ctx, w.tableUnit(), attr, true, unit{Path: res.culpritPath, Force: w.forceAt(res.culpritPath), alone: true})
	case res.culprit == nil:
		return fmt.Errorf("nix-instantiate failed: %s", res.message)
	default:
		w.done[*res.culprit] = true
		return w.report(ctx, Attr{Name: *res.culprit, Path: res.culpritPath, Error: res.message})
	}
}

// forceAt is the force the walk had at path, below the deepest of the walker's units holding
// it: one level less per level down.
func (w *walker) forceAt(path []string) int {
	best := -1
	for i, u := range w.units {
		if len(u.Path) <= len(path) && slices.Equal(u.Path, path[:len(u.Path)]) && (best < 0 || len(u.Path) > len(w.units[best].Path)) {
			best = i
		}
	}
	if best < 0 {
		return 0
	}
	u := w.units[best]
	return u.Force - (len(path) - len(u.Path))
}
