// Package e2ebench is `harmonia-ci bench e2e`: a generated DAG built by an in-process cluster
// against plain nix-store --realise (per-job overhead, wall-time ratio), and the deep workload
// that compares queue orders against a lower bound.
package e2ebench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/bench"
	"github.com/harmonia-ci/harmonia-ci/internal/builder"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/eval"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/node"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// e2e is one benchmark run.
type e2e struct {
	o       E2EOptions
	dir     string
	url     string
	pool    *pgxpool.Pool
	token   string
	failed  chan error // a node stopped on its own
	front   *bench.Node
	nixBin  string // the real nix-store
	nixCmd  string // the real nix
	traceLn string // the trace log, with --trace-nix
	nodeLog string // the nodes' log at info level
	logger  *slog.Logger
	logOff  int64 // nodeLog read up to here
	// postgres is the server_version of the deep workload's databases.
	postgres string
	// cgroup is the builders' [build] cgroup, "" for none.
	cgroup string

	mu      sync.Mutex
	claims  map[int64]time.Duration
	timings map[int64]builder.Timings
	nClaims int
	nEmpty  int
}

// start starts a node with cfg in this process, its builds and claims observed.
func (b *e2e) start(ctx context.Context, cfg *config.Config) *bench.Node {
	return bench.StartNode(ctx, cfg, b.logger, node.Options{
		Version: "bench", BuildObserver: b.observeBuild, ClaimObserver: b.observeClaim,
	}, b.failed)
}

func (b *e2e) observeBuild(t builder.Timings) {
	b.mu.Lock()
	b.timings[t.JobID] = t
	b.mu.Unlock()
}

// waitTimings waits until the builders reported the timings of every job of project.
func (b *e2e) waitTimings(ctx context.Context, project int64) error {
	rows, err := b.pool.Query(ctx, sqlProjectSucceededJobs, project)
	if err != nil {
		return err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		b.mu.Lock()
		missing := 0
		for _, id := range ids {
			if _, ok := b.timings[id]; !ok {
				missing++
			}
		}
		b.mu.Unlock()
		if missing == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("bench e2e: the builders did not report the timings of %d of %d jobs", missing, len(ids))
		case <-tick.C:
		}
	}
}

func (b *e2e) observeClaim(latency time.Duration, jobs []queue.Job) {
	b.mu.Lock()
	b.nClaims++
	if len(jobs) == 0 {
		b.nEmpty++
	}
	for _, j := range jobs {
		b.claims[j.ID] = latency
	}
	b.mu.Unlock()
}

// E2E measures the cluster end to end: a node with the frontend, evaluator, signer and cache
// roles and o.Builders builder nodes of o.Slots slots (each its own chroot store), all in this
// process on a private PostgreSQL, build a generated DAG; plain `nix-store --realise -jN` builds
// the same derivations into a fresh store in the same run, N = builders × slots.
func E2E(ctx context.Context, o E2EOptions) (E2EReport, error) {
	if err := o.defaults(); err != nil {
		return E2EReport{}, err
	}
	r := E2EReport{
		Date: time.Now().UTC().Format(time.RFC3339), Derivations: o.Derivations, Width: o.Width,
		Builders: o.Builders, Slots: o.Slots, Rounds: o.Rounds, TraceNix: o.TraceNix,
		Machine:  bench.Machine(),
		Nix:      bench.ToolVersion("nix-store", "--version"),
		TargetMs: E2ETargetOverheadMs, TargetRatio: E2ETargetRatio, TargetTrivialRatio: E2ETargetTrivialRatio,
	}
	for _, tool := range []string{"nix-instantiate", "nix-store", "nix", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			return r, fmt.Errorf("bench e2e: %s not found (scripts/deps.sh bench installs nix-bin and git)", tool)
		}
	}
	dir, err := os.MkdirTemp("", "hci-bench-e2e-")
	if err != nil {
		return r, err
	}
	if o.Keep {
		r.Dir = dir
	} else {
		defer os.RemoveAll(dir)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // the embedded server runs as postgres when root
		return r, err
	}
	b := &e2e{o: o, dir: dir, failed: make(chan error, 64), claims: map[int64]time.Duration{}, timings: map[int64]builder.Timings{}}
	// Builds in a cgroup of low CPU weight, as a builder machine configured for it runs them.
	if parent := builder.WritableCPUCgroup(); parent != "" {
		cg := filepath.Join(parent, "harmonia-ci-bench-"+bench.RandomHex(6))
		if err := builder.PrepareCgroup(cg); err != nil {
			return r, err
		}
		defer os.Remove(cg) // empty once the builders' daemons are gone
		b.cgroup, r.BuildCgroup = cg, cg
	}
	if b.nixBin, err = exec.LookPath("nix-store"); err != nil {
		return r, err
	}
	if b.nixCmd, err = exec.LookPath("nix"); err != nil {
		return r, err
	}
	b.nodeLog = filepath.Join(dir, "nodes.log")
	logFile, err := os.OpenFile(b.nodeLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return r, err
	}
	defer logFile.Close()
	b.logger = slog.New(slog.NewMultiHandler(o.NodeLogger.Handler(),
		slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelInfo})))
	if o.TraceNix {
		restore, err := b.installTrace()
		if err != nil {
			return r, err
		}
		defer restore()
	}

	if o.runs(E2ETrivial) || o.runs(E2ESleep) {
		if err := b.layered(ctx, &r); err != nil {
			return r, err
		}
	}
	if o.runs(E2EDeep) {
		if r.Deep, err = b.deep(ctx); err != nil {
			return r, fmt.Errorf("deep workload: %w", err)
		}
		r.Postgres = cmp.Or(r.Postgres, b.postgres)
	}
	return r, nil
}

