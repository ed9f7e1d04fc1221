// Package evalbench is `harmonia-ci bench eval`: an evaluation of a generated project by an
// in-process node against bare nix-instantiate of the same shape.
package evalbench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/bench"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/eval"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixgen"
	"github.com/harmonia-ci/harmonia-ci/internal/node"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// EvalOptions configures `harmonia-ci bench eval`.
type EvalOptions struct {
	Derivations int // default 10000
	Width       int // derivations per layer; default 100
	Rounds      int // each side runs this often with fresh salts; the best is kept; default 2
	Workers     int // the evaluator's [eval] workers; default the machine's cores
	// Nodes is how many evaluator nodes take part in each evaluation: the first, which also
	// runs the frontend, signer and cache roles, and Nodes-1 running the evaluator role alone,
	// which walk units of the first's evaluations. Default 1.
	Nodes int
	// WorkerMemory, with --shape packages, adds a run of Workers walkers each bounded to this
	// many bytes ([eval] max_memory_per_worker), to set below what one walker needs; 0: none.
	WorkerMemory int64
	Logger       *slog.Logger
}

// EvalReport is what the benchmark measured.
type EvalReport struct {
	Date        string `json:"date"`
	Machine     string `json:"machine"`
	Nix         string `json:"nix"`
	Postgres    string `json:"postgres"`
	Derivations int    `json:"derivations"`
	Width       int    `json:"width"`
	Rounds      int    `json:"rounds"`
	Workers     int    `json:"workers"`
	Nodes       int    `json:"nodes"`
	// NixSeconds is bare nix-instantiate of the same kind of expression (another salt, so its
	// .drv files are new too).
	NixSeconds float64 `json:"nix_instantiate_seconds"`
	// EvalSeconds runs from the request to the evaluation's success: mirror fetch, the walk,
	// ingestion and publication of the .drv closure (its narinfos and .drv files signed and
	// stored in PostgreSQL, blob.Derivations).
	EvalSeconds   float64 `json:"eval_seconds"`
	Ratio         float64 `json:"ratio_eval_to_nix"`
	Rows          int64   `json:"rows"`
	RowsPerSecond float64 `json:"rows_per_second"`
	Jobs          int64   `json:"jobs"`
	Published     int64   `json:"published_narinfos"`
	// UnitsByNode counts, over every round, the units of the attribute tree each evaluator node
	// walked (nothing with one node: it keeps its units in memory).
	UnitsByNode map[string]int `json:"units_by_node,omitempty"`
	// Identical: every round's evaluation recorded one attribute, derivation and job per
	// generated derivation and no error, what a single walker records.
	Identical bool `json:"identical"`
}

func (o *EvalOptions) defaults() {
	o.Derivations = bench.Positive(o.Derivations, 10000)
	o.Width = bench.Positive(o.Width, 100)
	o.Workers = bench.Positive(o.Workers, config.DefaultEvalWorkers())
	o.Rounds = bench.Positive(o.Rounds, 2)
	o.Nodes = bench.Positive(o.Nodes, 1)
	if o.Derivations < o.Width {
		o.Width = o.Derivations
	}
	o.Logger = bench.Logger(o.Logger)
}

