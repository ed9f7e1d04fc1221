package builder

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/signerclient"
	"github.com/harmonia-ci/harmonia-ci/internal/startstop"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/upload"
)

// Config configures a Builder.
type Config struct {
	// NodeID is the node the builder claims as.
	NodeID string
	// Store is the Nix store builds run in. Its Substituters and TrustedKeys are set per job:
	// the cluster's live cache nodes and signing keys, then Upstream.
	Store Store
	// CacheToken, if set, is sent (as a bearer token) to the cluster's cache nodes, and to no
	// other substituter: the node's token, with which it reads private projects' paths.
	CacheToken string
	// Upstream are substituters trusted besides the cluster's caches ([substituters]), with
	// the keys that sign them.
	Upstream, UpstreamKeys []string
	// Limits bound every build ([build] timeout, max_silent, max_output_size).
	Limits BuildLimits
	// MaxLogSize caps a build's log ([build] max_log_size); past it the log is truncated with a
	// marker and the build goes on. Default 64 MiB.
	MaxLogSize int64
	// TailInterval is how often the live log tail is written. Default 2s.
	TailInterval time.Duration
	// CheckInterval is how often running jobs' claims are checked, so a build cancelled or
	// reclaimed in the database is killed. Default cluster.DefaultHeartbeatInterval.
	CheckInterval time.Duration
	// DeadThreshold is the silence after which a cache node is not substituted from
	// (cluster.heartbeat.dead_threshold). Default cluster.DefaultDeadThreshold.
	DeadThreshold time.Duration
	// Signer uploads and completes builds. Required.
	Signer *signerclient.Client
	// Notifier, if set, delivers cancellations at once instead of at the next check.
	Notifier *notify.Notifier
	// RetryPause is the pause before a transient failure is recorded, doubled with each retry
	// (see backOff). Default 1s.
	RetryPause time.Duration
	// Observe, if set, receives each job's step timings (the benchmark's instrumentation).
	Observe func(Timings)
	// MinFree and MaxFree bound the store ([build] min_free, max_free): when the free space of
	// its file system is below MinFree, the garbage no running job roots is collected until
	// MaxFree is free (see storeGC). MinFree 0 turns this off; MaxFree is at least MinFree.
	MinFree, MaxFree int64
	// Registerer, if set, receives the builder's series (harmonia_ci_build_step_seconds, the
	// store's harmonia_ci_builder_store_*).
	Registerer prometheus.Registerer
}

// Timings is where one job's time went, for the per-job overhead figures.
type Timings struct {
	JobID                      int64
	Fetch, Build, Upload, Sign time.Duration
	Succeeded                  bool
}

// Builder runs claimed build jobs: it is the queue.Handler of the builder role's worker, and a
// service that kills builds whose claim is gone (cancelled by a user, or reclaimed after this
// node was presumed dead).
type Builder struct {
	startstop.Base
	cfg    Config
	pool   *pgxpool.Pool
	logger *slog.Logger
	clock  clock.Clock

	mu      sync.Mutex
	running map[int64]*runningJob

	steps *prometheus.HistogramVec // nil without a registerer

	gc *storeGC
	// gcWake asks the service loop for a free-space check (a job is about to start).
	gcWake chan struct{}

	sessions *sessionPool
	// daemon is what the store's daemon said of itself at start.
	daemon DaemonInfo

	// sources caches the cluster's caches and keys for sourcesTTL, so a job costs no query
	// for them.
	sourcesMu sync.Mutex
	sources   sources
}

// sources are where inputs come from and the keys that sign them, as read at some time.
type sources struct {
	caches, keys []string
	at           time.Time
}

// sourcesTTL is how long the cluster's caches and keys are reused: a cache node that died
// meanwhile only costs a job a retry on the next one.
const sourcesTTL = 5 * time.Second

type runningJob struct {
	claim   queue.Claim
	drvPath string
	cancel  context.CancelCauseFunc
}

