// Package commitstatus reports evaluations to their forge as commit statuses
// (harmonia-ci/nix-eval and harmonia-ci/nix-build). Every frontend listens to the build and
// evaluation notifications and recomputes the affected evaluations' statuses; the one whose
// UPDATE changes evaluations.last_status is the one that calls the forge, so each change is
// reported once however many frontends there are. A delivery that fails is retried with
// backoff by any frontend, and one a frontend died in the middle of is taken over after its
// lease, asking the forge first whether it arrived.
package commitstatus

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
	"github.com/harmonia-ci/harmonia-ci/internal/startstop"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// Defaults of Config's durations.
const (
	DefaultDebounce      = 5 * time.Second
	DefaultLease         = time.Minute
	DefaultRetryInterval = 5 * time.Second
	DefaultReconcile     = time.Minute
	DefaultCallTimeout   = 20 * time.Second
	// openWindow is how far back the reconciliation looks for evaluations whose report is not
	// final: older ones are left alone (their commit has long been superseded).
	openWindow = "7 days"
	maxBackoff = 10 * time.Minute
)

// Config configures a Reporter.
type Config struct {
	NodeID string
	Forges forge.Set
	Links  Links
	// Debounce collects an evaluation's build notifications this long before its report is
	// computed; evaluation status changes are computed at once.
	Debounce time.Duration
	// Lease bounds how long a frontend delivering an evaluation's statuses may go silent
	// before another one takes over.
	Lease time.Duration
	// RetryInterval: how often failed and orphaned deliveries are looked for.
	RetryInterval time.Duration
	// ReconcileInterval: how often unfinished reports are recomputed from the tables, in case
	// a notification was lost (also once at start).
	ReconcileInterval time.Duration
	// CallTimeout bounds one forge call.
	CallTimeout time.Duration
	Notifier    *notify.Notifier
	// Observe, if set, is told each status this node sends and the time since the
	// notification that caused it, minus the debounce (zero when no notification did).
	Observe func(evalID int64, s forge.Status, sinceNotify time.Duration)
	Logger  *slog.Logger
	// Registerer, if set, receives the forge calls' series (calls by result, latency).
	Registerer prometheus.Registerer
}

// Reporter is the frontend's commit status service.
type Reporter struct {
	startstop.Base
	cfg     Config
	pool    *pgxpool.Pool
	log     *slog.Logger
	forges  []string
	metrics *reporterMetrics

	mu      sync.Mutex
	due     map[int64]time.Time // evaluation → when to compute it
	busy    map[int64]bool      // evaluations being computed
	noticed map[int64]time.Time // evaluation → first unprocessed notification
	kick    chan struct{}
}

// New builds a reporter.
func New(cfg Config, pool *pgxpool.Pool) *Reporter {
	cfg.Lease = cmp.Or(cfg.Lease, DefaultLease)
	cfg.RetryInterval = cmp.Or(cfg.RetryInterval, DefaultRetryInterval)
	cfg.ReconcileInterval = cmp.Or(cfg.ReconcileInterval, DefaultReconcile)
	cfg.CallTimeout = cmp.Or(cfg.CallTimeout, DefaultCallTimeout)
	if cfg.Debounce < 0 {
		cfg.Debounce = 0
	}
	cfg.Links.Base = strings.TrimRight(cfg.Links.Base, "/")
	return &Reporter{cfg: cfg, pool: pool, log: cfg.Logger.With("service", "commit-status"),
		forges: cfg.Forges.Names(), metrics: newReporterMetrics(cfg.Registerer, cfg.Forges.Names()), due: map[int64]time.Time{}, busy: map[int64]bool{}, noticed: map[int64]time.Time{},
		kick: make(chan struct{}, 1)}
}

// Start subscribes to the notifications and runs until Stop. A second Start is a no-op.
func (r *Reporter) Start(ctx context.Context) error {
	if len(r.forges) == 0 {
		return nil // nothing to report to
	}
	_, err := r.Launch(ctx, func() (func(context.Context), error) {
		// A previous process of this node may have died holding deliveries: nobody else would
		// take them before its lease ran out.
		if _, err := r.pool.Exec(ctx, sqlReleaseMine, r.cfg.NodeID); err != nil {
			return nil, fmt.Errorf("commit statuses: release this node's old deliveries: %w", err)
		}
		jobs, err := r.cfg.Notifier.Subscribe("build_jobs")
		if err != nil {
			return nil, fmt.Errorf("commit statuses: %w", err)
		}
		evals, err := r.cfg.Notifier.Subscribe("evaluations")
		if err != nil {
			jobs.Close()
			return nil, fmt.Errorf("commit statuses: %w", err)
		}
		return func(ctx context.Context) {
			defer jobs.Close()
			defer evals.Close()
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); r.listen(ctx, jobs, evals) }()
			go func() { defer wg.Done(); r.sweep(ctx) }()
			r.work(ctx)
			wg.Wait()
		}, nil
	})
	return err
}