// layered runs the trivial and sleep workloads of o on one database and frontend node.
func (b *e2e) layered(ctx context.Context, r *E2EReport) error {
	o := b.o
	d, err := bench.OpenDatabase(ctx, bench.DatabaseOptions{URL: "", Dir: filepath.Join(b.dir, "pg"), MaxServerConns: 200, App: "harmonia-ci bench e2e", PoolConns: 4, Logger: o.Logger})
	if err != nil {
		return err
	}
	defer d.Close()
	b.url, b.pool, r.Postgres = d.URL, d.Pool, d.Version

	b.token = bench.RandomHex(16)
	front, err := b.frontConfig()
	if err != nil {
		return err
	}
	b.front = b.start(ctx, front)
	defer b.front.Stop()
	if err := bench.WaitReady(ctx, b.front); err != nil {
		return err
	}

	for _, name := range []string{E2ETrivial, E2ESleep} {
		if !o.runs(name) {
			continue
		}
		w, err := b.workload(ctx, name)
		if err != nil {
			return fmt.Errorf("%s workload: %w", name, err)
		}
		if name == E2ETrivial {
			r.Trivial = w
		} else {
			r.Sleep = w
		}
	}
	return nil
}

// roundResult is one round of one workload.
type roundResult struct {
	nix, cluster, fromStart, eval float64
	nixCPU, clusterCPU, nixOwn    float64
	clusterNix, clusterGo, pg     float64
	clusterBuilds                 float64
	rows                          []jobRow
	perBuilder                    map[string]int
	stores                        []string
}

type jobRow struct {
	id                  int64
	drv, status, by     string
	attempt             int
	claimed, finished   time.Time
	hasClaim, hasFinish bool
}

