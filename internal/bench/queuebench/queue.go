// Package queuebench is `harmonia-ci bench queue` and `bench worker`: a synthetic package set
// drained through the build queue by no-op workers (jobs/s, claim and wake-up latency), against
// pgbench -N on the same server.
package queuebench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/bench"
	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/startstop"
)

// QueueOptions configures `harmonia-ci bench queue`.
type QueueOptions struct {
	Jobs     int // synthetic jobs; default 100000
	Workers  int // concurrent no-op workers, one build slot each; default 4
	Projects int // projects with shares 100, 200, ...; default 4
	// DatabaseURL of an empty harmonia-ci database; "" starts a private server in a temp dir.
	DatabaseURL string
	Form        queue.ClaimForm
	// PgbenchSeconds is how long the pgbench -N reference runs; 0 skips it.
	PgbenchSeconds int
	// WakeLinks is the length of the chain used to measure wake latency; 0 skips it.
	WakeLinks int
	Seed      uint64
	System    string
	Logger    *slog.Logger
}

// QueueReport is what the benchmark measured.
type QueueReport struct {
	Date           string  `json:"date"`
	Machine        string  `json:"machine"`
	Postgres       string  `json:"postgres"`
	ClaimForm      string  `json:"claim_form"`
	Jobs           int     `json:"jobs"`
	Workers        int     `json:"workers"`
	Projects       int     `json:"projects"`
	EnqueueSeconds float64 `json:"enqueue_seconds"`
	BlockedAtStart int     `json:"blocked_at_start"`
	RunSeconds     float64 `json:"run_seconds"`
	JobsPerSecond  float64 `json:"jobs_per_second"`
	// Claim latencies time each claim's round trip.
	ClaimP50Ms     float64 `json:"claim_p50_ms"`
	ClaimP99Ms     float64 `json:"claim_p99_ms"`
	ClaimP99FullMs float64 `json:"claim_p99_full_queue_ms"` // claims made while over half the jobs were still unclaimed
	// A claim alone, timed by a probe claiming one job ten times a second through the drain.
	ClaimAloneP50Ms float64 `json:"claim_alone_p50_ms"`
	ClaimAloneP99Ms float64 `json:"claim_alone_p99_ms"`
	// CPU the drain took per job, when the server runs on this machine: the database server's
	// processes and this process (the workers). Steadier than jobs/s on a shared machine.
	ServerCPUPerJobMs float64 `json:"server_cpu_per_job_ms,omitempty"`
	BenchCPUPerJobMs  float64 `json:"bench_cpu_per_job_ms,omitempty"`
	WakeP50Ms         float64 `json:"wake_p50_ms"`
	WakeP99Ms         float64 `json:"wake_p99_ms"`
	PgbenchTPS        float64 `json:"pgbench_tps"`
	RatioToPgbench    float64 `json:"ratio_jobs_per_pgbench_tps"`
}

func (o *QueueOptions) defaults() {
	o.Jobs = bench.Positive(o.Jobs, 100000)
	o.Workers = bench.Positive(o.Workers, 4)
	o.Projects = bench.Positive(o.Projects, 4)
	o.Seed = bench.Seed(o.Seed)
	if o.System == "" {
		o.System = "x86_64-linux"
	}
	o.Logger = bench.Logger(o.Logger)
}

// Queue runs the queue benchmark: pgbench -N as the reference, then a synthetic package set
// drained by no-op workers, then a chain that measures wake-up latency.
func Queue(ctx context.Context, o QueueOptions) (QueueReport, error) {
	o.defaults()
	r := QueueReport{
		Date: time.Now().UTC().Format(time.RFC3339), Jobs: o.Jobs, Workers: o.Workers, Projects: o.Projects,
		Machine:   bench.Machine(),
		ClaimForm: map[queue.ClaimForm]string{queue.ClaimReady: "ready", queue.ClaimNotExists: "not-exists"}[o.Form],
	}
	d, closeDB, err := openEmptyDatabase(ctx, o)
	if err != nil {
		return r, err
	}
	defer closeDB()
	r.Postgres = d.Version

	if o.PgbenchSeconds > 0 {
		o.Logger.Info("running pgbench -N as the reference", "seconds", o.PgbenchSeconds)
		if r.PgbenchTPS, err = runPgbench(ctx, d.URL, o.PgbenchSeconds); err != nil {
			return r, err
		}
	}
	if err := enqueueDAG(ctx, d.Pool, o, &r); err != nil {
		return r, err
	}
	dr := &drain{pool: d.Pool, o: o}
	if err := dr.run(ctx, &r); err != nil {
		return r, err
	}
	return r, nil
}