// errClaimLost ends a build whose claim no longer holds.
var errClaimLost = errors.New("the job was cancelled or reclaimed")

// New builds a Builder; Start runs its claim checks, Handle builds a job.
func New(cfg Config, pool *pgxpool.Pool, logger *slog.Logger, clk clock.Clock) (*Builder, error) {
	if cfg.NodeID == "" {
		return nil, errors.New("builder: no node id")
	}
	if cfg.Signer == nil {
		return nil, errors.New("builder: no signer client (the builder needs the cluster token)")
	}
	if cfg.MaxLogSize <= 0 {
		cfg.MaxLogSize = 64 << 20
	}
	if cfg.TailInterval <= 0 {
		cfg.TailInterval = 2 * time.Second
	}
	cfg.CheckInterval = cmp.Or(cfg.CheckInterval, cluster.DefaultHeartbeatInterval)
	if cfg.RetryPause <= 0 {
		cfg.RetryPause = time.Second
	}
	cfg.DeadThreshold = cmp.Or(cfg.DeadThreshold, cluster.DefaultDeadThreshold)
	var steps *prometheus.HistogramVec
	if cfg.Registerer != nil {
		steps = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "harmonia_ci_build_step_seconds",
			Help:    "Time a build attempt on this node spent in each step that ran (fetch, build, upload, sign), by the job's system.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 10),
		}, []string{"step", "system"})
		cfg.Registerer.MustRegister(steps)
	}
	logger = logger.With("service", "builder", "node_id", cfg.NodeID)
	b := &Builder{
		cfg: cfg, pool: pool, clock: clk, running: map[int64]*runningJob{}, steps: steps, logger: logger,
		gc:       newStoreGC(cfg.Store, cfg.MinFree, cfg.MaxFree, logger, clk, cfg.Registerer),
		gcWake:   make(chan struct{}, 1),
		sessions: newSessionPool(),
	}
	b.gc.beforeCollect = b.sessions.retire
	b.withCacheAuth()
	return b, nil
}

// Daemon is what the store's Nix daemon said of itself when the builder started.
func (b *Builder) Daemon() DaemonInfo { return b.daemon }

// Start checks the store's daemon (a Nix older than MinNixVersion is refused), removes the GC
// roots a crashed predecessor left and runs the claim checks and the store's free-space checks
// until Stop. A second Start is a no-op.
func (b *Builder) Start(ctx context.Context) error {
	_, err := b.Launch(ctx, func() (func(context.Context), error) { return b.prepare(ctx) })
	return err
}

// prepare does Start's checks and subscription and returns the loop.
func (b *Builder) prepare(ctx context.Context) (func(context.Context), error) {
	d, err := b.cfg.Store.Init(ctx)
	if err != nil {
		return nil, fmt.Errorf("builder: %w", err)
	}
	b.daemon = d
	b.logger.Info("building with Nix", "nix_version", d.Version, "protocol", d.Protocol,
		"daemon", cmp.Or(b.cfg.Store.Daemon, "its own"), "trusted", d.Trusted)
	if err := b.cfg.Store.ClearRoots(b.cfg.NodeID + "-job-"); err != nil {
		b.logger.Warn("could not remove stale GC roots", "error", err)
	}
	var sub *notify.Sub
	if b.cfg.Notifier != nil {
		if sub, err = b.cfg.Notifier.Subscribe("build_jobs"); err != nil {
			return nil, fmt.Errorf("builder: %w", err)
		}
	}
	return func(ctx context.Context) {
		defer b.sessions.close()
		defer b.gc.wait()
		var notes <-chan notify.Notification
		if sub != nil {
			defer sub.Close()
			notes = sub.C
		}
		b.gc.check(ctx)
		tick := b.clock.After(b.cfg.CheckInterval)
		for {
			select {
			case <-ctx.Done():
				return
			case n := <-notes:
				if cancelled(n.Payload) {
					b.checkClaims(ctx)
				}
			case <-b.gcWake:
				b.gc.check(ctx)
			case <-tick:
				b.checkClaims(ctx)
				b.gc.check(ctx)
				tick = b.clock.After(b.cfg.CheckInterval)
			}
		}
	}, nil
}

