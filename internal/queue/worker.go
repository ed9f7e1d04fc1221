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
	"github.com/harmonia-ci/harmonia-ci/internal/slots"
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

// Worker ties a node's build slots to the queue through a slots.Runner: whenever a slot is free
// and the node is not draining, it claims; it wakes on notifications, on a freed slot, after
// every (re)connect of the notifier, and on a poll timer.
type Worker struct {
	startstop.Base
	cfg    WorkerConfig
	pool   *pgxpool.Pool
	logger *slog.Logger
	clock  clock.Clock
	slots  *slots.Runner[Job]

	charger      Charger
	ownAnnouncer bool
	metrics      *workerMetrics

	mu      sync.Mutex
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
	if clk == nil {
		clk = clock.Real{}
	}
	w := &Worker{
		cfg: cfg, pool: pool, clock: clk, ownAnnouncer: ownAnnouncer,
		metrics: newWorkerMetrics(cfg.Registerer),
		logger:  logger.With("service", "worker", "node_id", cfg.Claimer.NodeID),
	}
	w.slots = slots.New(slots.Config[Job]{
		Slots:        cfg.MaxJobs,
		PollInterval: cfg.PollInterval,
		Gate:         cfg.Gate,
		Interested:   w.interested,
		Claim: func(ctx context.Context, n int) ([]Job, error) {
			return claimJobs(ctx, w.pool, w.cfg.Claimer, n, w.cfg.ClaimForm)
		},
		Claimed: w.claimed,
		Run:     w.build,
		Release: w.releaseClaim,
	}, clk)
	return w, nil
}

// Start runs the claim loop until Stop. Stop cancels running handlers and releases their claims.
// A second Start is a no-op.
func (w *Worker) Start(ctx context.Context) error {
	_, err := w.Launch(ctx, func() (func(context.Context), error) {
		var sub *notify.Sub
		if w.cfg.Notifier != nil {
			var err error
			if sub, err = w.cfg.Notifier.Subscribe("build_jobs"); err != nil {
				return nil, fmt.Errorf("queue worker: %w", err)
			}
		}
		if w.ownAnnouncer {
			if err := w.cfg.Announcer.Start(ctx); err != nil {
				if sub != nil {
					sub.Close()
				}
				return nil, err
			}
		}
		return func(ctx context.Context) {
			if sub != nil {
				defer sub.Close()
			}
			charged := make(chan struct{})
			cctx, stopCharging := context.WithCancel(ctx)
			go func() {
				defer close(charged)
				w.chargeLoop(cctx)
			}()
			w.slots.Loop(ctx, sub) // returns once every running job has
			stopCharging()
			<-charged
			w.flushCharges()
			if w.ownAnnouncer {
				w.cfg.Announcer.Stop()
			}
		}, nil
	})
	return err
}

// Running is the number of jobs being built now.
func (w *Worker) Running() int { return w.slots.Running() }

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

// chargeLoop writes the batched charges every ChargeInterval until ctx ends.
func (w *Worker) chargeLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.clock.After(w.cfg.ChargeInterval):
			w.flushCharges()
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

// build runs a claimed job in its slot, then records the result. The slot is freed as soon as
// the handler no longer needs it (see Result.Continue); the gate is held until the job is
// recorded, so a draining node waits for its uploads.
func (w *Worker) build(ctx context.Context, job Job, freeSlot func()) {
	start := time.Now()
	res := w.cfg.Handler(ctx, job)
	if res.Continue != nil {
		next := res.Continue
		freeSlot()
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

// claimed reports a claim to the log, the metrics and the benchmark's hook.
func (w *Worker) claimed(d time.Duration, jobs []Job, err error) {
	if err != nil {
		w.logger.Warn("claim failed", "error", err)
		return
	}
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