// openEmptyDatabase opens o.DatabaseURL, or a private server in a temporary directory, and
// checks it has no build jobs: the synthetic ones must not mix with real ones.
func openEmptyDatabase(ctx context.Context, o QueueOptions) (*bench.Database, func(), error) {
	var dir string
	if o.DatabaseURL == "" {
		var err error
		if dir, err = os.MkdirTemp("", "hci-bench-"); err != nil {
			return nil, nil, err
		}
	}
	closeAll := func(d *bench.Database) {
		if d != nil {
			d.Close()
		}
		if dir != "" {
			_ = os.RemoveAll(dir)
		}
	}
	d, err := bench.OpenDatabase(ctx, bench.DatabaseOptions{URL: o.DatabaseURL, Dir: dir, MaxServerConns: 200, App: "harmonia-ci bench", PoolConns: int32(o.Workers + 6), Logger: o.Logger})
	if err != nil {
		closeAll(nil)
		return nil, nil, err
	}
	var existing int64
	if err := d.Pool.QueryRow(ctx, sqlJobCount).Scan(&existing); err != nil {
		closeAll(d)
		return nil, nil, err
	}
	if existing > 0 {
		closeAll(d)
		return nil, nil, fmt.Errorf("bench queue: the database already has %d build jobs; use an empty database (its synthetic jobs would mix with real ones)", existing)
	}
	return d, func() { closeAll(d) }, nil
}

// enqueueDAG generates the package set and enqueues it, project by project, timed.
func enqueueDAG(ctx context.Context, pool *pgxpool.Pool, o QueueOptions, r *QueueReport) error {
	w := GenerateDAG(DAGShape{Jobs: o.Jobs, Projects: o.Projects, Seed: o.Seed}, o.System)
	projectIDs, err := bench.CreateProjects(ctx, pool, o.Seed, w.Shares)
	if err != nil {
		return err
	}
	start := time.Now()
	for i, e := range w.Enqueues {
		e.ProjectID = &projectIDs[i]
		if _, err := queue.Enqueue(ctx, pool, e); err != nil {
			return err
		}
	}
	r.EnqueueSeconds = time.Since(start).Seconds()
	if err := pool.QueryRow(ctx, sqlBlockedCount).Scan(&r.BlockedAtStart); err != nil {
		return err
	}
	o.Logger.Info("enqueued", "jobs", o.Jobs, "blocked", r.BlockedAtStart, "seconds", r.EnqueueSeconds)
	_, err = pool.Exec(ctx, sqlAnalyze)
	return err
}

// drain is the queue drained by o.Workers no-op workers, then the wake-latency chain.
type drain struct {
	pool      *pgxpool.Pool
	o         QueueOptions
	announcer *queue.Announcer

	mu           sync.Mutex
	lat, latFull []time.Duration // every claim's latency; those of the first half of the jobs
	claimed      atomic.Int64
	// recordApart makes the workers record successes as a builder's are recorded: apart
	// from the worker (by the signer, at build-complete), announced, and the freed slot
	// filled by the worker's own claim, woken by the announcement. The wake probe measures
	// that path; the drain lets the workers record and claim in one round trip.
	recordApart atomic.Bool
}

// run drains the queue and fills r's drain and wake figures.
func (dr *drain) run(ctx context.Context, r *QueueReport) error {
	o, pool := dr.o, dr.pool
	notifier := notify.New(notify.Config{}, pool, o.Logger, clock.Real{})
	if err := notifier.Start(ctx); err != nil {
		return err
	}
	defer notifier.Stop()
	dr.announcer = queue.NewAnnouncer(pool, 0, o.Logger)
	if err := dr.announcer.Start(ctx); err != nil {
		return err
	}
	defer dr.announcer.Stop()
	workers, err := dr.workers(notifier)
	if err != nil {
		return err
	}

	cpuStart, cpuErr := drainCPU(ctx, pool)
	start := time.Now()
	for _, wk := range workers {
		if err := wk.Start(ctx); err != nil {
			return err
		}
	}
	defer startstop.StopAll(workers...)
	probe := startClaimProbe(ctx, pool, dr.announcer, o.System)
	if err := waitDone(ctx, pool, time.Hour); err != nil {
		probe.stop()
		return err
	}
	alone := probe.stop()
	r.ClaimAloneP50Ms, r.ClaimAloneP99Ms = bench.PercentileMs(alone, 50), bench.PercentileMs(alone, 99)
	r.RunSeconds = time.Since(start).Seconds()
	r.JobsPerSecond = float64(o.Jobs) / r.RunSeconds
	if cpuEnd, err := drainCPU(ctx, pool); err == nil && cpuErr == nil {
		r.ServerCPUPerJobMs = float64((cpuEnd.server - cpuStart.server).Microseconds()) / 1000 / float64(o.Jobs)
		r.BenchCPUPerJobMs = float64((cpuEnd.self - cpuStart.self).Microseconds()) / 1000 / float64(o.Jobs)
		o.Logger.Info("drain CPU per job", "server_ms", r.ServerCPUPerJobMs, "bench_ms", r.BenchCPUPerJobMs)
	}
	r.ClaimP50Ms, r.ClaimP99Ms = bench.PercentileMs(dr.lat, 50), bench.PercentileMs(dr.lat, 99)
	r.ClaimP99FullMs = bench.PercentileMs(dr.latFull, 99)
	if r.PgbenchTPS > 0 {
		r.RatioToPgbench = r.JobsPerSecond / r.PgbenchTPS
	}
	o.Logger.Info("drained", "jobs_per_second", r.JobsPerSecond)

	if o.WakeLinks > 1 {
		dr.recordApart.Store(true)
		if r.WakeP50Ms, r.WakeP99Ms, err = wakeLatency(ctx, pool, o); err != nil {
			return err
		}
	}
	return nil
}

