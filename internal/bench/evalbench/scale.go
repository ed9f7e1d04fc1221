package evalbench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/bench"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/eval"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/nixgen"
	"github.com/harmonia-ci/harmonia-ci/internal/node"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// ScaleReport is `harmonia-ci bench eval --shape packages`: a package set shaped like
// nixpkgs (nixgen.PackageSet) evaluated by bare single-process nix-instantiate, and by
// harmonia-ci with one walker and with Workers, each on a fresh salt.
type ScaleReport struct {
	Date        string   `json:"date"`
	Machine     string   `json:"machine"`
	Nix         string   `json:"nix"`
	Postgres    string   `json:"postgres"`
	Derivations int      `json:"derivations"`
	Workers     int      `json:"workers"`
	Bare        ScaleRun `json:"bare_nix_instantiate"`
	One         ScaleRun `json:"one_worker"`
	Many        ScaleRun `json:"workers_run"`
	// Efficiency is the one-walker run's CPU time over the workers run's wall time times its
	// workers: 1 when the workers split the same work perfectly.
	Efficiency float64 `json:"parallel_efficiency"`
	// Identical says the two harmonia-ci runs recorded the same attributes, errors and jobs.
	Identical bool `json:"identical"`
	// Bounded is the run with each walker bounded to WorkerMemoryMB (nil: not asked for), and
	// BoundedIdentical says it recorded the same attributes, errors and jobs as the unbounded.
	WorkerMemoryMB   float64   `json:"worker_memory_mb,omitempty"`
	Bounded          *ScaleRun `json:"bounded_run,omitempty"`
	BoundedIdentical bool      `json:"bounded_identical,omitempty"`
}

// ScaleRun is one side's figures. CPU times are seconds: Nix is the Nix processes (bare
// nix-instantiate, or the walkers and the evaluation's daemon), Node this process's Go code
// (the node), Postgres the private server.
type ScaleRun struct {
	Seconds     float64 `json:"seconds"`
	Ratio       float64 `json:"ratio_to_bare"`
	NixCPU      float64 `json:"nix_cpu_seconds"`
	NodeCPU     float64 `json:"node_cpu_seconds"`
	PostgresCPU float64 `json:"postgres_cpu_seconds"`
	// PeakWorkerMB is the largest resident set of one Nix evaluation process (VmHWM).
	PeakWorkerMB float64 `json:"peak_worker_mb"`
	Attributes   int64   `json:"attributes"`
	EvalErrors   int64   `json:"eval_errors"`
	Jobs         int64   `json:"jobs"`
	Restarts     int64   `json:"worker_restarts"`
}

// CPU is the run's CPU time, all processes.
func (r ScaleRun) CPU() float64 { return r.NixCPU + r.NodeCPU + r.PostgresCPU }

// Scale runs the package-set benchmark.
func Scale(ctx context.Context, o EvalOptions) (ScaleReport, error) {
	if o.Workers == 0 {
		o.Workers = runtime.NumCPU() // compared with one walker, so more than the default
	}
	o.defaults()
	r := ScaleReport{Date: time.Now().UTC().Format(time.RFC3339), Machine: bench.Machine(), Derivations: o.Derivations,
		Workers: o.Workers, Nix: bench.ToolVersion("nix-instantiate", "--version")}
	if err := bench.NeedTool("nix-instantiate", "install nix-bin (scripts/deps.sh bench)"); err != nil {
		return r, fmt.Errorf("bench eval: %w", err)
	}
	dir, err := os.MkdirTemp("", "hci-bench-scale-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil { // the embedded server runs as postgres when root
		return r, err
	}
	d, err := bench.OpenDatabase(ctx, bench.DatabaseOptions{Dir: filepath.Join(dir, "pg"), MaxServerConns: 100, App: "harmonia-ci bench eval", PoolConns: 4, Logger: o.Logger})
	if err != nil {
		return r, err
	}
	defer d.Close()
	r.Postgres = d.Version
	s := &scale{o: o, dir: dir, url: d.URL, pool: d.Pool, pgData: filepath.Join(dir, "pg", "data")}

	if r.Bare, err = s.bare(ctx); err != nil {
		return r, err
	}
	if r.One, err = s.ours(ctx, 1); err != nil {
		return r, err
	}
	if r.Many, err = s.ours(ctx, o.Workers); err != nil {
		return r, err
	}
	runs := []*ScaleRun{&r.One, &r.Many}
	if o.WorkerMemory > 0 {
		s.workerMemory = o.WorkerMemory
		bounded, err := s.ours(ctx, o.Workers)
		if err != nil {
			return r, err
		}
		r.WorkerMemoryMB, r.Bounded = float64(o.WorkerMemory)/(1<<20), &bounded
		r.BoundedIdentical = sameShape(r.One, bounded)
		runs = append(runs, r.Bounded)
	}
	for _, run := range runs {
		run.Ratio = run.Seconds / r.Bare.Seconds
	}
	r.Efficiency = r.One.CPU() / (r.Many.Seconds * float64(o.Workers))
	r.Identical = sameShape(r.One, r.Many)
	return r, nil
}

// sameShape says two runs recorded the same numbers of attributes, errors and jobs.
func sameShape(a, b ScaleRun) bool {
	return a.Attributes == b.Attributes && a.EvalErrors == b.EvalErrors && a.Jobs == b.Jobs
}

