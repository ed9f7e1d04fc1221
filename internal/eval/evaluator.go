package eval

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	neturl "net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/gitrepo"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
	"github.com/harmonia-ci/harmonia-ci/internal/publication"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/slots"
	"github.com/harmonia-ci/harmonia-ci/internal/startstop"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/upstream"
)

// Config configures an Evaluator.
type Config struct {
	NodeID string
	// StateDir holds the repository mirrors (git/) and Nix's HOME (eval-home/).
	StateDir string
	// MaxEvals is how many evaluations run at once; default 1.
	MaxEvals int
	// Workers is how many walker processes one evaluation runs at once, sharing its attribute
	// tree ([eval] workers); default 1.
	Workers int
	// PollInterval: claim at least this often without a notification; default 5s.
	PollInterval time.Duration
	// Timeout of one evaluation unless .harmonia-ci.toml sets eval-timeout; default 1h.
	Timeout time.Duration
	// MaxAttrs and MaxDerivations are the most attributes one evaluation may report and
	// derivations it may add; past either it fails. 0: unlimited.
	MaxAttrs, MaxDerivations int
	// MaxRetention is the longest retention a project's .harmonia-ci.toml may ask for; a
	// longer one is cut to it. 0: no ceiling.
	MaxRetention time.Duration
	// MaxRetries and MaxRetryBackoff cap a project's [retry] policy ([build] max_retries and
	// max_retry_backoff); 0 retries: none.
	MaxRetries      int
	MaxRetryBackoff time.Duration
	// BatchAttrs and BatchWait bound a batch: it is prepared (closure read, published) at 50
	// attributes or 2 s.
	BatchAttrs int
	BatchWait  time.Duration
	// CommitInterval: prepared batches are committed (their jobs made claimable) at most this
	// often, and at once after the walk; the first batch at once. Default 1s.
	CommitInterval time.Duration
	// StatusInterval is how often a running evaluation re-reads its status (cancel,
	// supersede, reap); default 1s.
	StatusInterval time.Duration
	// StoreRoot is the Nix store evaluated into: "" for the system store, or a chroot store
	// directory.
	StoreRoot string
	// Gate admits evaluations; once closed (drain) nothing more is claimed.
	Gate *cluster.InFlight
	// Notifier wakes the evaluator on "evaluations" notifications; nil means polling only.
	Notifier *notify.Notifier
	// Cache tells which outputs the project's cache holds (the signer client); nil: only the
	// database's record.
	Cache CacheLookup
	// Upstream substituters; nil for none.
	Upstream *upstream.Caches
	// Publisher publishes the .drv closure; nil publishes nothing.
	Publisher Publisher
	// Runner evaluates; default a NixRunner. Its Home, WorkDir, User, Daemon and MaxMemory are
	// set per evaluation.
	Runner *NixRunner
	// Confinement is who evaluates and within which limits.
	Confinement Confinement
	// Registerer, if set, receives the evaluator's series (evaluations by outcome, durations).
	Registerer prometheus.Registerer
	// Order ranks the jobs this evaluator enqueues (queue.order).
	Order queue.Order
	// Tickets proves this node's claims to the frontends, which then hand out the read
	// credential of a private repository (the signer client); nil: private repositories are
	// fetched without one, and fail.
	Tickets Ticketer
	// DeadThreshold: frontends silent this long are not asked, and evaluators silent this long
	// do not count as others that might walk units; default cluster.DefaultDeadThreshold.
	DeadThreshold time.Duration
	// HelpOthers: a slot with no queued evaluation to take walks units of an evaluation another
	// node runs ([eval] help_others).
	HelpOthers bool
}

// Evaluator is the evaluator role: it claims queued evaluations, walks the project's
// attributes with Nix, and ingests what it finds in batches.
type Evaluator struct {
	startstop.Base
	cfg     Config
	pool    *pgxpool.Pool
	logger  *slog.Logger
	clock   clock.Clock
	slots   *slots.Runner[claim]
	confine *confinement
	metrics *evalMetrics
	creds   *credentials // nil without Tickets

	mu sync.Mutex
	// running are the evaluations this node runs or helps with now, whose units it claims for
	// no other slot; cantHelp those it found it would evaluate another commit of.
	running  map[int64]int
	cantHelp map[int64]bool
	// nixVersion is the version of the Nix it evaluates with, found at start ("" if unknown).
	nixVersion string
}