// workers are the no-op workers, one build slot each.
func (dr *drain) workers(notifier *notify.Notifier) ([]startstop.Service, error) {
	workers := make([]startstop.Service, dr.o.Workers)
	for i := range workers {
		wk, err := queue.NewWorker(queue.WorkerConfig{
			Claimer:      queue.Claimer{NodeID: fmt.Sprintf("bench-%d", i), Systems: []string{dr.o.System}},
			MaxJobs:      1,
			PollInterval: time.Second,
			Notifier:     notifier,
			Announcer:    dr.announcer,
			ClaimForm:    dr.o.Form,
			Handler:      dr.handle,
			ClaimFunc:    dr.observeClaim,
		}, dr.pool, dr.o.Logger, clock.Real{})
		if err != nil {
			return nil, err
		}
		workers[i] = wk
	}
	return workers, nil
}

// handle builds nothing. During the drain it leaves the success to the worker; with
// recordApart it records the success itself and announces it, as the signer does.
func (dr *drain) handle(ctx context.Context, job queue.Job) queue.Result {
	if !dr.recordApart.Load() {
		return queue.Result{}
	}
	out, err := queue.Succeed(ctx, dr.pool, job.Claim())
	if err != nil {
		return queue.Result{Err: err}
	}
	dr.announcer.Finished(out.DrvPath, out.Status)
	return queue.Result{Recorded: true}
}

// observeClaim records the latency of every claim that got jobs.
func (dr *drain) observeClaim(d time.Duration, jobs []queue.Job) {
	if len(jobs) == 0 {
		return
	}
	n := dr.claimed.Add(int64(len(jobs)))
	dr.mu.Lock()
	dr.lat = append(dr.lat, d)
	if n <= int64(dr.o.Jobs/2) {
		dr.latFull = append(dr.latFull, d)
	}
	dr.mu.Unlock()
}

// waitDone waits until no job is pending or in progress.
func waitDone(ctx context.Context, pool *pgxpool.Pool, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		// Whether any job is left, not how many: counting 300,000 unfinished jobs five times a
		// second took a share of a CPU from the queue being measured.
		var left bool
		if err := pool.QueryRow(ctx, sqlAnyOpen).Scan(&left); err != nil {
			return err
		}
		if !left {
			return nil
		}
		if time.Now().After(deadline) {
			var n int64
			if err := pool.QueryRow(ctx, sqlOpenCount).Scan(&n); err != nil {
				return err
			}
			return fmt.Errorf("bench: %d jobs still unfinished after %s", n, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// wakeLatency enqueues a chain on the now idle workers and measures, from the database's own
// timestamps, the time from one link finishing to the next being claimed.
func wakeLatency(ctx context.Context, pool *pgxpool.Pool, o QueueOptions) (p50, p99 float64, err error) {
	chain := Chain(o.WakeLinks, o.Seed^0xa5a5, o.System)
	if _, err := queue.Enqueue(ctx, pool, queue.EnqueueParams{Derivations: chain}); err != nil {
		return 0, 0, err
	}
	if err := waitDone(ctx, pool, 10*time.Minute); err != nil {
		return 0, 0, err
	}
	paths := make([]string, len(chain))
	for i, d := range chain {
		paths[i] = d.DrvPath
	}
	rows, err := pool.Query(ctx, sqlWakeGaps, paths)
	if err != nil {
		return 0, 0, err
	}
	secs, err := pgx.CollectRows(rows, pgx.RowTo[float64])
	if err != nil {
		return 0, 0, err
	}
	ds := make([]time.Duration, len(secs))
	for i, s := range secs {
		ds[i] = time.Duration(s * float64(time.Second))
	}
	return bench.PercentileMs(ds, 50), bench.PercentileMs(ds, 99), nil
}

var tpsRE = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)

// runPgbench measures pgbench's simple-update transaction (-N) on the same server, 8 clients
// on 2 threads, and removes its tables afterwards.
func runPgbench(ctx context.Context, url string, seconds int) (float64, error) {
	if _, err := exec.LookPath("pgbench"); err != nil {
		return 0, errors.New("bench queue: pgbench not found (Debian package postgresql-contrib or postgresql); pass --pgbench-seconds 0 to skip the reference")
	}
	run := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "pgbench", args...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("pgbench %v: %w\n%s", args[0], err, out)
		}
		return string(out), nil
	}
	if _, err := run("-i", "-q", "-s", "10", url); err != nil {
		return 0, err
	}
	defer run("-i", "-I", "d", url)
	out, err := run("-N", "-c", "8", "-j", "2", "-T", strconv.Itoa(seconds), url)
	if err != nil {
		return 0, err
	}
	m := tpsRE.FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("pgbench: no tps in output:\n%s", out)
	}
	return strconv.ParseFloat(m[1], 64)
}

