package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
	"github.com/harmonia-ci/harmonia-ci/internal/startstop"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// Result is what a Handler made of a job. A nil Err is success.
type Result struct {
	Err      error
	Kind     FailKind // for a non-nil Err
	ExitCode *int
	// Message is the failure as users see it; "" means Err's text.
	Message string
	// LogKey names the failed build's uploaded log, if any.
	LogKey string
	// Recorded means the handler's success is already in the database (the signer marked the
	// job succeeded at build-complete): the worker only charges the project for the time.
	Recorded bool
	// Abandoned means the claim was lost while the handler ran (the job was cancelled or
	// reclaimed): there is nothing to record.
	Abandoned bool
	// Finally, if set, runs once the result is recorded (or found stale), with a context that
	// outlives the worker's stop: the builder deletes the live log tail there, which tells log
	// watchers the build is over.
	Finally func(ctx context.Context)
	// Continue, if set, finishes the job off the build slot: the worker frees the slot (and
	// claims the next job) at once, then runs Continue, whose result is the job's. A builder
	// uploads and signs there, so the next build does not wait on the network.
	Continue func(ctx context.Context) Result
}

// Handler builds one claimed job. Its context ends when the worker stops; a handler that
// returns because of that has its claim released, not failed.
type Handler func(ctx context.Context, job Job) Result

// WorkerConfig configures a Worker.
type WorkerConfig struct {
	// Claimer is the node's identity, systems and features.
	Claimer Claimer
	// MaxJobs is the number of build slots. Default 1.
	MaxJobs int
	// PollInterval: the worker claims at least this often even without a wake-up, the fallback
	// for a lost notification. Default 5s.
	PollInterval time.Duration
	// Handler builds a job. Required.
	Handler Handler
	// Gate admits work; once it is closed (the node drains) nothing more is claimed. Default: a
	// gate of the worker's own.
	Gate *cluster.InFlight
	// Notifier wakes the worker on build_jobs notifications; nil means polling only.
	Notifier *notify.Notifier
	// ClaimForm selects the claim statement (the benchmark compares forms). Default ClaimReady.
	ClaimForm ClaimForm
	// Announcer sends the notifications of finished jobs; nil runs one of the worker's own.
	Announcer *Announcer
	// ChargeInterval: builder time is added to projects' consumed seconds at least this often
	// (batched; see Charger). Default 1s.
	ChargeInterval time.Duration
	// ClaimFunc, if set, is called after every claim with its latency and the jobs it returned
	// (the benchmark's instrumentation).
	ClaimFunc func(latency time.Duration, jobs []Job)
	// Registerer, if set, receives the worker's series (claims, build durations, failures).
	Registerer prometheus.Registerer
}

// Worker ties a node's build slots to the queue: whenever a slot is free and the node is not
// draining, it claims; it wakes on notifications, on a freed slot, after every (re)connect of
// the notifier, and on a poll timer.
type Worker struct {
	startstop.Base
	cfg    WorkerConfig
	pool   *pgxpool.Pool
	logger *slog.Logger
	clock  clock.Clock

	wake         chan struct{}
	jobs         sync.WaitGroup
	charger      Charger
	ownAnnouncer bool
	metrics      *workerMetrics

	mu      sync.Mutex
	running int
	avgSecs float64 // rolling average of build durations
}

// NewWorker builds a worker; Start runs it.
func NewWorker(cfg WorkerConfig, pool *pgxpool.Pool, logger *slog.Logger, clk clock.Clock) (*Worker, error) {
	var ownAnnouncer bool
	if cfg.Handler == nil {
		return nil, errors.New("queue worker: no handler")
	}
	if len(cfg.Claimer.Systems) == 0 {
		return nil, errors.New("queue worker: no systems to build for")
	}
	if cfg.MaxJobs <= 0 {
		cfg.MaxJobs = 1
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 5 * time.Second
	}
	if cfg.Gate == nil {
		cfg.Gate = &cluster.InFlight{}
	}
	if cfg.Announcer == nil {
		cfg.Announcer = NewAnnouncer(pool, 0, logger)
		ownAnnouncer = true
	}
	if cfg.ChargeInterval <= 0 {
		cfg.ChargeInterval = time.Second
	}
	return &Worker{
		cfg: cfg, pool: pool, clock: clk, wake: make(chan struct{}, 1), ownAnnouncer: ownAnnouncer,
		metrics: newWorkerMetrics(cfg.Registerer),
		logger:  logger.With("service", "worker", "node_id", cfg.Claimer.NodeID),
	}, nil
}