// New returns an evaluator; Start runs it.
func New(cfg Config, pool *pgxpool.Pool, logger *slog.Logger, clk clock.Clock) (*Evaluator, error) {
	if cfg.NodeID == "" || cfg.StateDir == "" {
		return nil, errors.New("evaluator: node id and state dir are required")
	}
	if cfg.MaxEvals <= 0 {
		cfg.MaxEvals = 1
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Hour
	}
	if cfg.BatchAttrs <= 0 {
		cfg.BatchAttrs = 50
	}
	if cfg.BatchWait <= 0 {
		cfg.BatchWait = 2 * time.Second
	}
	if cfg.CommitInterval <= 0 {
		cfg.CommitInterval = time.Second
	}
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = time.Second
	}
	if cfg.Gate == nil {
		cfg.Gate = &cluster.InFlight{}
	}
	if cfg.Runner == nil {
		cfg.Runner = &NixRunner{}
	}
	if cfg.Runner.Store == "" {
		cfg.Runner.Store = cfg.StoreRoot
	}
	if clk == nil {
		clk = clock.Real{}
	}
	logger = logger.With("service", "evaluator", "node_id", cfg.NodeID)
	if _, err := lookBwrap(cfg.Runner.Bwrap); err != nil {
		return nil, fmt.Errorf("evaluator: %w", err)
	}
	cf, err := newConfinement(cfg.Confinement, cfg.StateDir, logger)
	if err != nil {
		return nil, err
	}
	e := &Evaluator{cfg: cfg, pool: pool, clock: clk, logger: logger, confine: cf,
		metrics: newEvalMetrics(cfg.Registerer), running: map[int64]int{}, cantHelp: map[int64]bool{}}
	if cfg.Tickets != nil {
		e.creds = &credentials{tickets: cfg.Tickets, pool: pool, http: &http.Client{Timeout: 2 * time.Minute},
			deadThreshold: cfg.DeadThreshold}
	}
	e.slots = slots.New(slots.Config[claim]{
		Slots:        cfg.MaxEvals,
		PollInterval: cfg.PollInterval,
		Gate:         cfg.Gate,
		Claim:        e.claim,
		Claimed: func(_ time.Duration, _ []claim, err error) {
			if err != nil {
				e.logger.Warn("claim evaluation failed", "error", err)
			}
		},
		Run: func(ctx context.Context, c claim, _ func()) {
			defer e.finished(c)
			if c.unit != nil {
				e.help(ctx, c)
				return
			}
			e.evaluate(ctx, c)
		},
		Release: e.release,
	}, clk)
	return e, nil
}

// Start runs the claim loop until Stop; Stop kills running evaluations and hands them back
// to the queue. A second Start is a no-op.
func (e *Evaluator) Start(ctx context.Context) error {
	_, err := e.Launch(ctx, func() (func(context.Context), error) {
		if err := e.confine.prepare(); err != nil {
			return nil, err
		}
		// Recorded on each evaluation it claims. A Nix missing now fails evaluations, not the
		// node: they are run again once it is there.
		runner := *e.cfg.Runner
		runner.User = e.confine.user
		if v, err := runner.Version(ctx); err != nil {
			e.logger.Warn("cannot tell which Nix evaluates", "error", err)
		} else {
			e.nixVersion = v
		}
		var sub *notify.Sub
		if e.cfg.Notifier != nil {
			var err error
			if sub, err = e.cfg.Notifier.Subscribe("evaluations"); err != nil {
				return nil, fmt.Errorf("evaluator: %w", err)
			}
		}
		return func(ctx context.Context) {
			if sub != nil {
				defer sub.Close()
			}
			e.slots.Loop(ctx, sub) // returns once every running evaluation has
		}, nil
	})
	return err
}

// NixVersion is the version of the Nix it evaluates with, known once started ("" if its
// nix-instantiate could not say).
func (e *Evaluator) NixVersion() string { return e.nixVersion }

// Running is the number of evaluations running now.
func (e *Evaluator) Running() int { return e.slots.Running() }

// claim claims up to n queued evaluations, one statement each, and, when the queue runs dry and
// the node helps others, units of evaluations other nodes run (one per evaluation: the slot
// that takes it walks that evaluation's units until none is left).
func (e *Evaluator) claim(ctx context.Context, n int) ([]claim, error) {
	var claims []claim
	for len(claims) < n {
		c := claim{node: e.cfg.NodeID}
		err := e.pool.QueryRow(ctx, sqlClaimEval, e.cfg.NodeID, e.nixVersion, e.cfg.Workers,
			e.cfg.Confinement.MaxMemoryPerWorker).Scan(&c.id, &c.attempt)
		if errors.Is(err, pgx.ErrNoRows) {
			break
		}
		if err != nil {
			// What is claimed is run; the error shows next time round.
			if len(claims) > 0 {
				break
			}
			return nil, err
		}
		e.started(c)
		claims = append(claims, c)
	}
	for e.cfg.HelpOthers && len(claims) < n {
		u, err := scanUnit(e.pool.QueryRow(ctx, sqlClaimUnitToHelp, e.cfg.NodeID, e.notToHelp()))
		if errors.Is(err, pgx.ErrNoRows) {
			break
		}
		if err != nil {
			if len(claims) > 0 {
				break
			}
			return nil, fmt.Errorf("claim a unit: %w", err)
		}
		if err := u.readSkip(ctx, e.pool); err != nil {
			e.releaseUnits(u.evalID)
			if len(claims) > 0 {
				break
			}
			return nil, err
		}
		c := claim{id: u.evalID, node: e.cfg.NodeID, attempt: u.evalAttempt, unit: &u}
		e.started(c)
		claims = append(claims, c)
	}
	return claims, nil
}

