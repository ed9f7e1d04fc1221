package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/eval"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixgen"
	"github.com/harmonia-ci/harmonia-ci/internal/node"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
)

// EvalOptions configures `harmonia-ci bench eval`.
type EvalOptions struct {
	Derivations int // default 10000
	Width       int // derivations per layer; default 100
	Rounds      int // each side runs this often with fresh salts; the best is kept; default 2
	Logger      *slog.Logger
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
}

func (o *EvalOptions) defaults() {
	if o.Derivations <= 0 {
		o.Derivations = 10000
	}
	if o.Width <= 0 {
		o.Width = 100
	}
	if o.Rounds <= 0 {
		o.Rounds = 2
	}
	if o.Derivations < o.Width {
		o.Width = o.Derivations
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// Eval measures an evaluation of a generated project of o.Derivations derivations (layers of
// o.Width, each derivation depending on two of the layer below) by a node running the frontend,
// evaluator, signer and cache roles in this process, against bare nix-instantiate of the same
// shape in the same run.
func Eval(ctx context.Context, o EvalOptions) (EvalReport, error) {
	o.defaults()
	r := EvalReport{
		Date: time.Now().UTC().Format(time.RFC3339), Derivations: o.Derivations, Width: o.Width, Rounds: o.Rounds,
		Machine: fmt.Sprintf("%s/%s, %d CPUs", runtime.GOOS, runtime.GOARCH, runtime.NumCPU()),
		Nix:     toolVersion("nix-instantiate", "--version"),
	}
	if err := needTool("nix-instantiate", "install nix-bin (scripts/deps.sh bench)"); err != nil {
		return r, err
	}
	if err := needTool("git", "install git"); err != nil {
		return r, err
	}
	dir, err := os.MkdirTemp("", "hci-bench-eval-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil { // the embedded server runs as postgres when root
		return r, err
	}
	d, err := openDatabase(ctx, "", filepath.Join(dir, "pg"), 100, "harmonia-ci bench eval", 4, o.Logger)
	if err != nil {
		return r, err
	}
	defer d.Close()
	url, pool := d.URL, d.Pool
	r.Postgres = d.Version
	cfg, err := evalNodeConfig(filepath.Join(dir, "state"), url)
	if err != nil {
		return r, err
	}
	nctx, stopNode := context.WithCancel(ctx)
	nodeDone := make(chan error, 1)
	go func() { nodeDone <- node.Run(nctx, cfg, o.Logger, node.Options{Version: "bench"}) }()
	defer func() {
		stopNode()
		<-nodeDone
	}()

	if err := waitFor(ctx, nodeDone, func() (bool, error) {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM nodes WHERE status = 'active'`).Scan(&n)
		return n > 0, err
	}); err != nil {
		return r, fmt.Errorf("node did not become active: %w", err)
	}
	for round := 1; round <= o.Rounds; round++ {
		salt := randomHex(8)
		bare, err := makeRepo(filepath.Join(dir, "bare-"+salt), nixgen.Layered("bare-"+salt, o.Derivations, o.Width))
		if err != nil {
			return r, err
		}
		ours, err := makeRepo(filepath.Join(dir, "ours-"+salt), nixgen.Layered("ours-"+salt, o.Derivations, o.Width))
		if err != nil {
			return r, err
		}
		o.Logger.Info("bare nix-instantiate", "round", round, "derivations", o.Derivations)
		start := time.Now()
		cmd := exec.CommandContext(ctx, "nix-instantiate", filepath.Join(bare, "ci.nix"), "--option", "substituters", "")
		var stderr strings.Builder
		cmd.Stdout, cmd.Stderr = io.Discard, &stderr
		if err := cmd.Run(); err != nil {
			return r, fmt.Errorf("nix-instantiate: %w: %s", err, stderr.String())
		}
		if secs := time.Since(start).Seconds(); r.NixSeconds == 0 || secs < r.NixSeconds {
			r.NixSeconds = secs
		}

		name := "bench-" + salt
		if _, err := project.Add(ctx, pool, project.AddParams{Name: name, RepoURL: ours}); err != nil {
			return r, err
		}
		o.Logger.Info("harmonia-ci evaluation", "round", round, "derivations", o.Derivations)
		start = time.Now()
		e, _, err := eval.Trigger(ctx, pool, eval.TriggerParams{Project: name, StateDir: filepath.Join(dir, "cli")})
		if err != nil {
			return r, err
		}
		if err := waitFor(ctx, nodeDone, func() (bool, error) {
			e, err = evaluation.Get(ctx, pool, e.ID)
			return e.Finished(), err
		}); err != nil {
			return r, err
		}
		secs := time.Since(start).Seconds()
		if e.Status != "succeeded" {
			return r, fmt.Errorf("evaluation %s: %s", e.Status, e.Error)
		}
		if r.EvalSeconds == 0 || secs < r.EvalSeconds {
			r.EvalSeconds = secs
		}
	}
	r.Ratio = r.EvalSeconds / r.NixSeconds
	err = pool.QueryRow(ctx, `SELECT
	    (SELECT count(*) FROM derivations) + (SELECT count(*) FROM derivation_outputs) +
	    (SELECT count(*) FROM derivation_inputs) + (SELECT count(*) FROM eval_attrs) +
	    (SELECT count(*) FROM build_jobs),
	    (SELECT count(*) FROM build_jobs)`).Scan(&r.Rows, &r.Jobs)
	if err != nil {
		return r, err
	}
	r.Rows /= int64(o.Rounds) // every round ingests the same number of rows
	r.Jobs /= int64(o.Rounds)
	r.RowsPerSecond = float64(r.Rows) / r.EvalSeconds
	// The .drv files' narinfos are rows (blob.Derivations); sources' are files.
	narinfos, _ := filepath.Glob(filepath.Join(cfg.StateDir, "cache", "*.narinfo"))
	var drvObjects int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM drv_objects`).Scan(&drvObjects); err != nil {
		return r, err
	}
	r.Published = (int64(len(narinfos)) + drvObjects) / int64(o.Rounds)
	if r.Jobs != int64(o.Derivations) {
		return r, fmt.Errorf("evaluation made %d jobs for %d derivations", r.Jobs, o.Derivations)
	}
	return r, nil
}

func evalNodeConfig(stateDir, url string) (*config.Config, error) {
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return nil, err
	}
	cfg := config.Default()
	cfg.DatabaseURL, cfg.StateDir, cfg.Listen = url, stateDir, "127.0.0.1:0"
	cfg.LogLevel = "warn"
	cfg.Node.ID = "bench-eval"
	cfg.Node.Roles = []string{config.RoleFrontend, config.RoleEvaluator, config.RoleSigner, config.RoleCache}
	cfg.Eval.PollInterval = config.Duration{Duration: time.Second}
	cfg.Auth.ClusterSecret = randomHex(16)
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

// makeRepo commits ci.nix into a new git repository at dir.
func makeRepo(dir, expr string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "ci.nix"), []byte(expr), 0o644); err != nil {
		return "", err
	}
	for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"add", "ci.nix"}, {"commit", "-q", "-m", "generated"}} {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_AUTHOR_NAME=bench",
			"GIT_AUTHOR_EMAIL=bench@example.invalid", "GIT_COMMITTER_NAME=bench", "GIT_COMMITTER_EMAIL=bench@example.invalid")
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("git %s: %w: %s", args[0], err, out)
		}
	}
	return dir, nil
}

// waitFor polls cond every 20 ms until it holds, the node stops, or ctx ends.
func waitFor(ctx context.Context, nodeDone <-chan error, cond func() (bool, error)) error {
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-nodeDone:
			return errors.Join(errors.New("node stopped"), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
