// Package e2ebench is `harmonia-ci bench e2e`: a generated DAG built by an in-process cluster
// against plain nix-store --realise (per-job overhead, wall-time ratio), and the deep workload
// that compares queue orders against a lower bound.
package e2ebench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/bench"
	"github.com/harmonia-ci/harmonia-ci/internal/builder"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/eval"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixgen"
	"github.com/harmonia-ci/harmonia-ci/internal/node"
	"github.com/harmonia-ci/harmonia-ci/internal/nodetoken"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
)

// E2E workloads.
const (
	E2ETrivial = "trivial"
	E2ESleep   = "sleep"
	E2EBoth    = "both" // trivial and sleep: the default
	// E2EDeep is several evaluations at once, each a chain behind many leaves, built once per
	// queue order (FIFO and critical path).
	E2EDeep = "deep"
	E2EAll  = "all" // trivial, sleep and deep
)

// The targets (the builder on the worker protocol).
const (
	E2ETargetOverheadMs   = 50.0 // median per-job overhead beyond the build step, trivial builds
	E2ETargetTrivialRatio = 3.0  // cluster wall ÷ plain Nix wall, trivial builds
	E2ETargetRatio        = 1.1  // cluster wall ÷ plain Nix wall, sleeping builds
)

// E2EOptions configures `harmonia-ci bench e2e`.
type E2EOptions struct {
	Derivations  int     // default 200
	Width        int     // derivations per layer; default 20
	Builders     int     // builder nodes; default 3
	Slots        int     // build slots per builder (node.max_jobs); default 2
	Workload     string  // trivial, sleep, both (default), deep or all
	Rounds       int     // each side runs this often per workload with fresh salts; the best is kept; default 1
	SleepSeconds float64 // what each build of the sleep workload sleeps; default 1
	// The deep workload: DeepProjects projects evaluated at once (default 3), each DeepLeaves
	// independent leaves (default 50) and a chain of DeepChain (default 30), every build
	// sleeping DeepSleep seconds (default 0.5).
	DeepProjects int
	DeepLeaves   int
	DeepChain    int
	DeepSleep    float64
	// Samples is how many derivations plain Nix builds one nix-store --realise each (the Nix
	// build itself), and how many jobs the uncontended probe replays; default 10, <0 skips both.
	Samples int
	// TraceNix puts logging wrappers of nix and nix-store first on PATH, to count and time every
	// Nix process the builders run (each costs a bash start besides).
	TraceNix bool
	Keep     bool // keep the temporary directory
	Logger   *slog.Logger
	// NodeLogger receives the in-process nodes' logs; default discard.
	NodeLogger *slog.Logger
}

func (o *E2EOptions) defaults() error {
	o.Derivations = bench.Positive(o.Derivations, 200)
	o.Width = bench.Positive(o.Width, 20)
	if o.Width > o.Derivations {
		o.Width = o.Derivations
	}
	o.Derivations -= o.Derivations % o.Width // whole layers
	o.Builders = bench.Positive(o.Builders, 3)
	o.Slots = bench.Positive(o.Slots, 2)
	o.Rounds = bench.Positive(o.Rounds, 1)
	o.SleepSeconds = bench.Positive(o.SleepSeconds, 1)
	if o.Samples == 0 {
		o.Samples = 10
	}
	o.DeepProjects = bench.Positive(o.DeepProjects, 3)
	o.DeepLeaves = bench.Positive(o.DeepLeaves, 50)
	o.DeepChain = bench.Positive(o.DeepChain, 30)
	o.DeepSleep = bench.Positive(o.DeepSleep, 0.5)
	if o.Workload == "" {
		o.Workload = E2EBoth
	}
	if !slices.Contains([]string{E2ETrivial, E2ESleep, E2EBoth, E2EDeep, E2EAll}, o.Workload) {
		return fmt.Errorf("bench e2e: workload: want trivial, sleep, both, deep or all, got %q", o.Workload)
	}
	o.Logger = bench.Logger(o.Logger)
	o.NodeLogger = bench.Logger(o.NodeLogger)
	return nil
}

// E2EReport is what `bench e2e` measured.
type E2EReport struct {
	Date        string `json:"date"`
	Machine     string `json:"machine"`
	Nix         string `json:"nix"`
	Postgres    string `json:"postgres"`
	Derivations int    `json:"derivations"`
	Width       int    `json:"width"`
	Builders    int    `json:"builders"`
	Slots       int    `json:"slots"`
	Rounds      int    `json:"rounds"`
	TraceNix    bool   `json:"trace_nix"`
	Dir         string `json:"dir,omitempty"` // kept with --keep
	// BuildCgroup is the cgroup the builders' daemons and builds ran in ([build] cgroup), ""
	// when this machine has no writable one: then builds and nodes share the CPU by session.
	BuildCgroup string  `json:"build_cgroup"`
	TargetMs    float64 `json:"target_overhead_ms"`
	TargetRatio float64 `json:"target_ratio"`
	// TargetTrivialRatio is the trivial workload's cluster ÷ plain Nix target.
	TargetTrivialRatio float64 `json:"target_trivial_ratio"`

	Trivial *E2EWorkload     `json:"trivial,omitempty"`
	Sleep   *E2EWorkload     `json:"sleep,omitempty"`
	Deep    *E2EDeepWorkload `json:"deep,omitempty"`
}