// claim is one attempt at an evaluation: its claim, or (unit set) a unit of it this node
// claimed to help the node that runs it.
type claim struct {
	id      int64
	node    string
	attempt int // the evaluation's
	unit    *unit
}

// started and finished keep the evaluations this node takes part in.
func (e *Evaluator) started(c claim) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.running[c.id]++
}

func (e *Evaluator) finished(c claim) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.running[c.id]--; e.running[c.id] <= 0 {
		delete(e.running, c.id)
	}
}

// notToHelp lists the evaluations whose units this node does not claim: those it takes part in
// already, and those it found it cannot help with.
func (e *Evaluator) notToHelp() []int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	ids := []int64{}
	for id := range e.running {
		ids = append(ids, id)
	}
	for id := range e.cantHelp {
		if e.running[id] == 0 {
			ids = append(ids, id)
		}
	}
	return ids
}

// maxCoalesced bounds the attributes prepared at once.
const maxCoalesced = 1000

// Errors that end an evaluation, and how they are recorded.
var (
	// ErrTooLarge ends an evaluation past one of the node's ceilings (eval.max_attrs,
	// eval.max_derivations).
	ErrTooLarge = errors.New("evaluation too large")
	errTimeout  = errors.New("evaluation timed out")
	errGone     = errors.New("evaluation no longer ours")
	// errConflict ends a pull request's evaluation whose head and base do not merge: it is
	// cancelled with the error, which starts with evaluation.ConflictPrefix.
	errConflict = errors.New("merge conflict")
)

// evaluate runs one claimed evaluation to its end and records the outcome.
func (e *Evaluator) evaluate(ctx context.Context, c claim) {
	log := e.logger.With("eval_id", c.id, "attempt", c.attempt)
	start := time.Now()
	stats, err := e.run(ctx, c, log)
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	switch {
	case err == nil:
		err := e.finish(fctx, c, sqlSucceedEval, status.EvalSucceeded)
		if err != nil {
			e.unrecorded(err, start)
			log.Warn("could not record success", "error", err)
			return
		}
		e.metrics.ended(outcomeSucceeded, time.Since(start))
		log.Info("evaluation succeeded", "attrs", stats.Attrs, "derivations", stats.Derivations,
			"jobs", stats.Jobs, "published", stats.Published, "commits", stats.Commits,
			"seconds", time.Since(start).Seconds())
	case errors.Is(err, errConflict):
		if err := e.conflict(fctx, c, err.Error()); err != nil {
			e.unrecorded(err, start)
			log.Warn("could not record the merge conflict", "error", err)
			return
		}
		e.metrics.ended(outcomeConflict, time.Since(start))
		log.Info("pull request not evaluated", "error", err)
	case errors.Is(err, errGone) || errors.Is(err, errStale):
		e.metrics.ended(outcomeCancelled, time.Since(start))
		log.Info("evaluation stopped: cancelled, superseded or reaped elsewhere")
	case ctx.Err() != nil:
		// Stopping (drain, shutdown): hand it back; the next claim starts over.
		e.handBack(c)
		e.metrics.ended(outcomeReleased, time.Since(start))
		log.Info("evaluation handed back to the queue")
	default:
		outcome := outcomeFailed
		if errors.Is(err, errTimeout) {
			outcome = outcomeTimeout
		}
		if err := e.fail(fctx, c, err.Error()); err != nil {
			e.unrecorded(err, start)
			log.Warn("could not record failure", "error", err)
			return
		}
		e.metrics.ended(outcome, time.Since(start))
		log.Info("evaluation failed", "error", err)
	}
}

// unrecorded counts a run whose outcome could not be recorded: a stale claim means the
// evaluation was taken from this node meanwhile; any other error leaves it running, for the
// reaper, and is not counted.
func (e *Evaluator) unrecorded(recordErr error, start time.Time) {
	if errors.Is(recordErr, errStale) {
		e.metrics.ended(outcomeCancelled, time.Since(start))
	}
}