// claimProbe times claims made alone while the workers drain the queue: the workers' own claims
// mostly ride on the success before them, and so time both.
type claimProbe struct {
	cancel context.CancelFunc
	done   chan struct{}
	lat    []time.Duration
}

// startClaimProbe claims one job ten times a second as node bench-probe and records each
// claim that got a job, then succeeds the job (announced, like the workers' successes).
func startClaimProbe(ctx context.Context, pool *pgxpool.Pool, announcer *queue.Announcer, system string) *claimProbe {
	ctx, cancel := context.WithCancel(ctx)
	p := &claimProbe{cancel: cancel, done: make(chan struct{})}
	c := queue.Claimer{NodeID: "bench-probe", Systems: []string{system}}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			start := time.Now()
			jobs, err := queue.ClaimJobs(ctx, pool, c, 1)
			d := time.Since(start)
			if err != nil || len(jobs) == 0 {
				continue
			}
			p.lat = append(p.lat, d)
			// Never left claimed: the drain waits for every job.
			out, err := queue.Succeed(context.WithoutCancel(ctx), pool, jobs[0].Claim())
			if err == nil {
				announcer.Finished(out.DrvPath, out.Status)
			}
		}
	}()
	return p
}

// stop ends the probe and returns the latencies of its claims.
func (p *claimProbe) stop() []time.Duration {
	p.cancel()
	<-p.done
	return p.lat
}

// cpuTimes is CPU consumed so far by the database server and by this process.
type cpuTimes struct{ server, self time.Duration }

// drainCPU reads the CPU time of this process and, through /proc, of the database server: the
// postmaster with the children it reaped, and its live children (backends, autovacuum, WAL
// writer). Backends that exit in between move from the second sum into the first. An error
// means the server is not on this machine (or not Linux).
func drainCPU(ctx context.Context, pool *pgxpool.Pool) (cpuTimes, error) {
	var t cpuTimes
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return t, err
	}
	t.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	var backend int
	if err := pool.QueryRow(ctx, sqlBackendPID).Scan(&backend); err != nil {
		return t, err
	}
	st, err := procStat(backend)
	if err != nil {
		return t, err
	}
	if st.comm != "postgres" {
		// The same pid on this machine is another process: the server runs elsewhere.
		return t, fmt.Errorf("backend %d is not a local postgres process", backend)
	}
	postmaster := st.ppid
	pm, err := procStat(postmaster)
	if err != nil {
		return t, err
	}
	t.server = pm.cpu + pm.children
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return t, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if s, err := procStat(pid); err == nil && s.ppid == postmaster {
			t.server += s.cpu
		}
	}
	return t, nil
}

type procStatus struct {
	comm          string
	ppid          int
	cpu, children time.Duration // utime+stime, cutime+cstime
}

// procStat parses /proc/PID/stat (after the command, which may hold spaces, in parentheses).
func procStat(pid int) (procStatus, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStatus{}, err
	}
	i := bytes.LastIndexByte(b, ')')
	j := bytes.IndexByte(b, '(')
	if i < 0 || j < 0 || j > i {
		return procStatus{}, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): ppid is field 4, utime..cstime fields 14-17.
	if len(f) < 15 {
		return procStatus{}, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	var n [4]int64
	for k := range n {
		if n[k], err = strconv.ParseInt(f[11+k], 10, 64); err != nil {
			return procStatus{}, fmt.Errorf("parse /proc/%d/stat: %w", pid, err)
		}
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return procStatus{}, fmt.Errorf("parse /proc/%d/stat: %w", pid, err)
	}
	// Clock ticks: 100 a second on every Linux this runs on (USER_HZ).
	tick := 10 * time.Millisecond
	return procStatus{comm: string(b[j+1 : i]), ppid: ppid, cpu: time.Duration(n[0]+n[1]) * tick, children: time.Duration(n[2]+n[3]) * tick}, nil
}