// cancelled reports whether a build_jobs notification may announce a cancelled job.
func cancelled(payload string) bool {
	var p struct {
		Status status.JobStatus `json:"status"`
	}
	return json.Unmarshal([]byte(payload), &p) != nil || p.Status == status.JobCancelled
}

// checkClaims kills the builds whose claim no longer holds, in one query for all of them.
func (b *Builder) checkClaims(ctx context.Context) {
	b.mu.Lock()
	ids := slices.Collect(maps.Keys(b.running))
	attempts := make([]int, len(ids))
	for i, id := range ids {
		attempts[i] = b.running[id].claim.Attempt
	}
	b.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	rows, err := b.pool.Query(ctx, sqlLostClaims, ids, attempts, b.cfg.NodeID)
	if err != nil {
		if ctx.Err() == nil {
			b.logger.Warn("could not check running jobs' claims", "error", err)
		}
		return
	}
	var lost []queue.Claim
	var c queue.Claim
	_, err = pgx.ForEachRow(rows, []any{&c.JobID, &c.Attempt}, func() error {
		lost = append(lost, c)
		return nil
	})
	if err != nil {
		b.logger.Warn("could not check running jobs' claims", "error", err)
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range lost {
		// The job may have been claimed again since the snapshot: only the attempt that lost
		// its claim is killed.
		if j := b.running[c.JobID]; j != nil && j.claim.Attempt == c.Attempt {
			b.logger.Info("killing a build whose job was cancelled or reclaimed", "job_id", c.JobID, "attempt", c.Attempt, "drv_path", j.drvPath)
			j.cancel(errClaimLost)
		}
	}
}

// Handle builds one claimed job (a queue.Handler): fetch the derivation and its inputs from the
// cluster's caches, check them against the canonical hashes, build with the limits, and read
// the outputs back; then, off the build slot (queue.Result.Continue), upload the outputs and
// log through the signer, which records the success.
func (b *Builder) Handle(ctx context.Context, job queue.Job) queue.Result {
	jctx, cancel := context.WithCancelCause(ctx)
	rj := &runningJob{claim: job.Claim(), drvPath: job.DrvPath, cancel: cancel}
	b.mu.Lock()
	b.running[job.ID] = rj
	b.mu.Unlock()
	// The job will fill the store: check its free space first (in the service loop, which owns
	// the collections; the job does not wait).
	select {
	case b.gcWake <- struct{}{}:
	default:
	}
	logger := b.logger.With("job_id", job.ID, "drv_path", job.DrvPath, "attempt", job.Attempt)
	t := &Timings{JobID: job.ID}
	// finish ends the job: its result once the build failed, or once the upload ended.
	finish := func(res queue.Result) queue.Result {
		defer func() {
			b.mu.Lock()
			if b.running[job.ID] == rj {
				delete(b.running, job.ID)
			}
			b.mu.Unlock()
			b.gc.jobDone()
			cancel(nil)
		}()
		if context.Cause(jctx) == errClaimLost && ctx.Err() == nil {
			res = queue.Result{Abandoned: true, Finally: res.Finally}
		}
		if res.Err != nil && res.Kind == queue.Transient && !res.Abandoned && ctx.Err() == nil {
			b.backOff(jctx, job, logger, res.Err)
		}
		if ctx.Err() == nil {
			b.observeSteps(*t, job.System)
		}
		if b.cfg.Observe != nil && ctx.Err() == nil {
			t.Succeeded = res.Err == nil && !res.Abandoned
			b.cfg.Observe(*t)
		}
		return res
	}
	res, send := b.handle(jctx, job, logger, t)
	if send == nil {
		return finish(res)
	}
	return queue.Result{Continue: func(context.Context) queue.Result { return finish(send(jctx)) }}
}

// observeSteps records the steps of t that ran, for a job of system.
func (b *Builder) observeSteps(t Timings, system string) {
	if b.steps == nil {
		return
	}
	for _, s := range []struct {
		name string
		d    time.Duration
	}{{"fetch", t.Fetch}, {"build", t.Build}, {"upload", t.Upload}, {"sign", t.Sign}} {
		if s.d > 0 {
			b.steps.WithLabelValues(s.name, system).Observe(s.d.Seconds())
		}
	}
}

// handle builds a job on one of the builder's daemon sessions. A successful build's outputs are
// read back (serialised, hashed, compressed) before it returns; send then uploads and signs
// them, and is nil when there is nothing to send.
func (b *Builder) handle(ctx context.Context, job queue.Job, logger *slog.Logger, t *Timings) (res queue.Result, send func(context.Context) queue.Result) {
	start := time.Now()
	store, err := b.jobStore(ctx)
	if err != nil {
		return transient(err), nil
	}
	ss, err := b.sessions.get(ctx, store)
	if err != nil {
		return transient(err), nil
	}
	defer func() {
		// A session is kept only when the job got through it as planned (its build may have
		// failed): after any other error its daemon may have dropped the connection.
		var be *BuildError
		if res.Err != nil && !(errors.As(res.Err, &be) && be.Kind != "nix") {
			ss.Close()
		}
		b.sessions.put(ss)
	}()
	var drv *nix.Derivation
	var inputs jobInputs
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) { drv, err = ss.Derivation(gctx, job.DrvPath); return err })
	g.Go(func() (err error) { inputs, err = b.jobInputs(gctx, job.DrvPath); return err })
	if err := g.Wait(); err != nil {
		return transient(err), nil
	}
	if res, ok := b.verify(ctx, job.DrvPath, drv, inputs); !ok {
		return res, nil
	}
	inPaths, err := ss.InputPaths(ctx, job.DrvPath, drv, inputs.outputs)
	if err != nil {
		return transient(err), nil
	}
	var outPaths []string
	for _, o := range drv.Outputs {
		if o.Path != "" {
			outPaths = append(outPaths, o.Path)
		}
	}
	slices.Sort(outPaths)
	// Each root is made before what it roots is fetched or built, so that the store's GC never
	// takes what a running job needs (see storeGC.roots): the inputs, and the outputs until
	// they are read back for the upload.
	name := b.rootName(job)
	unrootIn, err := b.gc.addRoots(ctx, store, name, inPaths)
	if err != nil {
		return transient(err), nil
	}
	defer unrootIn()
	unrootOut, err := b.gc.addRoots(ctx, store, name+"-out", outPaths)
	if err != nil {
		return transient(err), nil
	}
	defer unrootOut()
	if _, err := ss.EnsureInputs(ctx, inPaths, inputs.canonical, logger); err != nil {
		return transient(err), nil
	}
	// What this store holds of outputs to build again may be the pull request's build (built
	// here, or fetched for its dependents): Nix would take it as done.
	if err := ss.Discard(ctx, inputs.rebuild, logger); err != nil {
		return transient(err), nil
	}
	t.Fetch = time.Since(start)

	log := NewLogBuffer(b.cfg.MaxLogSize, b.clock)
	tail := NewTailWriter(TailConfig{JobID: job.ID, Log: log, Interval: b.cfg.TailInterval}, b.pool, logger, b.clock)
	if err := tail.Start(ctx); err != nil {
		return transient(err), nil
	}
	buildStart := time.Now()
	outputs, err := ss.Build(ctx, job.DrvPath, drv, inPaths, b.cfg.Limits, log)
	t.Build = time.Since(buildStart)
	tail.Stop()
	finally := func(ctx context.Context) { b.deleteTail(ctx, job.ID, logger) }
	// The log goes to the derivation's latest key (for `nix log`) and to the attempt's own,
	// which the job records and no later attempt overwrites.
	logKey := queue.AttemptLogKey(job.DrvPath, job.Attempt)
	if err != nil {
		return b.failed(ctx, ss, job, err, log, logKey, outPaths, unrootOut, logger, finally), nil
	}

	outPaths = slices.Sorted(maps.Values(outputs))
	// The job shows as uploading while its outputs are read back, but the signer is asked only
	// once the mark is recorded: a claim lost meanwhile abandons the upload.
	marked := make(chan error, 1)
	go func() { marked <- queue.MarkUploading(ctx, b.pool, job.Claim()) }()
	uploadStart := time.Now()
	pub, prepared, err := b.prepareUpload(ctx, ss, job, outPaths, t)
	if merr := <-marked; merr != nil {
		if prepared != nil {
			prepared.Close()
		}
		if errors.Is(merr, queue.ErrStale) {
			return queue.Result{Abandoned: true, Finally: finally}, nil
		}
		return queue.Result{Err: merr, Kind: queue.Transient, Finally: finally}, nil
	}
	if err != nil {
		return queue.Result{Err: err, Kind: queue.Transient, Finally: finally}, nil
	}
	t.Upload += time.Since(uploadStart) - prepared.Took()
	logData := log.Bytes()
	return queue.Result{}, func(ctx context.Context) queue.Result {
		defer prepared.Close()
		if err := pub.UploadLog(ctx, job.Claim(), upload.Log{Key: queue.LogKey(job.DrvPath), Data: logData}); err != nil {
			logger.Warn("could not upload the build's latest log", "error", err)
		}
		_, err := pub.SendBuild(ctx, job.Claim(), prepared, &upload.Log{Key: logKey, Data: logData})
		if err != nil {
			var se *signerclient.StatusError
			if errors.As(err, &se) && se.Code == 409 {
				return queue.Result{Abandoned: true, Finally: finally}
			}
			return queue.Result{Err: fmt.Errorf("upload outputs: %w", err), Kind: queue.Transient, Finally: finally}
		}
		// The signer recorded the success with the log; the tail has served its purpose.
		return queue.Result{Recorded: true, Finally: finally}
	}
}