// runs reports whether the options' workload includes name.
func (o *E2EOptions) runs(name string) bool {
	switch o.Workload {
	case E2EAll:
		return true
	case E2EBoth:
		return name == E2ETrivial || name == E2ESleep
	}
	return o.Workload == name
}

// E2EWorkload is one workload's figures: wall times are the best of the rounds, per-job figures
// pool every round.
type E2EWorkload struct {
	Name         string  `json:"name"`
	SleepSeconds float64 `json:"sleep_seconds,omitempty"`
	Jobs         int     `json:"jobs"` // per round
	// NixSeconds is plain nix-store --realise -jN of the DAG into a fresh store (the realise only).
	NixSeconds []float64 `json:"nix_seconds"`
	// ClusterSeconds runs from the first claim to the last success (database clock); the builders
	// start once the evaluation has succeeded.
	ClusterSeconds []float64 `json:"cluster_seconds"`
	// FromStartSeconds runs from the builders' start (node.Run) to the last success.
	FromStartSeconds []float64 `json:"from_start_seconds"`
	EvalSeconds      []float64 `json:"eval_seconds"`
	BestNix          float64   `json:"best_nix_seconds"`
	BestCluster      float64   `json:"best_cluster_seconds"`
	Ratio            float64   `json:"ratio_cluster_to_nix"`
	// NixCPU and ClusterCPU are the machine's busy CPU time (/proc/stat, every process: Nix,
	// PostgreSQL, the nodes, and anything else running) during each side, seconds, best round.
	NixCPU     float64 `json:"nix_cpu_seconds"`
	ClusterCPU float64 `json:"cluster_cpu_seconds"`
	// NixCPUOwn is plain Nix's own share: nix-store and its builds.
	NixCPUOwn float64 `json:"nix_cpu_own_seconds"`
	// The cluster's share of it: the Nix processes the builders ran (with their builds), this
	// process (the nodes), PostgreSQL, and the rest (anything else on the machine).
	ClusterCPUNix float64 `json:"cluster_cpu_nix_seconds"`
	// ClusterCPUBuilds is the builds' own share of ClusterCPUNix (the daemons' reaped children);
	// the rest of the cluster's CPU is spent outside the builds.
	ClusterCPUBuilds float64 `json:"cluster_cpu_builds_seconds"`
	ClusterCPUGo     float64 `json:"cluster_cpu_nodes_seconds"`
	ClusterCPUPG     float64 `json:"cluster_cpu_postgres_seconds"`
	ClusterCPURest   float64 `json:"cluster_cpu_rest_seconds"`
	// LowerBound is ⌈jobs ÷ slots⌉ × sleep (sleep workload): no overhead at all.
	LowerBound float64 `json:"lower_bound_seconds,omitempty"`
	// Utilisation is Σ(claim → succeeded) ÷ (cluster wall × slots), best round.
	Utilisation float64        `json:"slot_utilisation"`
	PerBuilder  map[string]int `json:"jobs_per_builder"` // best round
	Retries     int            `json:"retries"`          // jobs claimed more than once, all rounds
	Claims      int            `json:"claims"`           // claim statements, all rounds
	EmptyClaims int            `json:"empty_claims"`     // of which returned no job
	// FailedAttempts are the builders' "build failed" and "build abandoned" log lines (attempts
	// that were retried), all rounds; Failures quotes the first few.
	FailedAttempts int      `json:"failed_attempts"`
	Failures       []string `json:"failures,omitempty"`

	Steps E2ESteps `json:"steps_ms"`
	// PlainBuild is one nix-store --realise of one trivial derivation of the second layer (its
	// two inputs present), ms: the Nix build itself, as a builder runs it, alone on the machine.
	PlainBuild bench.Stat `json:"plain_nix_build_ms"`
	// PlainSlotMs is plain Nix's wall × jobs-at-once ÷ derivations: slot time per derivation.
	PlainSlotMs float64 `json:"plain_nix_slot_ms_per_drv"`
	// OverheadVsBuild is claim → succeeded minus the builder's build step, per job.
	OverheadVsBuild bench.Stat `json:"overhead_vs_build_step_ms"`
	// OverheadVsPlain is claim → succeeded minus PlainBuild's median, per job.
	OverheadVsPlain bench.Stat `json:"overhead_vs_plain_nix_ms"`

	Probe []ProbeStep `json:"probe,omitempty"`
	Trace []TraceStep `json:"nix_processes,omitempty"`
}

// E2ESteps splits claim → succeeded per job (ms).
type E2ESteps struct {
	Claim  bench.Stat `json:"claim"`  // the claim statement, as the worker timed it
	Fetch  bench.Stat `json:"fetch"`  // .drv closure and inputs (builder.Timings.Fetch)
	Build  bench.Stat `json:"build"`  // builder.Timings.Build: input check, nix-store --realise, output check
	Upload bench.Stat `json:"upload"` // NAR dump, compression, PUT
	Sign   bench.Stat `json:"sign"`   // build-complete at the signer, which records the success
	Other  bench.Stat `json:"other"`  // the rest: dispatch, log tail, GC roots, status update, path infos
	Total  bench.Stat `json:"total"`  // claimed_at → finished_at (database clock)
}