type scale struct {
	o            EvalOptions
	workerMemory int64 // [eval] max_memory_per_worker of the next run; 0: the default
	dir          string
	url          string
	pool         *pgxpool.Pool
	pgData       string
}

// bare times single-process nix-instantiate of the set without its throwing attributes (it
// would stop at the first).
func (s *scale) bare(ctx context.Context) (ScaleRun, error) {
	var run ScaleRun
	salt := "bare-" + bench.RandomHex(8)
	repo, err := bench.MakeRepo(filepath.Join(s.dir, salt), nixgen.PackageSet(salt, s.o.Derivations, false))
	if err != nil {
		return run, err
	}
	s.o.Logger.Info("bare nix-instantiate", "derivations", s.o.Derivations)
	cmd := exec.CommandContext(ctx, "nix-instantiate", filepath.Join(repo, "ci.nix"), "--option", "substituters", "")
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return run, fmt.Errorf("nix-instantiate: %w: %s", err, stderr.String())
	}
	run.Seconds = time.Since(start).Seconds()
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		run.NixCPU = float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
		run.PeakWorkerMB = float64(ru.Maxrss) / 1024 // KiB
	}
	return run, nil
}

// ours times an evaluation of the set (with its throwing attributes) by a node of workers
// walkers, started for it and stopped after.
func (s *scale) ours(ctx context.Context, workers int) (ScaleRun, error) {
	var run ScaleRun
	salt := fmt.Sprintf("w%d-%s", workers, bench.RandomHex(8))
	repo, err := bench.MakeRepo(filepath.Join(s.dir, salt), nixgen.PackageSet(salt, s.o.Derivations, true))
	if err != nil {
		return run, err
	}
	cfg, err := evalNodeConfig(filepath.Join(s.dir, "state-"+salt), s.url, workers)
	if err != nil {
		return run, err
	}
	cfg.Node.ID = "bench-eval-" + strconv.Itoa(workers)
	if s.workerMemory > 0 {
		cfg.Node.ID += "-bounded"
		cfg.Eval.MaxMemoryPerWorker = config.ByteSize(s.workerMemory)
	}
	nodeDone := make(chan error, 1)
	n := bench.StartNode(ctx, cfg, s.o.Logger, node.Options{Version: "bench"}, nodeDone)
	defer n.Stop()
	if err := bench.WaitReady(ctx, n); err != nil {
		return run, err
	}
	name := "bench-" + salt
	if _, err := project.Add(ctx, s.pool, project.AddParams{Name: name, RepoURL: repo}); err != nil {
		return run, err
	}
	s.o.Logger.Info("harmonia-ci evaluation", "workers", workers, "derivations", s.o.Derivations)
	peak := watchPeak()
	self0, children0 := bench.ProcessCPU()
	pg0 := bench.PostgresCPU(s.pgData)
	start := time.Now()
	e, _, err := eval.Trigger(ctx, s.pool, eval.TriggerParams{Project: name, StateDir: filepath.Join(s.dir, "cli")})
	if err != nil {
		peak()
		return run, err
	}
	err = bench.WaitFor(ctx, nodeDone, func() (bool, error) {
		e, err = evaluation.Get(ctx, s.pool, e.ID)
		return e.Finished(), err
	})
	run.Seconds = time.Since(start).Seconds()
	run.PeakWorkerMB = peak()
	if err != nil {
		return run, err
	}
	self1, children1 := bench.ProcessCPU()
	run.NodeCPU, run.NixCPU, run.PostgresCPU = self1-self0, children1-children0, bench.PostgresCPU(s.pgData)-pg0
	if e.Status != status.EvalSucceeded {
		return run, fmt.Errorf("evaluation with %d workers %s: %s", workers, e.Status, e.Error)
	}
	err = s.pool.QueryRow(ctx, sqlEvalShape, e.ID).Scan(&run.Attributes, &run.EvalErrors, &run.Jobs, &run.Restarts)
	return run, err
}

// watchPeak samples the resident set high-water mark (VmHWM) of every nix-instantiate
// process on the machine until the returned function is called, which returns the largest,
// in MB. Walkers live seconds; a sample every 100 ms sees each one's high-water mark close
// to its end.
func watchPeak() func() float64 {
	stop := make(chan struct{})
	var mu sync.Mutex
	var peakKB float64
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			kb := nixHWM()
			mu.Lock()
			peakKB = max(peakKB, kb)
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	return func() float64 {
		close(stop)
		<-done
		mu.Lock()
		defer mu.Unlock()
		return peakKB / 1024
	}
}

// nixHWM is the largest VmHWM of the live nix-instantiate processes, KiB.
func nixHWM() float64 {
	var most float64
	comms, _ := filepath.Glob("/proc/[0-9]*/comm")
	for _, c := range comms {
		b, err := os.ReadFile(c)
		if err != nil || !bytes.Equal(bytes.TrimSpace(b), []byte("nix-instantiate")) {
			continue
		}
		st, err := os.ReadFile(filepath.Join(filepath.Dir(c), "status"))
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(st), "\n") {
			if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
				most = max(most, kb)
			}
		}
	}
	return most
}