// run evaluates; a nil error means every attribute was ingested.
func (e *Evaluator) run(ctx context.Context, c claim, log *slog.Logger) (ingestStats, error) {
	if err := evaluation.ClearAttrs(ctx, e.pool, c.id); err != nil {
		return ingestStats{}, fmt.Errorf("clear attributes of an earlier attempt: %w", err)
	}
	if _, err := e.pool.Exec(ctx, sqlClearUnits, c.id, c.attempt); err != nil {
		return ingestStats{}, fmt.Errorf("clear units of an earlier attempt: %w", err)
	}
	v, err := e.prepareView(ctx, c, log)
	if v != nil {
		defer v.close()
	}
	if err != nil {
		return ingestStats{}, err
	}
	if v.settings.Retention > 0 {
		// The garbage collector keeps this evaluation as long as its tree asks, up to the node's
		// ceiling.
		if m := e.cfg.MaxRetention; m > 0 && v.settings.Retention > m {
			log.Info("retention cut to retention.max", "asked", v.settings.Retention, "max", m)
			v.settings.Retention = m
		}
		if _, err := e.pool.Exec(ctx, sqlSetRetention, c.id, c.node, c.attempt, int64(v.settings.Retention.Seconds())); err != nil {
			return ingestStats{}, fmt.Errorf("record the retention: %w", err)
		}
	}
	// Units go to the table, for other evaluator nodes to walk, only when one is there to take
	// them: alone, a node keeps its queue in memory and one worker walks in one process.
	var shared *sharedUnits
	var others bool
	if err := e.pool.QueryRow(ctx, sqlOtherEvaluators, e.cfg.NodeID, e.deadThreshold().Seconds()).Scan(&others); err != nil {
		return ingestStats{}, fmt.Errorf("look for other evaluators: %w", err)
	}
	if others {
		shared = &sharedUnits{pool: e.pool, node: c.node, evalID: c.id, evalAttempt: c.attempt, owner: true,
			poll: unitPollInterval}
	}
	return e.walkIngest(ctx, c, v, shared, func(ctx context.Context, cancel context.CancelCauseFunc) {
		e.watchStatus(ctx, sqlEvalStatus, []any{c.id, c.node, c.attempt}, cancel)
	}, log)
}

// deadThreshold is how long a node may be silent before it counts as dead.
func (e *Evaluator) deadThreshold() time.Duration {
	if e.cfg.DeadThreshold > 0 {
		return e.cfg.DeadThreshold
	}
	return cluster.DefaultDeadThreshold
}

// view is what walking an evaluation needs on this node, for its claimant and for a node that
// helps with its units alike: the project's source at the evaluated commit, its settings, a
// runner confined to the view (with its private nix-daemon on a root node), and an ingester.
type view struct {
	spec     Spec
	settings Settings
	runner   NixRunner
	in       *ingester
	closers  []func()
}

func (v *view) close() {
	for _, f := range slices.Backward(v.closers) {
		f()
	}
}

// prepareView fetches the repository of c's evaluation (with its read credential if private),
// makes the confined workspace, decides the commit (the claimant records a pull request's
// merge; a helper checks it makes the same) and the plan, and readies the runner and the
// ingester. The returned view, even with an error, must be closed.
func (e *Evaluator) prepareView(ctx context.Context, c claim, log *slog.Logger) (*view, error) {
	var url, commit, branch, prBase string
	var projectID int64
	var prNumber int
	var private, promote bool
	if err := e.pool.QueryRow(ctx, sqlRepoOfEval, c.id).Scan(&projectID, &url, &private, &commit, &branch, &prNumber, &prBase, &promote); err != nil {
		return nil, fmt.Errorf("read evaluation: %w", err)
	}
	mirror, err := gitrepo.New(MirrorDir(e.cfg.StateDir, projectID), url)
	if err != nil {
		return nil, err
	}
	if err := e.fetch(ctx, c, mirror, private, log); err != nil {
		return nil, err
	}
	if _, err := mirror.ResolveCommit(ctx, commit); err != nil {
		return nil, err
	}
	ws, err := e.confine.workspace(ctx, projectID, mirror)
	if err != nil {
		return nil, err
	}
	record := func(base, merge string) error { return e.recordMerge(ctx, c, base, merge) }
	if c.unit != nil {
		record = func(_, merge string) error { return e.sameMerge(ctx, c, merge) }
	}
	// From here on the source copy, which holds the merges MergeInto makes.
	commit, err = e.evaluatedCommit(ctx, ws.copy, commit, prNumber, prBase, record)
	if err != nil {
		return nil, err
	}
	v := &view{}
	if v.spec, v.settings, err = e.plan(ctx, ws.copy, ws.source, commit, branch); err != nil {
		return v, err
	}
	if v.spec.Mode == "file" {
		dir, remove, err := ws.tree(ctx, commit)
		if err != nil {
			return v, err
		}
		v.closers = append(v.closers, remove)
		v.spec.Source = dir
	}
	runner := *e.cfg.Runner
	runner.Home, runner.WorkDir = ws.home, ws.work
	runner.MaxMemory = e.cfg.Confinement.MaxMemory
	runner.MaxMemoryPerWorker = e.cfg.Confinement.MaxMemoryPerWorker
	runner.Workers = e.cfg.Workers
	runner.OnRestart = func(attr string) { e.restarted(ctx, c, attr, runner.MaxMemoryPerWorker, log) }
	if e.confine.user != nil {
		d, closeDaemon, err := e.confine.newDaemon()
		if err != nil {
			return v, err
		}
		v.closers = append(v.closers, closeDaemon)
		runner.User, runner.Daemon, runner.DaemonPid = e.confine.user, d.Ensure, d.Pid
	}
	v.runner = runner
	storeDB, err := nix.OpenStoreDB(e.cfg.StoreRoot)
	if err != nil {
		return v, err
	}
	v.closers = append(v.closers, func() { storeDB.Close() })
	retry, expiry := v.settings.Retry.Cap(e.cfg.MaxRetries, e.cfg.MaxRetryBackoff), v.settings.FailureExpiry
	if prNumber != 0 {
		// Jobs are shared with the branches' evaluations (and other projects'): a pull
		// request's tree, untrusted, sets no policy on them and sends no failure back to the
		// queue. Its jobs keep what branch evaluations set.
		retry, expiry = RetryPolicy{}, 0
	}
	v.in = &ingester{pool: e.pool, storeRoot: e.cfg.StoreRoot, storeDB: storeDB, cache: e.cfg.Cache,
		upstream: e.cfg.Upstream, publisher: e.cfg.Publisher,
		evalID: c.id, node: c.node, attempt: c.attempt, helper: c.unit != nil, projectID: projectID, order: e.cfg.Order,
		trusted: prNumber == 0, promote: promote,
		maxDerivations: e.cfg.MaxDerivations,
		known:          map[string]bool{}, prepared: map[string]bool{}, published: map[string]bool{},
		checked: map[string]drvCheck{},
		retry:   retry, failureExpiry: expiry}
	return v, nil
}