// ProbeStep is one step of the uncontended replay: builder.Store's calls on one job at a time in
// a fresh chroot store, from the cluster's cache, after the cluster has finished.
type ProbeStep struct {
	Step string     `json:"step"`
	Stat bench.Stat `json:"ms"`
}

// TraceStep is one kind of Nix process the builders ran (--trace-nix).
type TraceStep struct {
	Kind     string     `json:"kind"`
	Count    int        `json:"count"`
	PerJob   float64    `json:"per_job"`
	Stat     bench.Stat `json:"ms"`
	MsPerJob float64    `json:"ms_per_job"` // their summed time ÷ jobs
	// CPUMs is the mean CPU time of one (user and system, with what it waited for: sandboxed
	// builders included), 10 ms resolution; CPUMsPerJob sums it per job.
	CPUMs       float64 `json:"cpu_ms"`
	CPUMsPerJob float64 `json:"cpu_ms_per_job"`
}

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
	rows, err := b.pool.Query(ctx, queryProjectSucceededJobs, project)
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

func (b *e2e) baseConfig(id, stateDir string) (*config.Config, error) {
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return nil, err
	}
	cfg := config.Default()
	cfg.DatabaseURL, cfg.StateDir, cfg.Listen = b.url, stateDir, "127.0.0.1:0"
	cfg.LogLevel = "warn"
	cfg.Node.ID = id
	cfg.Auth.ClusterSecret = b.token
	cfg.Cluster.Shutdown.DrainTimeout = config.Duration{} // a stopped benchmark kills its builds
	return cfg, nil
}

func (b *e2e) frontConfig() (*config.Config, error) {
	cfg, err := b.baseConfig("e2e-front", filepath.Join(b.dir, "front"))
	if err != nil {
		return nil, err
	}
	cfg.Node.Roles = []string{config.RoleFrontend, config.RoleEvaluator, config.RoleSigner, config.RoleCache}
	cfg.Eval.PollInterval = config.Duration{Duration: time.Second}
	key, err := nix.GenerateKey("bench-e2e-1")
	if err != nil {
		return nil, err
	}
	cfg.Signer.SigningKeyFile = filepath.Join(cfg.StateDir, "signing-key")
	if err := key.WriteFile(cfg.Signer.SigningKeyFile, true); err != nil {
		return nil, err
	}
	return cfg, cfg.Validate()
}

// builderConfig is the configuration of builder id: o.Slots slots, its own chroot store,
// /bin/sleep in the sandbox if sleep, and queue.order order unless "".
func (b *e2e) builderConfig(id string, sleep bool, order string) (*config.Config, error) {
	cfg, err := b.baseConfig(id, filepath.Join(b.dir, "state-"+id))
	if err != nil {
		return nil, err
	}
	cfg.Node.Roles = []string{config.RoleBuilder}
	// A builder holds its node token only, as in a real deployment.
	if cfg.Auth.NodeToken, err = issueToken(b.token, id, cfg.Node.Roles); err != nil {
		return nil, err
	}
	cfg.Auth.ClusterSecret = ""
	cfg.Node.MaxJobs = b.o.Slots
	cfg.Build.NixStore = filepath.Join(b.dir, "store-"+id)
	cfg.Build.Cgroup = b.cgroup
	cfg.Build.ExtraSandboxPaths = nil
	if sleep {
		cfg.Build.ExtraSandboxPaths = []string{"/bin/sleep"}
	}
	if order != "" {
		cfg.Queue.Order = order
	}
	return cfg, cfg.Validate()
}

// sandboxPaths are the sandbox paths of both sides: builder.Store's defaults and the workload's.
func (b *e2e) sandboxPaths(name string) []string {
	var extra []string
	if name == E2ESleep {
		extra = []string{"/bin/sleep"}
	}
	return nix.SandboxPaths(extra)
}