// Eval measures an evaluation of a generated project of o.Derivations derivations (layers of
// o.Width, each derivation depending on two of the layer below) by a node running the frontend,
// evaluator, signer and cache roles in this process, against bare nix-instantiate of the same
// shape in the same run.
func Eval(ctx context.Context, o EvalOptions) (EvalReport, error) {
	o.defaults()
	r := EvalReport{
		Date: time.Now().UTC().Format(time.RFC3339), Derivations: o.Derivations, Width: o.Width, Rounds: o.Rounds, Workers: o.Workers,
		Nodes: o.Nodes, Machine: bench.Machine(),
		Nix: bench.ToolVersion("nix-instantiate", "--version"),
	}
	if err := bench.NeedTool("nix-instantiate", "install nix-bin (scripts/deps.sh bench)"); err != nil {
		return r, fmt.Errorf("bench eval: %w", err)
	}
	if err := bench.NeedTool("git", "install git"); err != nil {
		return r, fmt.Errorf("bench eval: %w", err)
	}
	dir, err := os.MkdirTemp("", "hci-bench-eval-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil { // the embedded server runs as postgres when root
		return r, err
	}
	d, err := bench.OpenDatabase(ctx, bench.DatabaseOptions{URL: "", Dir: filepath.Join(dir, "pg"), MaxServerConns: 100, App: "harmonia-ci bench eval", PoolConns: 4, Logger: o.Logger})
	if err != nil {
		return r, err
	}
	defer d.Close()
	url, pool := d.URL, d.Pool
	r.Postgres = d.Version
	cfg, err := evalNodeConfig(filepath.Join(dir, "state"), url, o.Workers)
	if err != nil {
		return r, err
	}
	nodeDone := make(chan error, 1) // the node stopped on its own
	nodes := []*bench.Node{bench.StartNode(ctx, cfg, o.Logger, node.Options{Version: "bench"}, nodeDone)}
	defer func() {
		for _, n := range nodes {
			n.Stop()
		}
	}()
	for i := 2; i <= o.Nodes; i++ {
		hcfg := *cfg
		hcfg.Node.ID = fmt.Sprintf("bench-eval-%d", i)
		hcfg.Node.Roles = []string{config.RoleEvaluator}
		hcfg.StateDir = filepath.Join(dir, hcfg.Node.ID)
		if err := os.MkdirAll(hcfg.StateDir, 0o755); err != nil {
			return r, err
		}
		nodes = append(nodes, bench.StartNode(ctx, &hcfg, o.Logger, node.Options{Version: "bench"}, nodeDone))
	}
	if err := bench.WaitReady(ctx, nodes...); err != nil {
		return r, err
	}
	rn := &evalRound{o: o, pool: pool, dir: dir, nodeDone: nodeDone}
	for round := 1; round <= o.Rounds; round++ {
		nixSecs, evalSecs, err := rn.run(ctx, round)
		if err != nil {
			return r, err
		}
		if r.NixSeconds == 0 || nixSecs < r.NixSeconds {
			r.NixSeconds = nixSecs
		}
		if r.EvalSeconds == 0 || evalSecs < r.EvalSeconds {
			r.EvalSeconds = evalSecs
		}
	}
	r.Ratio = r.EvalSeconds / r.NixSeconds
	err = pool.QueryRow(ctx, sqlGraphRows).Scan(&r.Rows, &r.Jobs)
	if err != nil {
		return r, err
	}
	r.Rows /= int64(o.Rounds) // every round ingests the same number of rows
	r.Jobs /= int64(o.Rounds)
	r.RowsPerSecond = float64(r.Rows) / r.EvalSeconds
	// The .drv files' narinfos are rows (blob.Derivations); sources' are files.
	narinfos, _ := filepath.Glob(filepath.Join(cfg.StateDir, "cache", "*.narinfo"))
	var drvObjects int64
	if err := pool.QueryRow(ctx, sqlDrvObjectCount).Scan(&drvObjects); err != nil {
		return r, err
	}
	r.Published = (int64(len(narinfos)) + drvObjects) / int64(o.Rounds)
	if r.Jobs != int64(o.Derivations) {
		return r, fmt.Errorf("evaluation made %d jobs for %d derivations", r.Jobs, o.Derivations)
	}
	rows, err := pool.Query(ctx, sqlUnitsByNode)
	if err != nil {
		return r, err
	}
	for rows.Next() {
		var node string
		var units int
		if err := rows.Scan(&node, &units); err != nil {
			return r, err
		}
		if r.UnitsByNode == nil {
			r.UnitsByNode = map[string]int{}
		}
		r.UnitsByNode[node] = units
	}
	if err := rows.Err(); err != nil {
		return r, err
	}
	var attrs, errs, derivations int64
	if err := pool.QueryRow(ctx, sqlEvalTotals).Scan(&attrs, &errs, &derivations); err != nil {
		return r, err
	}
	want := int64(o.Derivations * o.Rounds)
	r.Identical = attrs == want && errs == 0 && derivations == want && r.Jobs == int64(o.Derivations)
	return r, nil
}