// prepareUpload reads a build's outputs back (serialised, hashed, compressed) for the upload;
// the upload's and the signature's times go to t.
func (b *Builder) prepareUpload(ctx context.Context, ss *Session, job queue.Job, outPaths []string, t *Timings) (*upload.Publisher, *upload.PreparedBuild, error) {
	infos, err := ss.OutputInfos(ctx, outPaths)
	if err != nil {
		return nil, nil, err
	}
	paths := make([]upload.Path, len(outPaths))
	for i, p := range outPaths {
		paths[i] = upload.Path{StorePath: p, References: infos[p].References, Deriver: job.DrvPath, NarSize: infos[p].NarSize}
	}
	pub := &upload.Publisher{Signer: b.cfg.Signer, StoreRoot: ss.store.Root, Source: ss.DumpNAR, Observe: func(step string, d time.Duration) {
		switch step {
		case "upload":
			t.Upload += d
		case "sign":
			t.Sign += d
		}
	}}
	prepared, err := pub.PrepareBuild(ctx, paths)
	if err != nil {
		return nil, nil, fmt.Errorf("read the outputs back: %w", err)
	}
	return pub, prepared, nil
}

// failed is the result of a build that did not succeed: its log is uploaded for the failure.
func (b *Builder) failed(ctx context.Context, ss *Session, job queue.Job, err error, log *LogBuffer, logKey string,
	outPaths []string, unrootOut func(), logger *slog.Logger, finally func(context.Context)) queue.Result {
	var be *BuildError
	if !errors.As(err, &be) {
		return queue.Result{Err: err, Kind: queue.Transient, Finally: finally} // cancelled or stopping
	}
	if be.Kind == "output-size" {
		// Build could not delete the outputs while this job rooted them.
		unrootOut()
		if err := ss.DeleteDead(ctx, outPaths); err != nil {
			logger.Warn("could not delete the oversized outputs", "error", err)
		}
	}
	res := queue.Result{Err: be, Message: be.Message, Kind: queue.Permanent, Finally: finally}
	if be.Kind == "nix" {
		res.Kind = queue.Transient
	}
	if be.ExitCode >= 0 {
		res.ExitCode = &be.ExitCode
	}
	pub := upload.Publisher{Signer: b.cfg.Signer, StoreRoot: ss.store.Root}
	if uerr := pub.UploadLog(ctx, job.Claim(), upload.Log{Key: queue.LogKey(job.DrvPath), Data: log.Bytes()}); uerr != nil {
		logger.Warn("could not upload the failed build's latest log", "error", uerr)
	}
	if uerr := pub.UploadLog(ctx, job.Claim(), upload.Log{Key: logKey, Data: log.Bytes()}); uerr != nil {
		logger.Warn("could not upload the failed build's log", "error", uerr)
	} else {
		res.LogKey = logKey
	}
	return res
}