func (b *e2e) expr(name, salt string) string {
	if name == E2ESleep {
		return nixgen.LayeredSleep(salt, b.o.Derivations, b.o.Width, b.o.SleepSeconds)
	}
	return nixgen.Layered(salt, b.o.Derivations, b.o.Width)
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
	if err := b.pool.QueryRow(ctx, queryProjectMakespan, projectID).Scan(&rr.cluster); err != nil {
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
	cpu0 := busyCPU()
	_, own0 := processCPU()
	d, err := b.realise(ctx, store, drvs, jobsAtOnce, b.sandboxPaths(name))
	if err != nil {
		return err
	}
	_, own1 := processCPU()
	rr.nix, rr.nixCPU, rr.nixOwn = d.Seconds(), busyCPU()-cpu0, own1-own0
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
	if e.Status != "succeeded" {
		return 0, fmt.Errorf("evaluation %s: %s", e.Status, e.Error)
	}
	var pending int
	if err := b.pool.QueryRow(ctx, queryProjectPendingCount, e.ProjectID).Scan(&pending); err != nil {
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
	cpu0 := busyCPU()
	self0, children0 := processCPU()
	pg0 := b.postgresCPU()
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
	rr.fromStart, rr.clusterCPU = time.Since(start).Seconds(), busyCPU()-cpu0
	self1, _ := processCPU()
	rr.clusterGo, rr.pg = self1-self0, b.postgresCPU()-pg0
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
	_, children1 := processCPU()
	rr.clusterNix = children1 - children0
	if len(failures) > 0 {
		return fmt.Errorf("%d jobs did not succeed: %s", len(failures), strings.Join(failures[:min(5, len(failures))], "; "))
	}
	return nil
}

// readJobs reads the project's jobs, and counts them per builder.
func (b *e2e) readJobs(ctx context.Context, projectID int64) ([]jobRow, map[string]int, error) {
	rows, err := b.pool.Query(ctx, queryProjectJobs, projectID)
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

// daemonCPU is the CPU time of the live Nix daemons serving the chroot stores: their own, and
// their reaped children's (the builds), seconds. A daemon replaced during the run is missed.
func daemonCPU(stores []string) (own, children float64) {
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range cmdlines {
		b, err := os.ReadFile(f)
		if err != nil || !bytes.HasPrefix(b, []byte("nix-daemon\x00")) ||
			!slices.ContainsFunc(stores, func(s string) bool { return bytes.Contains(b, []byte("\x00"+s+"\x00")) }) {
			continue
		}
		st, err := os.ReadFile(filepath.Join(filepath.Dir(f), "stat"))
		if err != nil {
			continue
		}
		// "pid (comm) state …": fields 14-17, counted from 1, are utime stime cutime cstime.
		fields := strings.Fields(string(st[bytes.LastIndexByte(st, ')')+1:]))
		if len(fields) < 15 {
			continue
		}
		tick := func(i int) float64 { v, _ := strconv.ParseFloat(fields[i-3], 64); return v / 100 } // USER_HZ
		own += tick(14) + tick(15)
		children += tick(16) + tick(17)
	}
	return own, children
}

// busyCPU is the machine's busy CPU time so far, seconds (/proc/stat; 0 where there is none).
func busyCPU() float64 {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	if len(fields) < 8 || fields[0] != "cpu" {
		return 0
	}
	var busy float64
	for i, f := range fields[1:] {
		v, _ := strconv.ParseFloat(f, 64)
		if i != 3 && i != 4 && i < 8 { // user nice system [idle iowait] irq softirq steal
			busy += v
		}
	}
	return busy / 100 // USER_HZ
}

// processCPU is the CPU time of this process and of its reaped descendants, seconds.
func processCPU() (self, children float64) {
	sec := func(ru syscall.Rusage) float64 {
		return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		self = sec(ru)
	}
	if syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru) == nil {
		children = sec(ru)
	}
	return self, children
}

// postgresCPU is the CPU time of the private PostgreSQL so far, seconds: the postmaster with
// its reaped children, and its live children (backends, background workers).
func (b *e2e) postgresCPU() float64 {
	data, err := os.ReadFile(filepath.Join(b.dir, "pg", "data", "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(data), "\n")
	pm, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return 0
	}
	entries, _ := os.ReadDir("/proc")
	var ticks float64
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:])) // f[0] is field 3 (state)
		if len(f) < 15 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		n := 2 // utime, stime
		if pid == pm {
			n = 4 // and cutime, cstime: its exited children
		} else if ppid != pm {
			continue
		}
		for _, v := range f[11 : 11+n] {
			t, _ := strconv.ParseFloat(v, 64)
			ticks += t
		}
	}
	return ticks / 100 // USER_HZ
}

// nixEnv is the environment of the benchmark's own Nix commands: a fresh HOME (no narinfo disk
// cache, no user configuration).
func (b *e2e) nixEnv() ([]string, func(), error) {
	home, err := os.MkdirTemp(b.dir, "home-")
	if err != nil {
		return nil, nil, err
	}
	return append(os.Environ(), "HOME="+home), func() { os.RemoveAll(home) }, nil
}

// instantiate writes expr and instantiates it (attrs, or all of it) into the chroot store at
// root; it returns the .drv paths in the order of attrs.
func (b *e2e) instantiate(ctx context.Context, root, expr string, attrs []string) ([]string, error) {
	file := root + ".nix"
	if err := os.WriteFile(file, []byte(expr), 0o644); err != nil {
		return nil, err
	}
	args := []string{"--store", root, file, "--option", "substituters", "", "--option", "build-users-group", ""}
	for _, a := range attrs {
		args = append(args, "-A", a)
	}
	env, done, err := b.nixEnv()
	if err != nil {
		return nil, err
	}
	defer done()
	cmd := exec.CommandContext(ctx, "nix-instantiate", args...)
	cmd.Env = env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("nix-instantiate: %w: %s", err, stderr.String())
	}
	return strings.Fields(string(out)), nil
}

