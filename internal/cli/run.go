package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/eval"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/gitrepo"
	"github.com/harmonia-ci/harmonia-ci/internal/node"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// runBranch is the branch of the snapshot repository `run` evaluates.
const runBranch = "run"

func newRun(g *globalFlags) *cobra.Command {
	var attrs []string
	var jobs int
	var branch string
	cmd := &cobra.Command{
		Use:   "run PATH_OR_GIT_URL [--attr A]... [--jobs N]",
		Short: "Evaluate a Nix project and build all of it, here and now",
		Long: `run evaluates a project (a directory, committed or not, or a git URL) and builds every
derivation it needs on a single-node cluster in this process: the embedded PostgreSQL and the
local binary cache in the state directory, every role on one node. If a cluster already runs on
this state directory (harmonia-ci up), run hands the work to it instead.

The project is ci.nix, default.nix or flake.nix at its root, as for any project; --attr limits it
to the given attributes (the .harmonia-ci.toml attrs setting). run shows progress while it
works, ends with a table of attributes, the cache to substitute from and its public key, and
exits non-zero when anything failed.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := g.load(cmd)
			if err != nil {
				return err
			}
			cfg.Node.Roles = config.AllRoles()
			if jobs > 0 {
				cfg.Node.MaxJobs = jobs
			}
			if err := prepareSingleNode(cfg); err != nil {
				return err
			}
			ctx, force, stop := signalContext()
			defer stop()
			r := &runner{cfg: cfg, out: cmd.OutOrStdout(), errOut: cmd.ErrOrStderr(), listenSet: cmd.Flags().Changed("listen")}
			return r.run(ctx, force, args[0], branch, attrs)
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&attrs, "attr", nil, "attribute to build (repeatable; default: the project's attrs)")
	f.IntVar(&jobs, "jobs", 0, "builds at once (default: node.max_jobs)")
	f.StringVar(&branch, "branch", "", "branch of a git URL (default: its HEAD)")
	return cmd
}

// prepareSingleNode creates what a single-node cluster needs and the configuration does not name:
// the state directory, the admin token, the cluster secret, and the signing key.
func prepareSingleNode(cfg *config.Config) error {
	var err error
	if err := os.MkdirAll(cfg.StateDir, 0o755); err != nil {
		return fmt.Errorf("create state directory: %w", err)
	}
	if cfg.Auth.AdminToken == "" {
		if cfg.Auth.AdminToken, err = ensureToken(filepath.Join(cfg.StateDir, "admin-token")); err != nil {
			return err
		}
	}
	// The single node is its own signer: it holds the cluster secret and derives its node token.
	if cfg.Auth.ClusterSecret == "" && cfg.Auth.NodeToken == "" {
		if cfg.Auth.ClusterSecret, err = ensureToken(filepath.Join(cfg.StateDir, "cluster-secret")); err != nil {
			return err
		}
	}
	if cfg.Signer.SigningKeyFile == "" && cfg.HasRole(config.RoleSigner) {
		if cfg.Signer.SigningKeyFile, err = ensureSigningKey(cfg.StateDir, cfg.Node.ID); err != nil {
			return err
		}
	}
	return nil
}

// runner is one `harmonia-ci run`.
type runner struct {
	cfg         *config.Config
	out, errOut io.Writer
	listenSet   bool
}

func (r *runner) run(ctx context.Context, force <-chan struct{}, source, branch string, attrs []string) error {
	cfg := r.cfg
	work, cleanup, err := sourceDir(ctx, source, branch)
	if err != nil {
		return err
	}
	defer cleanup()
	extra, err := attrsSetting(work, attrs)
	if err != nil {
		return err
	}

	logger := newLoggerAt(cfg, r.errOut, slog.LevelWarn)
	pool, closeDB, err := node.OpenDatabase(ctx, cfg, logger, true)
	if err != nil {
		return err
	}
	defer closeDB()
	if _, err := db.Migrate(ctx, pool, cfg.Node.ID); err != nil {
		return err
	}

	endpoint, err := liveBuilder(ctx, pool, cfg.Cluster.Heartbeat.DeadThreshold.Duration)
	if err != nil {
		return err
	}
	if endpoint != "" {
		fmt.Fprintf(r.errOut, "using the cluster running on this state directory (%s)\n", endpoint)
	} else {
		stopNode, err := r.startNode(ctx, pool, logger, force)
		if err != nil {
			return err
		}
		defer stopNode()
	}

	name := projectName(work, source)
	snapshot := filepath.Join(cfg.StateDir, "run", name+".git")
	commit, err := gitrepo.Snapshot(ctx, snapshot, work, runBranch, extra)
	if err != nil {
		return err
	}
	if err := ensureProject(ctx, pool, name, snapshot); err != nil {
		return err
	}
	e, err := r.trigger(ctx, pool, name, commit)
	if err != nil {
		return err
	}
	fmt.Fprintf(r.errOut, "evaluating %s (evaluation %d, snapshot %s)\n", source, e.ID, short(commit))
	start := time.Now()
	if e, err = r.follow(ctx, pool, e.ID, start); err != nil {
		return err
	}
	return r.summary(ctx, pool, e, time.Since(start))
}

// trigger requests the evaluation of the snapshot commit. The evaluation of a snapshot seen
// before is reused when it succeeded or was skipped (unchanged files are a no-op), and run
// again when it failed or was cancelled: a user who runs again expects another try, after a
// failure outside the project (Nix missing, a crash, a timeout) as after one inside it.
func (r *runner) trigger(ctx context.Context, pool *pgxpool.Pool, name, commit string) (evaluation.Evaluation, error) {
	e, created, err := eval.Trigger(ctx, pool, eval.TriggerParams{Project: name, Commit: commit, Branch: runBranch, StateDir: r.cfg.StateDir})
	if err != nil || created || (e.Status != status.EvalFailed && e.Status != status.EvalCancelled) {
		return e, err
	}
	again, err := evaluation.Reevaluate(ctx, pool, e.ID)
	if errors.Is(err, evaluation.ErrNotFinished) {
		return evaluation.Get(ctx, pool, e.ID) // another run re-queued it meanwhile: follow that one
	}
	if err != nil {
		return e, err
	}
	fmt.Fprintf(r.errOut, "re-evaluating evaluation %d%s\n", e.ID, wasNote(e))
	return again, nil
}

// startNode runs this process's node with every role and waits until it is active.
func (r *runner) startNode(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger, force <-chan struct{}) (stop func(), err error) {
	cfg := r.cfg
	if !r.listenSet {
		// The usual port may be taken (another harmonia-ci on another state directory): any will do.
		if ln, err := net.Listen("tcp", cfg.Listen); err == nil {
			ln.Close()
		} else {
			cfg.Listen = "127.0.0.1:0"
		}
	}
	nodeCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- node.Run(nodeCtx, cfg, logger, node.Options{Version: version(), Force: force}) }()
	stop = func() {
		cancel()
		<-done
	}
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	for {
		if nodes, err := cluster.ListNodes(ctx, pool); err == nil {
			for _, n := range nodes {
				if n.ID == cfg.Node.ID && n.Status == status.NodeActive {
					return stop, nil
				}
			}
		}
		select {
		case err := <-done:
			cancel()
			if err == nil {
				err = errors.New("the node stopped before it was ready")
			}
			return nil, err
		case <-ctx.Done():
			stop()
			return nil, ctx.Err()
		case <-deadline.C:
			stop()
			return nil, errors.New("the node did not become ready within 2 minutes")
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// liveBuilder returns the endpoint of a builder node that answers its health check, "" if none:
// `harmonia-ci up` on this state directory, whose work run then only watches. A node silent for
// deadThreshold (cluster.heartbeat.dead_threshold) is not live, whatever its row still says.
func liveBuilder(ctx context.Context, pool *pgxpool.Pool, deadThreshold time.Duration) (string, error) {
	nodes, err := cluster.ListNodes(ctx, pool)
	if err != nil {
		return "", fmt.Errorf("look for a running cluster: %w", err)
	}
	var endpoints []string
	for _, n := range nodes {
		if slices.Contains(n.Roles, config.RoleBuilder) && n.Status == status.NodeActive && n.LastSeenSecondsAgo < deadThreshold.Seconds() {
			endpoints = append(endpoints, n.Endpoint)
		}
	}
	client := &http.Client{Timeout: 2 * time.Second}
	for _, e := range endpoints {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(e, "/")+"/healthz", nil)
		if err != nil {
			continue
		}
		resp, err := client.Do(req)
		if err != nil {
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return e, nil
		}
	}
	return "", nil
}

// sourceDir is the directory to snapshot: source itself, or a shallow clone of a git URL.
func sourceDir(ctx context.Context, source, branch string) (dir string, cleanup func(), err error) {
	if fi, err := os.Stat(source); err == nil {
		if !fi.IsDir() {
			return "", nil, fmt.Errorf("%s is not a directory", source)
		}
		if branch != "" {
			return "", nil, errors.New("--branch applies to git URLs only; a directory is built as it is on disk")
		}
		abs, err := filepath.Abs(source)
		return abs, func() {}, err
	}
	if !strings.Contains(source, "://") && !strings.Contains(source, "@") {
		return "", nil, fmt.Errorf("%s: no such directory, and not a git URL", source)
	}
	tmp, err := os.MkdirTemp("", "harmonia-run-")
	if err != nil {
		return "", nil, err
	}
	cleanup = func() { os.RemoveAll(tmp) }
	if err := gitrepo.ShallowClone(ctx, source, branch, filepath.Join(tmp, "src")); err != nil {
		cleanup()
		return "", nil, err
	}
	return filepath.Join(tmp, "src"), cleanup, nil
}

// attrsSetting returns the snapshot's .harmonia-ci.toml with attrs set to attrs (the project's
// other settings kept), or nil when attrs is empty.
func attrsSetting(work string, attrs []string) (map[string][]byte, error) {
	if len(attrs) == 0 {
		return nil, nil
	}
	settings := map[string]any{}
	data, err := os.ReadFile(filepath.Join(work, eval.SettingsFile))
	if err == nil {
		if err := toml.Unmarshal(data, &settings); err != nil {
			return nil, fmt.Errorf("%s: %w", eval.SettingsFile, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	settings["attrs"] = attrs
	var b strings.Builder
	if err := toml.NewEncoder(&b).Encode(settings); err != nil {
		return nil, err
	}
	if _, err := eval.ParseSettings([]byte(b.String()), false, time.Hour); err != nil {
		return nil, fmt.Errorf("--attr: %w", err)
	}
	return map[string][]byte{eval.SettingsFile: []byte(b.String())}, nil
}

var nameUnsafe = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// projectName names run's project after the source, with a hash that keeps two sources of the
// same base name apart.
func projectName(work, source string) string {
	base := strings.TrimSuffix(filepath.Base(strings.TrimRight(source, "/")), ".git")
	base = strings.Trim(nameUnsafe.ReplaceAllString(base, "-"), "-._")
	if base == "" {
		base = "project"
	}
	if len(base) > 40 {
		base = base[:40]
	}
	key := source
	if !strings.Contains(source, "://") {
		key = work
	}
	sum := sha256.Sum256([]byte(key))
	return "run-" + base + "-" + hex.EncodeToString(sum[:3])
}

// ensureProject creates run's project on the snapshot repository, or points it there.
func ensureProject(ctx context.Context, pool *pgxpool.Pool, name, repo string) error {
	p, err := project.Get(ctx, pool, name)
	if errors.Is(err, project.ErrNotFound) {
		_, err = project.Add(ctx, pool, project.AddParams{Name: name, RepoURL: repo, Branch: runBranch})
		return err
	}
	if err != nil {
		return err
	}
	if !p.Enabled {
		enabled := true
		_, err = project.Set(ctx, pool, name, project.SetParams{Enabled: &enabled})
	}
	return err
}