// walkIngest walks v's spec (with shared, the units of the evaluation's table too) and ingests
// what it finds, until the walk ends, fails, times out, or watch cancels it.
func (e *Evaluator) walkIngest(ctx context.Context, c claim, v *view, shared *sharedUnits,
	watch func(context.Context, context.CancelCauseFunc), log *slog.Logger) (ingestStats, error) {
	in := v.in
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	tctx, tcancel := context.WithTimeoutCause(wctx, v.settings.EvalTimeout,
		fmt.Errorf("%w after %s", errTimeout, v.settings.EvalTimeout))
	defer tcancel()
	go watch(tctx, cancel)

	batches := make(chan []Attr, maxCoalesced/50)
	ingestDone := make(chan error, 1)
	go func() {
		err := e.ingest(tctx, in, batches)
		if err != nil {
			cancel(err)
			for range batches { // the walk stops; let it hand over what it has
			}
		}
		ingestDone <- err
	}()
	batcher := newBatcher(e.cfg.BatchAttrs, e.cfg.BatchWait, e.clock, batches)
	var attrs atomic.Int64
	walkErr := v.runner.walk(tctx, v.spec, shared, func(a Attr) error {
		if a.unitDone {
			batcher.add(a)
			return nil
		}
		if n := attrs.Add(1); e.cfg.MaxAttrs > 0 && n > int64(e.cfg.MaxAttrs) {
			return fmt.Errorf("%w: more than %d attributes (eval.max_attrs)", ErrTooLarge, e.cfg.MaxAttrs)
		}
		batcher.add(a)
		return nil
	})
	batcher.close()
	close(batches)
	ingestErr := <-ingestDone
	if in.helper && walkErr == nil && ingestErr == nil {
		// Everything it walked is committed: the claimant may have finished meanwhile.
		return in.stats, nil
	}
	if cause := context.Cause(tctx); tctx.Err() != nil && ctx.Err() == nil {
		return in.stats, cause
	}
	if walkErr != nil {
		return in.stats, walkErr
	}
	if ingestErr != nil {
		return in.stats, ingestErr
	}
	if shared != nil && e.cfg.MaxAttrs > 0 {
		// Each node counts what it walked; the ceiling is the evaluation's, so the claimant
		// counts every node's once all are committed.
		var n int64
		if err := e.pool.QueryRow(ctx, sqlCountAttrs, c.id).Scan(&n); err != nil {
			return in.stats, fmt.Errorf("count attributes: %w", err)
		}
		if n > int64(e.cfg.MaxAttrs) {
			return in.stats, fmt.Errorf("%w: more than %d attributes (eval.max_attrs)", ErrTooLarge, e.cfg.MaxAttrs)
		}
	}
	log.Debug("walk done", "mode", v.spec.Mode)
	return in.stats, nil
}