// realise times plain nix-store --realise of drvs in the chroot store at root, sandboxed as the
// builders' builds are.
func (b *e2e) realise(ctx context.Context, root string, drvs []string, jobs int, sandbox []string) (time.Duration, error) {
	args := append([]string{"--store", root, "--realise"}, drvs...)
	args = append(args, "--max-jobs", strconv.Itoa(jobs),
		"--option", "sandbox", "true", "--option", "sandbox-paths", strings.Join(sandbox, " "),
		"--option", "build-users-group", "", "--option", "substituters", "")
	env, done, err := b.nixEnv()
	if err != nil {
		return 0, err
	}
	defer done()
	cmd := exec.CommandContext(ctx, b.nixBin, args...)
	cmd.Env = env
	cmd.Stdout = io.Discard
	tail := &tailBuffer{}
	cmd.Stderr = tail
	start := time.Now()
	err = cmd.Run()
	d := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("nix-store --realise: %w: %s", err, tail.String())
	}
	return d, nil
}

// tailBuffer keeps what Nix printed for an error message: the first error it reported (the
// build that failed first, with its log lines), else the last 4 KiB. Newer Nix ends a failed
// realise with one line naming every derivation it did not build, hundreds of them here.
type tailBuffer struct{ head, b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	if room := 8<<10 - len(t.head); room > 0 {
		t.head = append(t.head, p[:min(room, len(p))]...)
	}
	t.b = append(t.b, p...)
	if len(t.b) > 8<<10 {
		t.b = append(t.b[:0], t.b[len(t.b)-4<<10:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	lines := strings.Split(string(t.head), "\n")
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "error:") {
			block := lines[i:min(i+12, len(lines))]
			for j, b := range block {
				if len(b) > 300 {
					block[j] = b[:300] + "…"
				}
			}
			return strings.Join(block, "\n")
		}
	}
	return string(t.b)
}

// plainSingle times one nix-store --realise per derivation in a fresh store, o.Samples of the
// second layer once the first is built, so that each builds exactly one derivation with two
// inputs, as a builder's job does: the Nix build itself.
func (b *e2e) plainSingle(ctx context.Context, name, salt string) ([]float64, error) {
	w := b.o.Width
	first, samples := 0, min(b.o.Samples, w)
	if b.o.Derivations >= 2*w {
		first = w
	}
	var attrs []string
	for i := range first + samples {
		attrs = append(attrs, "d"+strconv.Itoa(i))
	}
	store := filepath.Join(b.dir, "single-"+salt)
	drvs, err := b.instantiate(ctx, store, b.expr(name, salt), attrs)
	if err != nil {
		return nil, err
	}
	if first > 0 {
		if _, err := b.realise(ctx, store, drvs[:first], b.o.Builders*b.o.Slots, b.sandboxPaths(name)); err != nil {
			return nil, err
		}
	}
	var out []float64
	for _, drv := range drvs[first:] {
		d, err := b.realise(ctx, store, []string{drv}, 1, b.sandboxPaths(name))
		if err != nil {
			return nil, err
		}
		out = append(out, bench.Ms(d))
	}
	return out, nil
}

// probe replays o.Samples of the round's jobs on one builder.Session, one at a time in a fresh chroot
// store fetching from the cluster's cache, to time each step without contention.
func (b *e2e) probe(ctx context.Context, name string, rows []jobRow) ([]ProbeStep, error) {
	// Jobs with inputs (to substitute from the cache), spread over the DAG, in dependency order
	// (dN depends on lower N only), so that no job's .drv came with an earlier one's closure.
	rows = slices.Clone(rows)
	slices.SortFunc(rows, func(x, y jobRow) int { return drvIndex(x.drv) - drvIndex(y.drv) })
	var withInputs []jobRow
	for _, j := range rows {
		var n int
		if err := b.pool.QueryRow(ctx, queryInputCount, j.drv).Scan(&n); err != nil {
			return nil, err
		}
		if n > 0 {
			withInputs = append(withInputs, j)
		}
	}
	var sample []jobRow
	step := max(1, len(withInputs)/b.o.Samples)
	for i := 0; i < len(withInputs) && len(sample) < b.o.Samples; i += step {
		sample = append(sample, withInputs[i])
	}
	var caches, keys []string
	if err := b.pool.QueryRow(ctx, queryCacheEndpoints).Scan(&caches, &keys); err != nil {
		return nil, err
	}
	if len(caches) == 0 {
		return nil, errors.New("no active cache node")
	}
	st := builder.Store{Root: filepath.Join(b.dir, "probe-store"), Substituters: caches, TrustedKeys: keys}
	if name == E2ESleep {
		st.SandboxPaths = []string{"/bin/sleep"}
	}
	steps := map[string][]float64{}
	order := []string{"open a daemon session (once per slot, not per job)", "derivation over HTTP (Derivation)",
		"inputs' closure over HTTP + AddToStoreNar (EnsureInputs)", "BuildDerivation (Build)",
		"path infos (OutputInfos)", "NarFromPath of the outputs (DumpNAR)", "no-op nix-store process (for scale)"}
	t := time.Now()
	ss, err := st.Open(ctx)
	if err != nil {
		return nil, err
	}
	defer ss.Close()
	steps[order[0]] = append(steps[order[0]], bench.Ms(time.Since(t)))
	for _, j := range sample {
		t := time.Now()
		drv, err := ss.Derivation(ctx, j.drv)
		if err != nil {
			return nil, err
		}
		steps[order[1]] = append(steps[order[1]], bench.Ms(time.Since(t)))
		inputs, err := ss.InputPaths(ctx, j.drv, drv, nil)
		if err != nil {
			return nil, err
		}
		t = time.Now()
		if _, err := ss.EnsureInputs(ctx, inputs, nil, nil); err != nil {
			return nil, err
		}
		steps[order[2]] = append(steps[order[2]], bench.Ms(time.Since(t)))
		t = time.Now()
		outs, err := ss.Build(ctx, j.drv, drv, inputs, builder.BuildLimits{}, io.Discard)
		if err != nil {
			return nil, err
		}
		steps[order[3]] = append(steps[order[3]], bench.Ms(time.Since(t)))
		paths := slices.Sorted(maps.Values(outs))
		t = time.Now()
		if _, err := ss.OutputInfos(ctx, paths); err != nil {
			return nil, err
		}
		steps[order[4]] = append(steps[order[4]], bench.Ms(time.Since(t)))
		t = time.Now()
		for _, p := range paths {
			if err := ss.DumpNAR(ctx, p, io.Discard); err != nil {
				return nil, err
			}
		}
		steps[order[5]] = append(steps[order[5]], bench.Ms(time.Since(t)))
		// What the builder no longer pays per job: the cheapest Nix process on this store,
		// realising a valid path (nothing to do).
		env, done, err := b.nixEnv()
		if err != nil {
			return nil, err
		}
		cmd := exec.CommandContext(ctx, b.nixBin, "--store", st.Root, "--realise", paths[0],
			"--option", "substituters", "", "--option", "build-users-group", "")
		cmd.Env = env
		t = time.Now()
		err = cmd.Run()
		done()
		if err != nil {
			return nil, fmt.Errorf("nix-store --realise: %w", err)
		}
		steps[order[6]] = append(steps[order[6]], bench.Ms(time.Since(t)))
	}
	var out []ProbeStep
	for _, s := range order {
		out = append(out, ProbeStep{Step: s, Stat: bench.Summarize(steps[s])})
	}
	return out, nil
}

// drvIndex is N of a generated derivation dN's .drv path.
func drvIndex(drv string) int {
	name := strings.TrimSuffix(drv[strings.LastIndexByte(drv, '-')+1:], ".drv")
	n, _ := strconv.Atoi(strings.TrimPrefix(name, "d"))
	return n
}

// installTrace puts wrappers of nix and nix-store first on PATH that log each call's start, end
// and arguments to a file, and returns a func restoring PATH.
func (b *e2e) installTrace() (func(), error) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		return nil, fmt.Errorf("--trace-nix needs bash: %w", err)
	}
	shim := filepath.Join(b.dir, "nix-trace")
	if err := os.MkdirAll(shim, 0o755); err != nil {
		return nil, err
	}
	b.traceLn = filepath.Join(shim, "log")
	for _, tool := range []string{"nix", "nix-store"} {
		real, err := exec.LookPath(tool)
		if err != nil {
			return nil, err
		}
		// $EPOCHREALTIME needs no fork; the line is one write (O_APPEND).
		// Fields 16 and 17 of /proc/$$/stat are the CPU ticks of the shell's waited-for
		// children: the Nix process and everything it waited for.
		script := fmt.Sprintf(`#!%s
t0=$EPOCHREALTIME
%q "$@"
rc=$?
t1=$EPOCHREALTIME
a="$*"
read -r st < /proc/$$/stat
st=${st##*) }
set -- $st
printf '%%s %%s %%s %%s %%s %%s\n' "$t0" "$t1" "$rc" "$(( ${14} + ${15} ))" %q "${a:0:600}" >> %q
exit $rc
`, bash, real, tool, b.traceLn)
		if err := os.WriteFile(filepath.Join(shim, tool), []byte(script), 0o755); err != nil {
			return nil, err
		}
	}
	old := os.Getenv("PATH")
	if err := os.Setenv("PATH", shim+string(os.PathListSeparator)+old); err != nil {
		return nil, err
	}
	return func() { os.Setenv("PATH", old) }, nil
}