// listen turns notifications into due evaluations.
func (r *Reporter) listen(ctx context.Context, jobs, evals *notify.Sub) {
	for {
		select {
		case <-ctx.Done():
			return
		case n := <-jobs.C:
			drvs := terminalDrvs(n.Payload)
			if len(drvs) == 0 {
				continue
			}
			now := time.Now()
			ids, err := r.evalsOf(ctx, drvs)
			if err != nil {
				if ctx.Err() == nil {
					r.log.Warn("could not map finished builds to evaluations", "error", err)
				}
				continue
			}
			r.schedule(ids, now, r.cfg.Debounce)
		case n := <-evals.C:
			var p struct {
				ID int64 `json:"id"`
			}
			if json.Unmarshal([]byte(n.Payload), &p) == nil && p.ID > 0 {
				r.schedule([]int64{p.ID}, time.Now(), 0)
			}
		case <-jobs.Resync:
			r.reconcileSoon()
		case <-evals.Resync:
			r.reconcileSoon()
		}
	}
}

// terminalDrvs returns the derivations a build_jobs notification says finished: the
// announcer's {"status","drv_paths"} and the single {"drv_path","status"} forms.
func terminalDrvs(payload string) []string {
	var p struct {
		Status   status.JobStatus `json:"status"`
		DrvPath  string           `json:"drv_path"`
		DrvPaths []string         `json:"drv_paths"`
	}
	if json.Unmarshal([]byte(payload), &p) != nil {
		return nil
	}
	// A job that ended, or went back to pending (a rebuild), changes the counts; a claim does not.
	if !p.Status.Terminal() && p.Status != status.JobPending {
		return nil
	}
	if p.DrvPath != "" {
		p.DrvPaths = append(p.DrvPaths, p.DrvPath)
	}
	return p.DrvPaths
}

func (r *Reporter) evalsOf(ctx context.Context, drvs []string) ([]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rows, err := r.pool.Query(ctx, sqlEvalsOfDrvs, drvs, r.forges)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// schedule makes evaluations due after delay, keeping an earlier due time: a burst of
// notifications makes one computation at the end of the first one's window.
func (r *Reporter) schedule(ids []int64, noticed time.Time, delay time.Duration) {
	r.mu.Lock()
	at := noticed.Add(delay)
	for _, id := range ids {
		if cur, ok := r.due[id]; !ok || at.Before(cur) {
			r.due[id] = at
		}
		if _, ok := r.noticed[id]; !ok {
			r.noticed[id] = noticed.Add(delay) // the debounce is not the reporter's latency
		}
	}
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// reconcileSoon makes every open evaluation due (after a missed notification).
func (r *Reporter) reconcileSoon() {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := r.Reconcile(ctx); err != nil {
			r.log.Warn("reconciliation failed", "error", err)
		}
	}()
}

// workers bounds the evaluations one frontend reports at once: a slow forge call holds one
// of them, not the whole reporter.
const workers = 8

// work computes due evaluations in due order, up to workers at a time, never one evaluation
// twice at once.
func (r *Reporter) work(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	sem := make(chan struct{}, workers)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		id, wait, ok := r.next()
		if ok {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem; r.done(id) }()
				if err := r.Transition(ctx, id); err != nil && ctx.Err() == nil {
					r.log.Warn("could not report evaluation", "evaluation", id, "error", err)
				}
			}()
			continue
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		case <-timer.C:
		}
	}
}

// done ends evaluation id's computation; one that became due meanwhile is due now.
func (r *Reporter) done(id int64) {
	r.mu.Lock()
	delete(r.busy, id)
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// next returns the evaluation due first, or how long until one is.
func (r *Reporter) next() (int64, time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	var best int64
	var at time.Time
	for id, t := range r.due {
		if r.busy[id] {
			continue // computed now; it runs again when that ends
		}
		if best == 0 || t.Before(at) {
			best, at = id, t
		}
	}
	if best == 0 {
		return 0, time.Hour, false
	}
	if at.After(now) {
		return 0, at.Sub(now), false
	}
	delete(r.due, best)
	r.busy[best] = true
	return best, 0, true
}

// takeNoticed returns and forgets when the notification behind an evaluation's computation
// arrived (debounce added), zero if none.
func (r *Reporter) takeNoticed(id int64) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.noticed[id]
	delete(r.noticed, id)
	return t
}