// Start runs the claim loop until Stop. Stop cancels running handlers and releases their claims.
func (w *Worker) Start(ctx context.Context) error {
	var sub *notify.Sub
	if w.cfg.Notifier != nil {
		var err error
		if sub, err = w.cfg.Notifier.Subscribe("build_jobs"); err != nil {
			return fmt.Errorf("queue worker: %w", err)
		}
	}
	if w.ownAnnouncer {
		if err := w.cfg.Announcer.Start(ctx); err != nil {
			return err
		}
	}
	w.Run(ctx, func(ctx context.Context) {
		if sub != nil {
			defer sub.Close()
		}
		w.loop(ctx, sub)
		w.jobs.Wait()
		w.flushCharges()
		if w.ownAnnouncer {
			w.cfg.Announcer.Stop()
		}
	})
	return nil
}

// Running is the number of jobs being built now.
func (w *Worker) Running() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.running
}

// SpeedFactor is builds per minute at the pace of recent builds (0 before the first), so a
// faster or less loaded node shows a higher factor.
func (w *Worker) SpeedFactor() float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.avgSecs <= 0 {
		return 0
	}
	return 60 / math.Max(w.avgSecs, 0.001)
}

func (w *Worker) loop(ctx context.Context, sub *notify.Sub) {
	var notes <-chan notify.Notification
	var resync <-chan struct{}
	if sub != nil {
		notes, resync = sub.C, sub.Resync
	}
	charge := w.clock.After(w.cfg.ChargeInterval)
	poll := w.clock.After(w.cfg.PollInterval)
	claim := true
	for {
		if claim {
			w.fill(ctx)
		}
		claim = true
		select {
		case <-ctx.Done():
			return
		case n := <-notes:
			claim = w.interested(n.Payload)
		case <-resync:
		case <-w.wake:
		case <-poll:
			poll = w.clock.After(w.cfg.PollInterval)
		case <-charge:
			w.flushCharges()
			charge = w.clock.After(w.cfg.ChargeInterval)
			claim = false // the charge timer is no claim trigger: it would hide lost wake-ups
		}
	}
}

// flushCharges writes the pending charges. Stop must not cancel it halfway: a charge that
// committed but reported the cancellation would be kept and written twice.
func (w *Worker) flushCharges() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.charger.Flush(ctx, w.pool); err != nil {
		w.logger.Warn("could not charge builder time", "error", err)
	}
}

// interested reports whether a build_jobs notification can mean a job this worker may claim:
// a new or requeued job of one of its systems, or a success that may have readied dependents.
func (w *Worker) interested(payload string) bool {
	var p struct {
		System string           `json:"system"`
		Status status.JobStatus `json:"status"`
	}
	if json.Unmarshal([]byte(payload), &p) != nil {
		return true
	}
	switch p.Status {
	case status.JobSucceeded:
		return true
	case "":
		return p.System == "" || slices.Contains(w.cfg.Claimer.Systems, p.System)
	default:
		return false // failures and cancellations ready nothing
	}
}

// fill claims jobs for the free slots, unless the node drains.
func (w *Worker) fill(ctx context.Context) {
	for ctx.Err() == nil {
		w.mu.Lock()
		free := w.cfg.MaxJobs - w.running
		w.mu.Unlock()
		if free <= 0 || w.cfg.Gate.Closed() {
			return
		}
		start := time.Now()
		jobs, err := claimJobs(ctx, w.pool, w.cfg.Claimer, free, w.cfg.ClaimForm)
		if err == nil {
			w.claimed(time.Since(start), jobs)
		}
		if err != nil {
			if ctx.Err() == nil {
				w.logger.Warn("claim failed", "error", err)
			}
			return
		}
		for _, job := range jobs {
			w.launch(ctx, job)
		}
		if len(jobs) < free {
			return // nothing more is ready
		}
	}
}

// launch builds a claimed job in a slot of its own.
func (w *Worker) launch(ctx context.Context, job Job) {
	release, ok := w.cfg.Gate.Acquire()
	if !ok {
		// The node began draining between the check and the claim.
		w.releaseClaim(job)
		return
	}
	w.mu.Lock()
	w.running++
	w.mu.Unlock()
	w.jobs.Add(1)
	go w.build(ctx, job, release)
}