// readTrace summarises the traced Nix processes run on the builders' stores, then empties the
// log.
func (b *e2e) readTrace(stores []string, jobs int) []TraceStep {
	f, err := os.Open(b.traceLn)
	if err != nil {
		return nil
	}
	defer func() {
		f.Close()
		_ = os.Truncate(b.traceLn, 0)
	}()
	byKind := map[string][]float64{}
	cpuByKind := map[string][]float64{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.SplitN(sc.Text(), " ", 6)
		if len(fields) < 6 {
			continue
		}
		t0, err1 := strconv.ParseFloat(strings.ReplaceAll(fields[0], ",", "."), 64)
		t1, err2 := strconv.ParseFloat(strings.ReplaceAll(fields[1], ",", "."), 64)
		if err1 != nil || err2 != nil {
			continue
		}
		ticks, _ := strconv.ParseFloat(fields[3], 64)
		tool, args := fields[4], fields[5]
		if !slices.ContainsFunc(stores, func(s string) bool { return strings.Contains(args, "--store "+s+" ") }) {
			continue
		}
		var kind string
		switch {
		case tool == "nix" && strings.Contains(args, " copy "):
			kind = "nix copy --derivation (fetch the .drv closure)"
		case tool == "nix-store" && strings.Contains(args, "--realise") && strings.Contains(args, "--option sandbox true"):
			kind = "nix-store --realise (the build)"
		case tool == "nix-store" && strings.Contains(args, "--realise"):
			kind = "nix-store --realise (substitute inputs)"
		default:
			first, _, _ := strings.Cut(args, " ")
			kind = tool + " " + first
		}
		byKind[kind] = append(byKind[kind], (t1-t0)*1000)
		cpuByKind[kind] = append(cpuByKind[kind], ticks*10) // USER_HZ 100
	}
	var out []TraceStep
	var all, allCPU []float64
	sum := func(xs []float64) float64 {
		var s float64
		for _, v := range xs {
			s += v
		}
		return s
	}
	perJob := func(kind string, d, cpu []float64) TraceStep {
		n := float64(max(1, jobs))
		return TraceStep{Kind: kind, Count: len(d), PerJob: float64(len(d)) / n, Stat: bench.Summarize(d), MsPerJob: sum(d) / n,
			CPUMs: sum(cpu) / float64(max(1, len(cpu))), CPUMsPerJob: sum(cpu) / n}
	}
	for kind, d := range byKind {
		out = append(out, perJob(kind, d, cpuByKind[kind]))
		all = append(all, d...)
		allCPU = append(allCPU, cpuByKind[kind]...)
	}
	slices.SortFunc(out, func(a, b TraceStep) int { return strings.Compare(a.Kind, b.Kind) })
	return append(out, perJob("all", all, allCPU))
}