// sweep retries failed and orphaned deliveries, and reconciles at start and periodically.
func (r *Reporter) sweep(ctx context.Context) {
	retry := time.NewTicker(r.cfg.RetryInterval)
	defer retry.Stop()
	reconcile := time.NewTicker(r.cfg.ReconcileInterval)
	defer reconcile.Stop()
	do := func(f func(context.Context) error, what string) {
		if err := f(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn(what+" failed", "error", err)
		}
	}
	do(r.Reconcile, "reconciliation")
	do(r.Retry, "status retry")
	for {
		select {
		case <-ctx.Done():
			return
		case <-retry.C:
			do(r.Retry, "status retry")
		case <-reconcile.C:
			do(r.Reconcile, "reconciliation")
		}
	}
}

// Reconcile makes every recent evaluation whose report is not final due now.
func (r *Reporter) Reconcile(ctx context.Context) error {
	rows, err := r.pool.Query(ctx, sqlOpen, r.forges, openWindow)
	if err != nil {
		return fmt.Errorf("open reports: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return fmt.Errorf("open reports: %w", err)
	}
	if len(ids) > 0 {
		r.mu.Lock()
		now := time.Now()
		for _, id := range ids {
			if _, ok := r.due[id]; !ok {
				r.due[id] = now
			}
		}
		r.mu.Unlock()
		select {
		case r.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// Retry delivers what failed before (after its backoff) or what a dead frontend held.
func (r *Reporter) Retry(ctx context.Context) error {
	rows, err := r.pool.Query(ctx, sqlBehind, r.forges)
	if err != nil {
		return fmt.Errorf("deliveries behind: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return fmt.Errorf("deliveries behind: %w", err)
	}
	for _, id := range ids {
		var took bool
		err := r.pool.QueryRow(ctx, sqlTakeOver, id, r.cfg.NodeID, r.cfg.Lease.String()).Scan(&took)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // another frontend was quicker
		}
		if err != nil {
			return fmt.Errorf("take over delivery of evaluation %d: %w", id, err)
		}
		r.deliver(ctx, id, time.Time{})
	}
	return nil
}

// Transition recomputes evaluation id's report and, if this node's UPDATE changed it,
// delivers it.
func (r *Reporter) Transition(ctx context.Context, id int64) error {
	noticed := r.takeNoticed(id)
	var won bool
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		var s evalState
		err := tx.QueryRow(ctx, sqlLockEval, id).Scan(&s.ID, &s.Status, &s.Error, &s.ReusesEval, &s.Project,
			&s.Forge, &s.FullName, &s.Commit, &s.InstallationID, &s.LastStatus, &s.ReportedStatus, &s.ReportAttempts)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // deleted meanwhile
		}
		if err != nil {
			return fmt.Errorf("lock evaluation: %w", err)
		}
		if _, ok := r.cfg.Forges[s.Forge]; !ok {
			_, err := tx.Exec(ctx, sqlMarkFinal, id)
			return err // not a forge this node reports to
		}
		// A statement of its own, so its snapshot is taken after the lock was granted.
		err = tx.QueryRow(ctx, sqlAggregate, id).Scan(&s.Attrs, &s.AttrErrors, &s.Total, &s.Succeeded,
			&s.Failed, &s.Cancelled, &s.Pending, &s.FirstFailedJob, &s.Flaky)
		if err != nil {
			return fmt.Errorf("aggregate builds: %w", err)
		}
		if s.Pending == 0 && (s.Status == status.EvalSucceeded || s.Status == status.EvalSkipped) {
			// Once every build is done, the nix-build line says what changed since the
			// evaluation before it.
			d, err := evaluation.DiffOf(ctx, tx, id)
			if err != nil {
				return err
			}
			s.NewlyFailing, s.NewlyFixed = len(d.NewlyFailing)+len(d.AddedFailing), len(d.NewlyFixed)
		}
		rep := compute(s, r.cfg.Links)
		err = tx.QueryRow(ctx, sqlTransition, id, rep.encode(), rep.Final(), r.cfg.NodeID, r.cfg.Lease.String()).Scan(&won)
		if errors.Is(err, pgx.ErrNoRows) {
			won = false // unchanged: nothing to report
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("status of evaluation %d: %w", id, err)
	}
	if won {
		r.deliver(ctx, id, noticed)
	}
	return nil
}

// deliver sends, while this node holds the lease, what the forge has not been told, until it
// has been told the latest report.
func (r *Reporter) deliver(ctx context.Context, id int64, noticed time.Time) {
	for ctx.Err() == nil {
		var last, reported *string
		var attempts int
		var commit, forgeName, fullName string
		var installation int64
		err := r.pool.QueryRow(ctx, sqlLeased, id, r.cfg.NodeID).Scan(&last, &reported, &attempts, &commit,
			&forgeName, &fullName, &installation)
		if errors.Is(err, pgx.ErrNoRows) {
			return // the lease was lost (taken over after a long stall): the new holder delivers
		}
		if err != nil {
			r.log.Warn("could not read the report to deliver", "evaluation", id, "error", err)
			return
		}
		want, have := decodeReport(last), decodeReport(reported)
		if want == have {
			tag, err := r.pool.Exec(ctx, sqlRelease, id, r.cfg.NodeID)
			if err != nil || tag.RowsAffected() > 0 {
				return
			}
			continue // a newer report arrived meanwhile
		}
		f, ok := r.cfg.Forges[forgeName]
		if !ok {
			r.fail(ctx, id, attempts, fmt.Errorf("forge %q is not configured here", forgeName))
			return
		}
		owner, name, _ := strings.Cut(fullName, "/")
		repo := forge.Repo{Owner: owner, Name: name, InstallationID: installation}
		wantLines, haveLines := want.lines(), have.lines()
		for i, wl := range wantLines {
			if wl.line.State == "" || *wl.line == *haveLines[i].line {
				continue
			}
			st := wl.line.status(wl.context)
			if err := r.send(ctx, id, f, repo, commit, st, attempts > 0, noticed); err != nil {
				r.fail(ctx, id, attempts, err) // what was sent before is recorded already
				return
			}
			*haveLines[i].line = *wl.line
			// Recorded per context, so a failure of the next one does not send this one again.
			if _, err := r.pool.Exec(ctx, sqlDelivered, id, r.cfg.NodeID, have.encode()); err != nil {
				r.log.Warn("could not record a delivery", "evaluation", id, "error", err)
				return
			}
		}
		if _, err := r.pool.Exec(ctx, sqlDelivered, id, r.cfg.NodeID, want.encode()); err != nil {
			r.log.Warn("could not record a delivery", "evaluation", id, "error", err)
			return
		}
		noticed = time.Time{}
	}
}

// send renews the lease and makes one forge call. A recovering delivery (one that failed or
// whose frontend died) first asks the forge whether the status is there already.
func (r *Reporter) send(ctx context.Context, id int64, f forge.Forge, repo forge.Repo, commit string, st forge.Status, recovering bool, noticed time.Time) error {
	tag, err := r.pool.Exec(ctx, sqlRenewLease, id, r.cfg.NodeID, r.cfg.Lease.String())
	if err != nil {
		return fmt.Errorf("renew the delivery lease: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return errors.New("delivery lease lost")
	}
	cctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	defer cancel()
	if recovering {
		cur, ok, err := f.LatestStatus(cctx, repo, commit, st.Context)
		if err != nil {
			return err
		}
		if ok && cur.State == st.State && cur.Description == st.Description && cur.TargetURL == st.TargetURL {
			r.log.Info("status already on the forge", "evaluation", id, "context", st.Context, "state", st.State)
			return nil
		}
	}
	if r.cfg.Observe != nil {
		var since time.Duration
		if !noticed.IsZero() {
			since = time.Since(noticed)
		}
		r.cfg.Observe(id, st, since)
	}
	start := time.Now()
	err = f.ReportStatus(cctx, repo, commit, st)
	r.metrics.called(f.Name(), time.Since(start), err)
	if err != nil {
		return err
	}
	r.log.Info("commit status reported", "evaluation", id, "repository", repo.FullName(), "commit", commit,
		"context", st.Context, "state", st.State, "description", st.Description)
	return nil
}

func (r *Reporter) fail(ctx context.Context, id int64, attempts int, err error) {
	backoff := min(time.Duration(1<<min(attempts, 10))*r.cfg.RetryInterval, maxBackoff)
	r.log.Warn("commit status delivery failed; retrying later", "evaluation", id, "attempt", attempts+1,
		"retry_in", backoff.String(), "error", err)
	if _, err := r.pool.Exec(ctx, sqlFailed, id, r.cfg.NodeID, backoff.String()); err != nil {
		r.log.Warn("could not record the failed delivery", "evaluation", id, "error", err)
	}
}