// evalRound is one round of the benchmark on the running node: the same shape of fresh
// derivations, evaluated by bare nix-instantiate and by harmonia-ci.
type evalRound struct {
	o        EvalOptions
	pool     *pgxpool.Pool
	dir      string
	nodeDone <-chan error
}

// run times round's two sides, in seconds.
func (rn *evalRound) run(ctx context.Context, round int) (nixSecs, evalSecs float64, err error) {
	o := rn.o
	salt := bench.RandomHex(8)
	bare, err := bench.MakeRepo(filepath.Join(rn.dir, "bare-"+salt), nixgen.Layered("bare-"+salt, o.Derivations, o.Width))
	if err != nil {
		return 0, 0, err
	}
	ours, err := bench.MakeRepo(filepath.Join(rn.dir, "ours-"+salt), nixgen.Layered("ours-"+salt, o.Derivations, o.Width))
	if err != nil {
		return 0, 0, err
	}
	o.Logger.Info("bare nix-instantiate", "round", round, "derivations", o.Derivations)
	if nixSecs, err = instantiate(ctx, filepath.Join(bare, "ci.nix")); err != nil {
		return 0, 0, err
	}
	o.Logger.Info("harmonia-ci evaluation", "round", round, "derivations", o.Derivations)
	evalSecs, err = rn.evaluate(ctx, "bench-"+salt, ours)
	return nixSecs, evalSecs, err
}

// instantiate times bare nix-instantiate of file.
func instantiate(ctx context.Context, file string) (float64, error) {
	start := time.Now()
	cmd := exec.CommandContext(ctx, "nix-instantiate", file, "--option", "substituters", "")
	var stderr strings.Builder
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("nix-instantiate: %w: %s", err, stderr.String())
	}
	return time.Since(start).Seconds(), nil
}

// evaluate adds project name on repo and times its evaluation by the node, from the trigger to
// its success.
func (rn *evalRound) evaluate(ctx context.Context, name, repo string) (float64, error) {
	if _, err := project.Add(ctx, rn.pool, project.AddParams{Name: name, RepoURL: repo}); err != nil {
		return 0, err
	}
	start := time.Now()
	e, _, err := eval.Trigger(ctx, rn.pool, eval.TriggerParams{Project: name, StateDir: filepath.Join(rn.dir, "cli")})
	if err != nil {
		return 0, err
	}
	if err := bench.WaitFor(ctx, rn.nodeDone, func() (bool, error) {
		e, err = evaluation.Get(ctx, rn.pool, e.ID)
		return e.Finished(), err
	}); err != nil {
		return 0, err
	}
	secs := time.Since(start).Seconds()
	if e.Status != status.EvalSucceeded {
		return 0, fmt.Errorf("evaluation %s: %s", e.Status, e.Error)
	}
	return secs, nil
}

func evalNodeConfig(stateDir, url string, workers int) (*config.Config, error) {
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return nil, err
	}
	cfg := config.Default()
	cfg.DatabaseURL, cfg.StateDir, cfg.Listen = url, stateDir, "127.0.0.1:0"
	cfg.LogLevel = "warn"
	cfg.Node.ID = "bench-eval"
	cfg.Node.Roles = []string{config.RoleFrontend, config.RoleEvaluator, config.RoleSigner, config.RoleCache}
	cfg.Eval.PollInterval = config.Duration{Duration: time.Second}
	cfg.Eval.Workers = workers
	cfg.Auth.ClusterSecret = bench.RandomHex(16)
	key, err := nix.GenerateKey("bench-eval-1")
	if err != nil {
		return nil, err
	}
	cfg.Signer.SigningKeyFile = filepath.Join(stateDir, "signing-key")
	if err := key.WriteFile(cfg.Signer.SigningKeyFile, true); err != nil {
		return nil, err
	}
	return cfg, nil
}