func (w *Worker) build(ctx context.Context, job Job, release func()) {
	defer w.jobs.Done()
	// The gate is held until the job is recorded: a draining node waits for its uploads.
	defer release()
	var freeOnce sync.Once
	freeSlot := func() {
		freeOnce.Do(func() {
			w.mu.Lock()
			w.running--
			w.mu.Unlock()
			select {
			case w.wake <- struct{}{}:
			default:
			}
		})
	}
	defer freeSlot()
	start := time.Now()
	res := w.cfg.Handler(ctx, job)
	slotHeld := true
	if res.Continue != nil {
		next := res.Continue
		freeSlot()
		slotHeld = false
		res = next(ctx)
		res.Continue = nil
	}
	// Finishing must happen even when the worker is stopping.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if res.Finally != nil {
		defer res.Finally(fctx)
	}
	if ctx.Err() != nil {
		w.releaseClaim(job)
		return
	}
	elapsed := time.Since(start)
	if res.Abandoned {
		w.logger.Info("build abandoned: the job was cancelled or reclaimed", "job_id", job.ID, "attempt", job.Attempt, "drv_path", job.DrvPath)
		return
	}
	if res.Err == nil && res.Recorded {
		w.metrics.finished(job, res, elapsed, 0)
		w.charger.Add(job.ProjectID, elapsed.Seconds())
		w.recordDuration(elapsed)
		return
	}
	if res.Err == nil && slotHeld && w.cfg.ClaimForm == ClaimReady && !w.cfg.Gate.Closed() {
		// The slot this job frees is filled in the same round trip; the successor is
		// launched before the deferred freeSlot, so the count of running jobs never dips.
		start := time.Now()
		out, next, err := SucceedAndClaim(fctx, w.pool, job.Claim(), w.cfg.Claimer, 1)
		if err == nil || errors.Is(err, ErrStale) {
			w.claimed(time.Since(start), next)
			for _, j := range next {
				w.launch(ctx, j)
			}
		}
		if err == nil {
			w.succeeded(job, res, elapsed, out)
			return
		}
		if errors.Is(err, ErrStale) {
			w.logger.Warn("finished a job whose claim no longer holds; nothing recorded", "job_id", job.ID, "attempt", job.Attempt)
			return
		}
		w.logger.Warn("could not record a success and claim the next job; recording the success alone", "job_id", job.ID, "error", err)
	}
	out, err := retryFinish(fctx, func() (Outcome, error) {
		if res.Err == nil {
			return Succeed(fctx, w.pool, job.Claim())
		}
		msg := res.Message
		if msg == "" {
			msg = res.Err.Error()
		}
		return Fail(fctx, w.pool, job.Claim(), Failure{Kind: res.Kind, ExitCode: res.ExitCode, Message: msg, LogKey: res.LogKey})
	})
	if err == nil {
		if res.Err == nil {
			w.succeeded(job, res, elapsed, out)
		} else {
			w.metrics.finished(job, res, elapsed, out.DepFailed)
			w.charger.Add(out.ProjectID, out.Seconds)
			w.logger.Info("build failed", "job_id", job.ID, "drv_path", job.DrvPath, "status", out.Status, "error", res.Err)
		}
	}
	if errors.Is(err, ErrStale) {
		w.logger.Warn("finished a job whose claim no longer holds; nothing recorded", "job_id", job.ID, "attempt", job.Attempt)
	} else if err != nil {
		w.logger.Error("could not record a finished job", "job_id", job.ID, "error", err)
	}
}

// succeeded accounts for a success the worker recorded: metrics, the project's charge, the
// announcement that wakes the workers its dependents may wait for.
func (w *Worker) succeeded(job Job, res Result, elapsed time.Duration, out Outcome) {
	w.metrics.finished(job, res, elapsed, out.DepFailed)
	w.charger.Add(out.ProjectID, out.Seconds)
	w.cfg.Announcer.Finished(out.DrvPath, out.Status)
	w.recordDuration(elapsed)
}

// claimed reports a claim to the metrics and the benchmark's hook.
func (w *Worker) claimed(d time.Duration, jobs []Job) {
	w.metrics.claimed(d, jobs)
	if w.cfg.ClaimFunc != nil {
		w.cfg.ClaimFunc(d, jobs)
	}
}

// retryFinish retries a finish that failed for a reason that says nothing about the claim (a
// deadlock, a serialization failure, a lost connection): giving up would strand the job in
// building until the node dies.
func retryFinish(ctx context.Context, finish func() (Outcome, error)) (Outcome, error) {
	delay := 50 * time.Millisecond
	for {
		out, err := finish()
		if err == nil || !retryable(err) {
			return out, err
		}
		select {
		case <-ctx.Done():
			return out, err
		case <-time.After(delay):
		}
		delay = min(2*delay, 2*time.Second)
	}
}

// retryable reports whether err is worth retrying: a deadlock or serialization failure, or a
// connection that failed (the statement may not have run; the guards make a rerun safe).
func retryable(err error) bool {
	// No connection at all (the server is down, restarting or refusing connections): nothing
	// was sent.
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// 57P01-57P03: the server is shutting down or starting up.
		return pgErr.Code == "40P01" || pgErr.Code == "40001" || strings.HasPrefix(pgErr.Code, "08") ||
			pgErr.Code == "57P01" || pgErr.Code == "57P02" || pgErr.Code == "57P03"
	}
	return pgconn.SafeToRetry(err) || errors.Is(err, io.ErrUnexpectedEOF)
}

func (w *Worker) releaseClaim(job Job) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := Release(ctx, w.pool, job.Claim()); err != nil && !errors.Is(err, ErrStale) {
		w.logger.Error("could not release a claim", "job_id", job.ID, "error", err)
	}
}

// recordDuration folds a build's duration into the rolling average (weight 0.2 for the newest).
func (w *Worker) recordDuration(d time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := d.Seconds()
	if w.avgSecs == 0 {
		w.avgSecs = s
		return
	}
	w.avgSecs = 0.8*w.avgSecs + 0.2*s
}