// Print writes the report for people.
func (r E2EReport) Print(w io.Writer) {
	fmt.Fprintf(w, "harmonia-ci bench e2e — %s, %s, PostgreSQL %s, %s\n", r.Machine, r.Nix, r.Postgres, r.Date)
	if r.Dir != "" {
		fmt.Fprintf(w, "  kept: %s\n", r.Dir)
	}
	if r.Trivial != nil || r.Sleep != nil {
		r.printLayered(w)
	}
	if r.Deep != nil {
		r.Deep.print(w, r.Builders, r.Slots, r.Rounds)
	}
}

// printLayered writes the trivial and sleep workloads' figures.
func (r E2EReport) printLayered(w io.Writer) {
	jobs := r.Builders * r.Slots
	fmt.Fprintf(w, "  %d derivations in layers of %d (each depends on two of the layer below); %d builders × %d slots,\n", r.Derivations, r.Width, r.Builders, r.Slots)
	fmt.Fprintf(w, "  each its own chroot store; frontend, evaluator, signer and cache on one node; loopback; best of %d round(s)\n", r.Rounds)
	fmt.Fprintf(w, "  plain Nix: nix-store --realise <all .drv> --max-jobs %d into a fresh chroot store, sandboxed; the realise only\n", jobs)
	fmt.Fprintf(w, "  cluster:   first claim → last succeeded (database clock); builders start once the evaluation has succeeded\n")
	if r.BuildCgroup != "" {
		fmt.Fprintf(w, "  builds:    nice 10, in cgroup %s (a tenth of the default CPU weight)\n", r.BuildCgroup)
	} else {
		fmt.Fprintf(w, "  builds:    nice 10, no writable cgroup here: builds and nodes share the CPU by session\n")
	}
	pass := func(ok bool) string {
		if ok {
			return "PASS"
		}
		return "MISS"
	}
	secs := func(xs []float64) string {
		if len(xs) < 2 {
			return ""
		}
		parts := make([]string, len(xs))
		for i, x := range xs {
			parts[i] = fmt.Sprintf("%.2f", x)
		}
		return "  (rounds: " + strings.Join(parts, ", ") + ")"
	}
	row := func(name string, s bench.Stat) {
		fmt.Fprintf(w, "      %-48s %8.1f %8.1f %8.1f\n", name, s.P50, s.P90, s.Mean)
	}
	for _, wl := range []*E2EWorkload{r.Trivial, r.Sleep} {
		if wl == nil {
			continue
		}
		fmt.Fprintln(w)
		if wl.Name == E2ESleep {
			fmt.Fprintf(w, "  sleep builds (each sleeps %g s)\n", wl.SleepSeconds)
		} else {
			fmt.Fprintf(w, "  trivial builds\n")
		}
		fmt.Fprintf(w, "    plain Nix -j%-3d   %8.2f s   (%.0f ms of slot time per derivation)%s\n", jobs, wl.BestNix, wl.PlainSlotMs, secs(wl.NixSeconds))
		fmt.Fprintf(w, "    cluster          %8.2f s   ratio %.2f", wl.BestCluster, wl.Ratio)
		target := r.TargetTrivialRatio
		if wl.Name == E2ESleep {
			target = r.TargetRatio
		}
		fmt.Fprintf(w, "   target ≤ %.1f: %s", target, pass(wl.Ratio <= target))
		fmt.Fprintf(w, "%s\n", secs(wl.ClusterSeconds))
		fmt.Fprintf(w, "    builders' start → last succeeded %.2f s; evaluation %.2f s; slot utilisation %.0f %%\n",
			bench.MinOf(wl.FromStartSeconds), bench.MinOf(wl.EvalSeconds), 100*wl.Utilisation)
		perJob := func(s float64) float64 { return 1000 * s / float64(wl.Jobs) }
		fmt.Fprintf(w, "    busy CPU, whole machine, per derivation: plain Nix %.0f ms (nix-store and builds %.0f ms); cluster %.0f ms =\n",
			perJob(wl.NixCPU), perJob(wl.NixCPUOwn), perJob(wl.ClusterCPU))
		fmt.Fprintf(w, "      Nix daemons and builds %.0f ms + nodes (Go) %.0f ms + PostgreSQL %.0f ms + rest (anything else) %.0f ms\n",
			perJob(wl.ClusterCPUNix), perJob(wl.ClusterCPUGo), perJob(wl.ClusterCPUPG), perJob(wl.ClusterCPURest))
		fmt.Fprintf(w, "    CPU outside the build itself, per job: %.0f ms (the cluster's busy CPU but the builds' own %.0f ms, which the daemons reaped)\n",
			perJob(wl.ClusterCPU-wl.ClusterCPUBuilds), perJob(wl.ClusterCPUBuilds))
		if wl.LowerBound > 0 {
			fmt.Fprintf(w, "    lower bound ⌈%d jobs ÷ %d slots⌉ × %g s = %.1f s (plain Nix ÷ bound %.2f, cluster ÷ bound %.2f)\n",
				wl.Jobs, jobs, wl.SleepSeconds, wl.LowerBound, wl.BestNix/wl.LowerBound, wl.BestCluster/wl.LowerBound)
		}
		var per []string
		for id, n := range wl.PerBuilder {
			per = append(per, fmt.Sprintf("%s %d", id, n))
		}
		slices.Sort(per)
		fmt.Fprintf(w, "    jobs per builder: %s; %d retried; %d claims, %d empty\n", strings.Join(per, ", "), wl.Retries, wl.Claims, wl.EmptyClaims)
		if wl.FailedAttempts > 0 {
			fmt.Fprintf(w, "    failed attempts (retried): %d\n", wl.FailedAttempts)
			for _, f := range wl.Failures {
				fmt.Fprintf(w, "      %s\n", f)
			}
		}
		fmt.Fprintf(w, "    per job (%d jobs), ms                                   p50      p90     mean\n", wl.Steps.Total.N)
		row("claim", wl.Steps.Claim)
		row("fetch inputs", wl.Steps.Fetch)
		row("build", wl.Steps.Build)
		row("upload", wl.Steps.Upload)
		row("sign", wl.Steps.Sign)
		row("other (unaccounted)", wl.Steps.Other)
		row("claim → succeeded", wl.Steps.Total)
		row("overhead: total − build step", wl.OverheadVsBuild)
		if wl.PlainBuild.N > 0 {
			row("overhead: total − plain Nix build", wl.OverheadVsPlain)
			fmt.Fprintf(w, "    plain Nix build of one derivation (one nix-store --realise, inputs present, alone): p50 %.1f ms, p90 %.1f ms (%d samples)\n",
				wl.PlainBuild.P50, wl.PlainBuild.P90, wl.PlainBuild.N)
		}
		if wl.Name == E2ETrivial {
			fmt.Fprintf(w, "    target: median overhead ≤ %.0f ms: %s against the build step (%.1f ms), %s against plain Nix (%.1f ms)\n",
				r.TargetMs, pass(wl.OverheadVsBuild.P50 <= r.TargetMs), wl.OverheadVsBuild.P50,
				pass(wl.PlainBuild.N > 0 && wl.OverheadVsPlain.P50 <= r.TargetMs), wl.OverheadVsPlain.P50)
		}
		if len(wl.Probe) > 0 {
			fmt.Fprintf(w, "    uncontended replay (one builder.Session, one job at a time, fresh store, inputs from the cache), ms\n")
			for _, p := range wl.Probe {
				row(p.Step, p.Stat)
			}
		}
		if r.TraceNix && len(wl.Trace) == 0 {
			fmt.Fprintf(w, "    Nix processes on the builders (--trace-nix, round 1): none (nix and nix-store; the daemon sessions are not traced)\n")
		}
		if len(wl.Trace) > 0 {
			fmt.Fprintf(w, "    Nix processes on the builders (--trace-nix, round 1)   per job   p50 ms   p90 ms   ms/job   CPU ms  CPU ms/job\n")
			for _, t := range wl.Trace {
				fmt.Fprintf(w, "      %-50s %5.2f %8.1f %8.1f %8.1f %8.1f %8.1f\n", t.Kind, t.PerJob, t.Stat.P50, t.Stat.P90, t.MsPerJob, t.CPUMs, t.CPUMsPerJob)
			}
		}
	}
}

// issueToken returns the node token of node id in roles under the cluster secret.
func issueToken(secret, id string, roles []string) (string, error) {
	k, err := nodetoken.NewKey(secret)
	if err != nil {
		return "", err
	}
	return k.Issue(nodetoken.Identity{NodeID: id, Roles: roles})
}

// unfinishedJobs counts the projects' jobs still pending or in progress, and describes those
// that ended without success.
func unfinishedJobs(ctx context.Context, pool *pgxpool.Pool, projects []int64) (open int, failures []string, err error) {
	rows, err := pool.Query(ctx, queryUnsucceededJobs, projects)
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