func (b *e2e) workload(ctx context.Context, name string) (*E2EWorkload, error) {
	o := b.o
	w := &E2EWorkload{Name: name, Jobs: o.Derivations}
	if name == E2ESleep {
		w.SleepSeconds = o.SleepSeconds
		w.LowerBound = math.Ceil(float64(o.Derivations)/float64(o.Builders*o.Slots)) * o.SleepSeconds
	}
	var rows []jobRow
	best := -1
	var results []roundResult
	for round := 1; round <= o.Rounds; round++ {
		salt := fmt.Sprintf("%s-%d-%s", name, round, bench.RandomHex(6))
		rr, err := b.round(ctx, name, salt, round)
		if err != nil {
			return nil, err
		}
		results = append(results, rr)
		w.NixSeconds = append(w.NixSeconds, rr.nix)
		w.ClusterSeconds = append(w.ClusterSeconds, rr.cluster)
		w.FromStartSeconds = append(w.FromStartSeconds, rr.fromStart)
		w.EvalSeconds = append(w.EvalSeconds, rr.eval)
		rows = append(rows, rr.rows...)
		if best < 0 || rr.cluster < results[best].cluster {
			best = round - 1
		}
		if o.TraceNix && round == 1 {
			w.Trace = b.readTrace(rr.stores, len(rr.rows))
		}
		if o.Samples > 0 && round == 1 && name == E2ETrivial {
			o.Logger.Info("uncontended probe", "jobs", o.Samples)
			if w.Probe, err = b.probe(ctx, name, rr.rows); err != nil {
				return nil, fmt.Errorf("probe: %w", err)
			}
		}
	}
	w.BestNix, w.BestCluster = slices.Min(w.NixSeconds), slices.Min(w.ClusterSeconds)
	w.Ratio = w.BestCluster / w.BestNix
	w.PlainSlotMs = w.BestNix * 1000 * float64(o.Builders*o.Slots) / float64(o.Derivations)
	w.PerBuilder = results[best].perBuilder
	w.ClusterCPU = results[best].clusterCPU
	w.ClusterCPUNix, w.ClusterCPUGo = results[best].clusterNix, results[best].clusterGo
	w.ClusterCPUBuilds = results[best].clusterBuilds
	w.ClusterCPUPG = results[best].pg
	w.ClusterCPURest = w.ClusterCPU - w.ClusterCPUNix - w.ClusterCPUGo - w.ClusterCPUPG
	bestNix := slices.MinFunc(results, func(x, y roundResult) int { return cmp.Compare(x.nix, y.nix) })
	w.NixCPU, w.NixCPUOwn = bestNix.nixCPU, bestNix.nixOwn

	if o.Samples > 0 && name == E2ETrivial {
		o.Logger.Info("plain Nix, one derivation per nix-store --realise", "samples", o.Samples)
		samples, err := b.plainSingle(ctx, name, fmt.Sprintf("%s-single-%s", name, bench.RandomHex(6)))
		if err != nil {
			return nil, err
		}
		w.PlainBuild = bench.Summarize(samples)
	}

	b.summarizeSteps(w, rows)
	w.FailedAttempts, w.Failures = b.readFailures()
	var busy float64
	for _, j := range results[best].rows {
		if j.hasClaim && j.hasFinish {
			busy += j.finished.Sub(j.claimed).Seconds()
		}
	}
	w.Utilisation = busy / (results[best].cluster * float64(o.Builders*o.Slots))
	return w, nil
}

// summarizeSteps fills w's claim counts, retries and per-job step figures from the jobs of
// every round and the timings the builders reported, and resets the claim counts for the next
// workload.
func (b *e2e) summarizeSteps(w *E2EWorkload, rows []jobRow) {
	b.mu.Lock()
	defer b.mu.Unlock()
	w.Claims, w.EmptyClaims = b.nClaims, b.nEmpty
	b.nClaims, b.nEmpty = 0, 0
	var steps struct{ claim, fetch, build, upload, sign, other, total, vsBuild, vsPlain []float64 }
	for _, j := range rows {
		if j.attempt > 1 {
			w.Retries++
		}
		t, ok := b.timings[j.id]
		if !ok || !j.hasClaim || !j.hasFinish {
			continue
		}
		total := bench.Ms(j.finished.Sub(j.claimed))
		claim := bench.Ms(b.claims[j.id])
		fetch, bld, up, sign := bench.Ms(t.Fetch), bench.Ms(t.Build), bench.Ms(t.Upload), bench.Ms(t.Sign)
		steps.claim = append(steps.claim, claim)
		steps.fetch = append(steps.fetch, fetch)
		steps.build = append(steps.build, bld)
		steps.upload = append(steps.upload, up)
		steps.sign = append(steps.sign, sign)
		steps.other = append(steps.other, total-claim-fetch-bld-up-sign)
		steps.total = append(steps.total, total)
		steps.vsBuild = append(steps.vsBuild, total-bld)
		if w.PlainBuild.N > 0 {
			steps.vsPlain = append(steps.vsPlain, total-w.PlainBuild.P50)
		}
	}
	w.Steps = E2ESteps{
		Claim: bench.Summarize(steps.claim), Fetch: bench.Summarize(steps.fetch), Build: bench.Summarize(steps.build), Upload: bench.Summarize(steps.upload),
		Sign: bench.Summarize(steps.sign), Other: bench.Summarize(steps.other), Total: bench.Summarize(steps.total),
	}
	w.OverheadVsBuild, w.OverheadVsPlain = bench.Summarize(steps.vsBuild), bench.Summarize(steps.vsPlain)
}