// rootName names a job's GC roots; the node id keeps builders sharing a store apart.
func (b *Builder) rootName(job queue.Job) string {
	return b.cfg.NodeID + "-job-" + strconv.FormatInt(job.ID, 10)
}

// backOff waits before a transient failure is recorded, longer with each retry (RetryPause,
// doubled per retry: 1 s, 2 s, 4 s, 8 s by default): a cache that is briefly unreachable or a database that just came back must not
// use up a job's three retries within milliseconds. The job keeps its slot meanwhile; a lost
// claim or a stopping worker ends the wait.
func (b *Builder) backOff(ctx context.Context, job queue.Job, logger *slog.Logger, err error) {
	d := b.cfg.RetryPause << min(job.RetryCount, 5)
	logger.Warn("transient build failure; retrying after a pause", "error", err, "pause", d.String(), "retry", job.RetryCount+1)
	select {
	case <-ctx.Done():
	case <-b.clock.After(d):
	}
}

// verify checks that drv's output paths are the ones its text and its inputs' hashes give,
// the hashes the signer recorded when it checked the inputs (read with the job's inputs, or
// now for an input they lack): no daemon, trusting the builder or not, is handed a derivation
// that claims another's outputs. A forged derivation fails the job for good; ok is false with
// the result to record.
func (b *Builder) verify(ctx context.Context, drvPath string, drv *nix.Derivation, inputs jobInputs) (res queue.Result, ok bool) {
	hashes := make(map[string]nix.DrvHash, len(drv.InputDrvs))
	var missing []string
	for in := range drv.InputDrvs {
		sum, ok := inputs.drvHashes[in]
		if !ok {
			missing = append(missing, in)
			continue
		}
		hashes[in] = nix.DrvHash{Sum: sum, Outputs: slices.Sorted(maps.Keys(inputs.outputs[in]))}
	}
	if len(missing) > 0 {
		more, err := blob.NewDerivations(b.pool).Hashes(ctx, missing)
		if err != nil {
			return transient(fmt.Errorf("verify %s: %w", drvPath, err)), false
		}
		maps.Copy(hashes, more)
	}
	err := drv.CheckOutputs(drvPath, func(p string) (nix.DrvHash, error) {
		if h, ok := hashes[p]; ok {
			return h, nil
		}
		return nix.DrvHash{}, fmt.Errorf("%w: its input %s is not in the cache", ErrInputUnavailable, p)
	})
	switch {
	case errors.Is(err, ErrInputUnavailable):
		return transient(fmt.Errorf("verify %s: %w", drvPath, err)), false
	case err != nil:
		msg := "refusing to build a derivation whose outputs are not its own: " + err.Error()
		return queue.Result{Err: errors.New(msg), Message: msg, Kind: queue.Permanent}, false
	}
	return queue.Result{}, true
}