// help walks units of evaluation c.id, which another node runs, starting with c.unit, until
// none is queued: in a view prepared as the claimant prepares its own, ingesting what it finds
// as the claimant does. Its first error fails the evaluation, as the claimant's would.
func (e *Evaluator) help(ctx context.Context, c claim) {
	log := e.logger.With("eval_id", c.id, "attempt", c.attempt, "helping", true)
	start := time.Now()
	v, err := e.prepareView(ctx, c, log)
	if v != nil {
		defer v.close()
	}
	var stats ingestStats
	if err == nil {
		shared := &sharedUnits{pool: e.pool, node: c.node, evalID: c.id, evalAttempt: c.attempt, poll: unitPollInterval}
		shared.first.Store(c.unit)
		v.spec.Roots = nil // the claimant's
		stats, err = e.walkIngest(ctx, c, v, shared, func(ctx context.Context, cancel context.CancelCauseFunc) {
			e.watchStatus(ctx, sqlEvalStatusAt, []any{c.id, c.attempt}, cancel)
		}, log)
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	switch {
	case err == nil:
		log.Info("helped with the evaluation: no unit left to walk", "attrs", stats.Attrs,
			"derivations", stats.Derivations, "jobs", stats.Jobs, "seconds", time.Since(start).Seconds())
	case errors.Is(err, errGone) || errors.Is(err, errStale):
		log.Info("stopped helping: the evaluation ended, or the unit was reaped elsewhere")
	case ctx.Err() != nil:
		e.handBack(c)
		log.Info("units handed back to the evaluation")
	case errors.Is(err, errCannotHelp):
		e.mu.Lock()
		e.cantHelp[c.id] = true
		e.mu.Unlock()
		e.releaseUnits(c.id)
		log.Info("not helping with the evaluation", "error", err)
	default:
		rerr := e.end(fctx, c, sqlFailEvalHelped, status.EvalFailed, err.Error())
		if rerr != nil {
			log.Warn("could not record the failure of a unit", "error", rerr, "failure", err)
			return
		}
		log.Info("evaluation failed in a unit this node walked", "error", err)
	}
}

// releaseUnits hands back the units of evaluation id this node walks.
func (e *Evaluator) releaseUnits(id int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.pool.Exec(ctx, sqlReleaseUnits, e.cfg.NodeID, id); err != nil {
		e.logger.Warn("could not hand units back", "eval_id", id, "error", err)
	}
}

// restarted counts a walker of c restarted past its memory limit, on attribute attr.
func (e *Evaluator) restarted(ctx context.Context, c claim, attr string, limit int64, log *slog.Logger) {
	e.metrics.restarted()
	log.Info("walker restarted: over eval.max_memory_per_worker", "attr", attr, "max_memory_per_worker_mib", limit>>20)
	if _, err := e.pool.Exec(ctx, sqlCountRestart, c.id, c.node, c.attempt); err != nil {
		log.Warn("could not count the walker's restart", "error", err)
	}
}

// fetch brings the mirror up to date: a public repository anonymously, a private one with the
// read credential a frontend mints for this evaluation. The credential lives in this function
// only: git gets it in its environment (gitrepo.Mirror.FetchWith), the mirror's configuration
// and the credential-free copy the project's code reads never hold it, and nothing logs it. A
// token the forge lets its holder revoke is revoked after the fetch. A repository recorded
// public whose anonymous fetch is refused for want of credentials (made private since
// discovery last listed it) is fetched once more with a credential.
func (e *Evaluator) fetch(ctx context.Context, c claim, m *gitrepo.Mirror, private bool, log *slog.Logger) error {
	if private && e.creds != nil {
		log.Debug("fetching the private repository with a read credential")
		return e.fetchWithCredential(ctx, c, m, log)
	}
	err := m.Fetch(ctx)
	if err == nil || e.creds == nil || !gitrepo.IsAuthError(err) {
		return err
	}
	log.Info("the anonymous fetch was refused for want of credentials: fetching again with a read credential (the repository may have been made private)")
	if cerr := e.fetchWithCredential(ctx, c, m, log); cerr != nil {
		return fmt.Errorf("%w (and with a read credential: %w)", err, cerr)
	}
	return nil
}

// fetchWithCredential fetches with the read credential a frontend mints for claim c, then
// revokes it where the forge lets its holder: done with it, rather than left to expire.
func (e *Evaluator) fetchWithCredential(ctx context.Context, c claim, m *gitrepo.Mirror, log *slog.Logger) error {
	cred, err := e.creds.get(ctx, c)
	if err != nil {
		return err
	}
	err = m.FetchWith(ctx, cred)
	if rerr := cred.Revoke(context.WithoutCancel(ctx), e.creds.http); rerr != nil {
		log.Warn("could not revoke the read credential; it expires by itself", "err", rerr, "expires", cred.Expires)
	}
	return err
}

// ingest prepares each batch as it arrives and commits what is prepared at most every
// CommitInterval, and at once when the walk ends. Every commit runs the queue's enqueue over
// everything already pending below it (readiness, critical-path chains), so its cost grows with
// the evaluation, not the batch: a few large transactions cost far less than one per batch,
// and leave the cores to Nix. The publication lock is held from the first prepare after a
// commit to the next commit, so the garbage collector never deletes what a prepared batch
// relies on.
func (e *Evaluator) ingest(ctx context.Context, in *ingester, batches <-chan []Attr) error {
	var (
		ready      []batch
		release    func()
		lastCommit time.Time // zero: the first batch is committed at once, for the first jobs
		due        <-chan time.Time
	)
	defer func() {
		if release != nil {
			release()
		}
	}()
	commit := func() error {
		err := in.commit(ctx, ready)
		release()
		release, ready, due = nil, nil, nil
		lastCommit = e.clock.Now()
		return err
	}
	for {
		select {
		case <-due:
			if err := commit(); err != nil {
				return err
			}
			continue
		case b, ok := <-batches:
			if !ok {
				if len(ready) > 0 {
					if err := commit(); err != nil {
						return err
					}
				}
				return in.raiseChains(ctx)
			}
			// Batches that queued up while the previous one was prepared go in together, up to
			// maxCoalesced attributes.
		more:
			for len(b) < maxCoalesced {
				select {
				case next, ok := <-batches:
					if !ok {
						break more
					}
					b = append(b, next...)
				default:
					break more
				}
			}
			if release == nil {
				// From the first lookup of what the database and the cache hold to the commit of
				// the rows that make it live, the garbage collector's sweep waits.
				var err error
				if release, err = publication.Hold(ctx, e.pool); err != nil {
					return err
				}
			}
			p, err := in.prepare(ctx, b)
			if err != nil {
				return err
			}
			ready = append(ready, p)
			if wait := e.cfg.CommitInterval - e.clock.Now().Sub(lastCommit); wait > 0 {
				if due == nil {
					due = e.clock.After(wait)
				}
				continue
			}
			if err := commit(); err != nil {
				return err
			}
		}
	}
}

// evaluatedCommit returns the commit a run evaluates, and records it: a pull request's head
// merged into its base (pr 0 or base "": head itself), unless the settings choose the head. The
// settings are the merge's, as they will be once merged, so a pull request that changes
// pull-requests is evaluated the way its change says; without a merge (a conflict) the head's
// decide. A conflict is errConflict. record is given what it evaluates: the base's tip and the
// merge ("" and "": the head).
func (e *Evaluator) evaluatedCommit(ctx context.Context, m *gitrepo.Mirror, head string, pr int, base string,
	record func(base, merge string) error) (string, error) {
	if pr == 0 || base == "" {
		return head, nil
	}
	mg, err := m.MergeInto(ctx, base, head, fmt.Sprintf("refs/pull/%d/merge", pr))
	var conflict *gitrepo.ConflictError
	if errors.As(err, &conflict) {
		mode, err := e.prMode(ctx, m, head)
		if err != nil {
			return "", err
		}
		if mode == PRHead {
			return head, record("", "")
		}
		if err := record(conflict.Base, ""); err != nil {
			return "", err
		}
		switch {
		case conflict.Unrelated:
			return "", fmt.Errorf("%w: the pull request shares no history with %s", errConflict, base)
		case len(conflict.Paths) == 0:
			return "", fmt.Errorf("%w: the pull request does not merge into %s", errConflict, base)
		}
		return "", fmt.Errorf("%w: %s and the pull request conflict in %s", errConflict, base, strings.Join(conflict.Paths, ", "))
	}
	if err != nil {
		return "", fmt.Errorf("merge the pull request into %s: %w", base, err)
	}
	mode, err := e.prMode(ctx, m, mg.Commit)
	if err != nil {
		return "", err
	}
	if mode == PRHead {
		return head, record("", "")
	}
	return mg.Commit, record(mg.Base, mg.Commit)
}

// prMode is the pull-requests setting of commit's .harmonia-ci.toml.
func (e *Evaluator) prMode(ctx context.Context, m *gitrepo.Mirror, commit string) (string, error) {
	raw, _, err := m.ReadFile(ctx, commit, SettingsFile)
	if err != nil {
		return "", err
	}
	s, err := ParseSettings(raw, true, e.cfg.Timeout)
	if err != nil {
		return "", err
	}
	return s.PullRequests, nil
}

// recordMerge records what this run evaluates: the base's tip and the merge ("": the head).
func (e *Evaluator) recordMerge(ctx context.Context, c claim, base, merge string) error {
	tag, err := e.pool.Exec(ctx, sqlSetMerge, c.id, c.node, c.attempt, base, merge)
	if err != nil {
		return fmt.Errorf("record the merge: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return errStale
	}
	return nil
}

// errCannotHelp: a helper would not evaluate the commit the evaluation's claimant evaluates (a
// pull request's base moved on since the claimant merged it).
var errCannotHelp = errors.New("this node would evaluate another commit than the evaluation's claimant")

// sameMerge checks that a helper evaluates the merge ("": the head) c's claimant recorded.
func (e *Evaluator) sameMerge(ctx context.Context, c claim, merge string) error {
	var recorded string
	var st status.EvalStatus
	err := e.pool.QueryRow(ctx, sqlHelpedEval, c.id, c.attempt).Scan(&recorded, &st)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && st != status.EvalRunning) {
		return errStale
	}
	if err != nil {
		return fmt.Errorf("read the evaluated commit: %w", err)
	}
	if recorded != merge {
		return fmt.Errorf("%w: %q, not %q", errCannotHelp, merge, recorded)
	}
	return nil
}

// conflict ends a pull request's evaluation whose head does not merge into its base: cancelled,
// with msg, and nothing evaluated.
func (e *Evaluator) conflict(ctx context.Context, c claim, msg string) error {
	return e.end(ctx, c, sqlConflictEval, status.EvalCancelled, msg)
}

// plan reads the in-tree settings and decides what to evaluate: commit of the copy of m at
// source (a flake's), or of the tree run exports from it (a file's), which is what the
// project's code may read.
func (e *Evaluator) plan(ctx context.Context, m *gitrepo.Mirror, source, commit, branch string) (Spec, Settings, error) {
	_, isFlake, err := m.ReadFile(ctx, commit, "flake.nix")
	if err != nil {
		return Spec{}, Settings{}, err
	}
	raw, _, err := m.ReadFile(ctx, commit, SettingsFile)
	if err != nil {
		return Spec{}, Settings{}, err
	}
	settings, err := ParseSettings(raw, isFlake, e.cfg.Timeout)
	if err != nil {
		return Spec{}, Settings{}, err
	}
	// The node's timeout is a ceiling a project cannot raise.
	settings.EvalTimeout = min(settings.EvalTimeout, e.cfg.Timeout)
	spec := Spec{AllowIFD: settings.AllowIFD, Rev: commit}
	if isFlake {
		lock, locked, err := m.ReadFile(ctx, commit, "flake.lock")
		if err != nil {
			return Spec{}, Settings{}, err
		}
		if locked {
			if err := checkFlakeInputs(lock); err != nil {
				return Spec{}, Settings{}, err
			}
		}
		spec.Mode, spec.Force, spec.Source = "flake", 2, source
		if spec.FlakeRef, err = flakeRef(ctx, m, source, commit, branch); err != nil {
			return Spec{}, Settings{}, err
		}
	} else {
		// run exports the tree to Source.
		spec.Mode, spec.Force = "file", 1
		for _, f := range []string{"ci.nix", "default.nix"} {
			_, ok, err := m.ReadFile(ctx, commit, f)
			if err != nil {
				return Spec{}, Settings{}, err
			}
			if ok {
				spec.File = f
				break
			}
		}
		if spec.File == "" {
			return Spec{}, Settings{}, fmt.Errorf("commit %s has neither flake.nix, ci.nix nor default.nix", commit)
		}
	}
	if len(settings.Attrs) == 0 {
		spec.Roots = [][]string{{}}
	}
	for _, a := range settings.Attrs {
		p, _ := SplitAttrPath(a) // validated by ParseSettings
		spec.Roots = append(spec.Roots, p)
	}
	return spec, settings, nil
}

// flakeRef names commit in the mirror for builtins.getFlake. allRefs lets a Nix that reads it
// from the URL fetch any commit; Nix 2.8 ignores it there and fetches only the ref (by default
// refs/heads/master), so ref names one that contains the commit: the branch if it does.
func flakeRef(ctx context.Context, m *gitrepo.Mirror, source, commit, branch string) (string, error) {
	q := neturl.Values{"rev": {commit}, "allRefs": {"1"}}
	ref, err := m.RefContaining(ctx, commit, branch)
	if err != nil {
		return "", err
	}
	if ref != "" {
		q.Set("ref", ref)
	}
	return "git+file://" + source + "?" + q.Encode(), nil
}

// watchStatus cancels the evaluation once its row says it is no longer ours to run: query
// (sqlEvalStatus, or a helper's sqlEvalStatusAt) with args reads its status.
func (e *Evaluator) watchStatus(ctx context.Context, query string, args []any, cancel context.CancelCauseFunc) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.clock.After(e.cfg.StatusInterval):
		}
		var st status.EvalStatus
		err := e.pool.QueryRow(ctx, query, args...).Scan(&st)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && st != status.EvalRunning) {
			cancel(errGone)
			return
		}
	}
}