// round runs one round of workload name with fresh derivations (salt): plain Nix builds them,
// then harmonia-ci evaluates and builds them.
func (b *e2e) round(ctx context.Context, name, salt string, round int) (roundResult, error) {
	var rr roundResult
	expr := b.expr(name, salt)
	if err := b.plainRound(ctx, name, salt, round, expr, &rr); err != nil {
		return rr, err
	}
	projectID, err := b.evaluate(ctx, name, salt, round, expr, &rr)
	if err != nil {
		return rr, err
	}
	if err := b.clusterRound(ctx, name, round, projectID, &rr); err != nil {
		return rr, err
	}
	if err := b.pool.QueryRow(ctx, sqlProjectMakespan, projectID).Scan(&rr.cluster); err != nil {
		return rr, err
	}
	rr.rows, rr.perBuilder, err = b.readJobs(ctx, projectID)
	return rr, err
}

// plainRound builds expr with plain nix-store --realise, builders × slots at once, into a
// fresh chroot store; only the realise is timed.
func (b *e2e) plainRound(ctx context.Context, name, salt string, round int, expr string, rr *roundResult) error {
	o := b.o
	jobsAtOnce := o.Builders * o.Slots
	o.Logger.Info("plain nix-store --realise", "workload", name, "round", round, "derivations", o.Derivations, "jobs", jobsAtOnce)
	store := filepath.Join(b.dir, "plain-"+salt)
	drvs, err := b.instantiate(ctx, store, expr, nil)
	if err != nil {
		return err
	}
	if len(drvs) != o.Derivations {
		return fmt.Errorf("nix-instantiate gave %d derivations, want %d", len(drvs), o.Derivations)
	}
	cpu0 := bench.BusyCPU()
	_, own0 := bench.ProcessCPU()
	d, err := b.realise(ctx, store, drvs, jobsAtOnce, b.sandboxPaths(name))
	if err != nil {
		return err
	}
	_, own1 := bench.ProcessCPU()
	rr.nix, rr.nixCPU, rr.nixOwn = d.Seconds(), bench.BusyCPU()-cpu0, own1-own0
	if !o.Keep {
		_ = os.RemoveAll(store)
	}
	return nil
}

// evaluate evaluates expr as a new project with harmonia-ci and checks it made a pending job
// per derivation; it returns the project.
func (b *e2e) evaluate(ctx context.Context, name, salt string, round int, expr string, rr *roundResult) (int64, error) {
	o := b.o
	o.Logger.Info("harmonia-ci evaluation", "workload", name, "round", round)
	repo, err := bench.MakeRepo(filepath.Join(b.dir, "repo-"+salt), expr)
	if err != nil {
		return 0, err
	}
	proj := "e2e-" + salt
	if _, err := project.Add(ctx, b.pool, project.AddParams{Name: proj, RepoURL: repo}); err != nil {
		return 0, err
	}
	start := time.Now()
	e, _, err := eval.Trigger(ctx, b.pool, eval.TriggerParams{Project: proj, StateDir: filepath.Join(b.dir, "cli")})
	if err != nil {
		return 0, err
	}
	if err := bench.WaitFor(ctx, b.failed, func() (bool, error) {
		e, err = evaluation.Get(ctx, b.pool, e.ID)
		return e.Finished(), err
	}); err != nil {
		return 0, err
	}
	rr.eval = time.Since(start).Seconds()
	if e.Status != status.EvalSucceeded {
		return 0, fmt.Errorf("evaluation %s: %s", e.Status, e.Error)
	}
	var pending int
	if err := b.pool.QueryRow(ctx, sqlProjectPendingCount, e.ProjectID).Scan(&pending); err != nil {
		return 0, err
	}
	if pending != o.Derivations {
		return 0, fmt.Errorf("the evaluation made %d pending jobs for %d derivations", pending, o.Derivations)
	}
	return e.ProjectID, nil
}