func transient(err error) queue.Result {
	return queue.Result{Err: err, Kind: queue.Transient}
}

// jobStore is the store with this moment's substituters: the cluster's live cache nodes, then
// upstream, trusting the cluster's signing keys and upstream's. They are read at most every
// sourcesTTL.
func (b *Builder) jobStore(ctx context.Context) (Store, error) {
	b.sourcesMu.Lock()
	src := b.sources
	b.sourcesMu.Unlock()
	if src.at.IsZero() || b.clock.Now().Sub(src.at) >= sourcesTTL || len(src.caches) == 0 {
		src = sources{at: b.clock.Now()}
		if err := b.pool.QueryRow(ctx, sqlSources, b.cfg.DeadThreshold.Seconds()).Scan(&src.caches, &src.keys); err != nil {
			return Store{}, fmt.Errorf("read the cluster's caches and keys: %w", err)
		}
		b.sourcesMu.Lock()
		b.sources = src
		b.sourcesMu.Unlock()
	}
	st := b.cfg.Store
	st.Substituters = append(slices.Clip(src.caches), b.cfg.Upstream...)
	st.TrustedKeys = append(slices.Clip(src.keys), b.cfg.UpstreamKeys...)
	return st, nil
}

// jobInputs is what the database knows of a job's input derivations.
type jobInputs struct {
	outputs map[string]map[string]string // input .drv → output name → path
	hashes  map[string]string            // output path → canonical NAR hash
	// drvHashes are the input derivations' hashes the signer recorded (see verify).
	drvHashes map[string][32]byte
	// rebuild are the job's own outputs that only pull requests built (quarantined), which a
	// trusted job builds again.
	rebuild []string
}