func (e *Evaluator) finish(ctx context.Context, c claim, sql string, st status.EvalStatus) error {
	return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, sql, c.id, c.node, c.attempt)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return errStale
		}
		return evaluation.Notify(ctx, tx, c.id, st)
	})
}

// fail rolls an evaluation back: its jobs that nothing else needs are cancelled, its
// attributes deleted, and it is marked failed with the error.
func (e *Evaluator) fail(ctx context.Context, c claim, msg string) error {
	return e.end(ctx, c, sqlFailEval, status.EvalFailed, msg)
}

// end rolls back an evaluation the claim c holds and records it as st with msg (query, one
// of sqlFailEval and sqlConflictEval, guarded by the claim, or sqlFailEvalHelped, guarded by a
// unit it walks), in one transaction.
func (e *Evaluator) end(ctx context.Context, c claim, query string, st status.EvalStatus, msg string) error {
	return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, query, c.id, c.node, c.attempt, msg)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return errStale
		}
		if err := evaluation.Rollback(ctx, tx, []int64{c.id}); err != nil {
			return err
		}
		return evaluation.Notify(ctx, tx, c.id, st)
	})
}

// release hands back a claim the slots refused to run.
func (e *Evaluator) release(c claim) {
	defer e.finished(c)
	e.handBack(c)
}

// handBack hands an evaluation, or a helper's units of it, back to the queue.
func (e *Evaluator) handBack(c claim) {
	if c.unit != nil {
		e.releaseUnits(c.id)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.pool.Exec(ctx, sqlReleaseEval, c.id, c.node, c.attempt); err != nil {
		e.logger.Warn("could not hand evaluation back", "eval_id", c.id, "error", err)
	}
}