// clusterRound starts the builders on the evaluated project's pending jobs and measures them
// until every job finished and reported its timings: wall time, and CPU by Go, Nix and
// PostgreSQL.
func (b *e2e) clusterRound(ctx context.Context, name string, round int, projectID int64, rr *roundResult) error {
	o := b.o
	o.Logger.Info("cluster build", "workload", name, "round", round, "builders", o.Builders, "slots", o.Slots)
	var builders []*bench.Node
	stopAll := func() error {
		err := bench.StopNodes(builders)
		builders = nil
		return err
	}
	defer stopAll()
	var cfgs []*config.Config
	for i := 1; i <= o.Builders; i++ {
		cfg, err := b.builderConfig(fmt.Sprintf("e2e-b%d-%s-%d", i, name, round), name == E2ESleep, "")
		if err != nil {
			return err
		}
		cfgs = append(cfgs, cfg)
		rr.stores = append(rr.stores, cfg.Build.NixStore)
	}
	start := time.Now()
	cpu0 := bench.BusyCPU()
	self0, children0 := bench.ProcessCPU()
	pg0 := bench.PostgresCPU(filepath.Join(b.dir, "pg", "data"))
	for _, cfg := range cfgs {
		builders = append(builders, b.start(ctx, cfg))
	}
	var failures []string
	if err := bench.WaitFor(ctx, b.failed, func() (bool, error) {
		var open int
		var err error
		open, failures, err = unfinishedJobs(ctx, b.pool, []int64{projectID})
		return open == 0, err
	}); err != nil {
		return err
	}
	rr.fromStart, rr.clusterCPU = time.Since(start).Seconds(), bench.BusyCPU()-cpu0
	self1, _ := bench.ProcessCPU()
	rr.clusterGo, rr.pg = self1-self0, bench.PostgresCPU(filepath.Join(b.dir, "pg", "data"))-pg0
	// A job is succeeded once the signer records it; its builder reports the job's timings a
	// moment later (after its GC roots are gone), and a stopped builder reports none.
	if err := b.waitTimings(ctx, projectID); err != nil {
		return err
	}
	// The builds are the daemons' children: what the daemons reaped is the builds' CPU.
	_, rr.clusterBuilds = daemonCPU(rr.stores)
	if err := stopAll(); err != nil {
		return err
	}
	// The builders' Nix daemons (and their builds) count once reaped: when their sessions
	// closed, at the stop.
	_, children1 := bench.ProcessCPU()
	rr.clusterNix = children1 - children0
	if len(failures) > 0 {
		return fmt.Errorf("%d jobs did not succeed: %s", len(failures), strings.Join(failures[:min(5, len(failures))], "; "))
	}
	return nil
}

// readJobs reads the project's jobs, and counts them per builder.
func (b *e2e) readJobs(ctx context.Context, projectID int64) ([]jobRow, map[string]int, error) {
	rows, err := b.pool.Query(ctx, sqlProjectJobs, projectID)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	var jobs []jobRow
	perBuilder := map[string]int{}
	for rows.Next() {
		var j jobRow
		var claimed, finished *time.Time
		if err := rows.Scan(&j.id, &j.drv, &j.status, &j.by, &j.attempt, &claimed, &finished); err != nil {
			return nil, nil, err
		}
		if claimed != nil {
			j.claimed, j.hasClaim = *claimed, true
		}
		if finished != nil {
			j.finished, j.hasFinish = *finished, true
		}
		perBuilder[j.by]++
		jobs = append(jobs, j)
	}
	return jobs, perBuilder, rows.Err()
}

// readFailures counts the "build failed" and "build abandoned" lines the nodes logged since the last call and quotes
// the first few.
func (b *e2e) readFailures() (int, []string) {
	f, err := os.Open(b.nodeLog)
	if err != nil {
		return 0, nil
	}
	defer f.Close()
	if _, err := f.Seek(b.logOff, io.SeekStart); err != nil {
		return 0, nil
	}
	data, _ := io.ReadAll(f)
	b.logOff += int64(len(data))
	var n int
	var quoted []string
	for l := range strings.Lines(string(data)) {
		if !strings.Contains(l, `msg="build failed"`) && !strings.Contains(l, `msg="build abandoned`) {
			continue
		}
		n++
		if len(quoted) < 3 {
			quoted = append(quoted, strings.TrimSpace(l[:min(len(l), 600)]))
		}
	}
	return n, quoted
}

// unfinishedJobs counts the projects' jobs still pending or in progress, and describes those
// that ended without success.
func unfinishedJobs(ctx context.Context, pool *pgxpool.Pool, projects []int64) (open int, failures []string, err error) {
	rows, err := pool.Query(ctx, sqlUnsucceededJobs, projects)
	if err != nil {
		return 0, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var drv, status, msg string
		if err := rows.Scan(&drv, &status, &msg); err != nil {
			return 0, nil, err
		}
		switch status {
		case "pending", "building", "uploading":
			open++
		default:
			failures = append(failures, fmt.Sprintf("%s: %s %s", drv, status, msg))
		}
	}
	return open, failures, rows.Err()
}