// canonical is a Canonical answering from the hashes read with the inputs.
func (in jobInputs) canonical(_ context.Context, paths []string) (map[string]string, error) {
	out := map[string]string{}
	for _, p := range paths {
		if h := in.hashes[p]; h != "" {
			out[p] = h
		}
	}
	return out, nil
}

// jobInputs reads the outputs of drvPath's input derivations and their canonical NAR hashes
// (what the cache serves for them, first writer wins at the signer), in one query.
func (b *Builder) jobInputs(ctx context.Context, drvPath string) (jobInputs, error) {
	in := jobInputs{outputs: map[string]map[string]string{}, hashes: map[string]string{}, drvHashes: map[string][32]byte{}}
	rows, err := b.pool.Query(ctx, sqlJobInputs, drvPath)
	if err != nil {
		return in, fmt.Errorf("read the job's inputs: %w", err)
	}
	var drv, name, out, hash string
	var drvHash []byte
	_, err = pgx.ForEachRow(rows, []any{&drv, &name, &out, &hash, &drvHash}, func() error {
		if drv == drvPath {
			in.rebuild = append(in.rebuild, out)
			return nil
		}
		if in.outputs[drv] == nil {
			in.outputs[drv] = map[string]string{}
		}
		in.outputs[drv][name] = out
		if hash != "" {
			in.hashes[out] = hash
		}
		if len(drvHash) == 32 {
			in.drvHashes[drv] = [32]byte(drvHash)
		}
		return nil
	})
	if err != nil {
		return in, fmt.Errorf("read the job's inputs: %w", err)
	}
	return in, nil
}

// deleteTail removes the live tail once the result is recorded; its trigger tells log watchers
// the build is over. A job reclaimed by another builder keeps its tail.
func (b *Builder) deleteTail(ctx context.Context, jobID int64, logger *slog.Logger) {
	if _, err := b.pool.Exec(ctx, sqlDeleteFinishedTail, jobID); err != nil {
		logger.Warn("could not delete the live log tail", "error", err)
	}
}
