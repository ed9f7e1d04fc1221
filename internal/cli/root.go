// Package cli is harmonia-ci's command line: one cobra command per verb, each a thin layer over
// the packages that do the work.
package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/harmonia-ci/harmonia-ci/internal/config"
)

// Version is set at link time (-ldflags "-X .../internal/cli.Version=v1.2.3"); otherwise it is
// read from the build info.
var Version = ""

func version() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return "dev-" + s.Value[:12]
			}
		}
		if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			return bi.Main.Version
		}
	}
	return "dev"
}

// globalFlags are shared by every command that reads the configuration.
type globalFlags struct {
	configFile                                   string
	databaseURL, nodeID, roles, listen, stateDir string
	nixStore                                     string
	// The remote command line (remote.go): a frontend's URL and a token.
	server, token, tokenFile string
}

// Execute runs the command line and returns the process exit code.
func Execute() int {
	root := newRoot()
	err := root.Execute()
	if err != nil {
		fmt.Fprintln(os.Stderr, "harmonia-ci:", err)
	}
	return exitCode(err)
}

func newRoot() *cobra.Command {
	var g globalFlags
	root := &cobra.Command{
		Use:           "harmonia-ci",
		Short:         "A distributed Nix CI coordinated through PostgreSQL",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version(),
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.configFile, "config", "", "configuration file (default: "+config.DefaultFile+" if present)")
	pf.StringVar(&g.databaseURL, "database-url", "", "PostgreSQL URL (env HARMONIA_DATABASE_URL; empty: embedded server in the state directory)")
	pf.StringVar(&g.nodeID, "node-id", "", "node id (default: hostname)")
	pf.StringVar(&g.roles, "roles", "", "comma-separated roles: frontend,evaluator,signer,cache,builder (default: all)")
	pf.StringVar(&g.listen, "listen", "", "HTTP listen address (default 127.0.0.1:7777)")
	pf.StringVar(&g.stateDir, "state-dir", "", "state directory (embedded database, generated tokens)")
	pf.StringVar(&g.nixStore, "nix-store", "", "chroot Nix store directory builds run in (env HARMONIA_NIX_STORE; default: the system store)")
	pf.StringVar(&g.server, "server", "", "a frontend's URL: commands go over its HTTP API instead of the database (env "+envServer+")")
	pf.StringVar(&g.token, "token", "", "the API token for --server (env "+envToken+"; default: the one harmonia-ci login stored)")
	pf.StringVar(&g.tokenFile, "token-file", "", "a file holding the API token for --server")

	root.AddCommand(newRun(&g), newServe(&g), newUp(&g), newProjectCmd(&g), newEvalCmd(&g), newJobCmd(&g), newNodes(&g), newClusterCmd(&g), newDrain(&g),
		newMigrate(&g), newBench(&g), newKeygen(), newNodeToken(&g), newGC(&g))
	root.AddCommand(newStatus(&g))
	root.AddCommand(newDBCmd(&g))
	root.AddCommand(newCacheToken(&g))
	root.AddCommand(newAPIToken(&g))
	root.AddCommand(newLogin(&g), newLog(&g), newWatch(&g), newFailures(&g))
	markUsageErrors(root)
	return root
}

// load reads the configuration, applying only the flags the user actually gave.
func (g *globalFlags) load(cmd *cobra.Command) (*config.Config, error) {
	o := config.Overrides{ConfigFile: g.configFile}
	set := func(name string, v *string) *string {
		if cmd.Flags().Changed(name) {
			return v
		}
		return nil
	}
	o.DatabaseURL = set("database-url", &g.databaseURL)
	o.NodeID = set("node-id", &g.nodeID)
	o.Roles = set("roles", &g.roles)
	o.Listen = set("listen", &g.listen)
	o.StateDir = set("state-dir", &g.stateDir)
	if cmd.Flags().Changed("nix-store") && g.nixStore != "" {
		abs, err := filepath.Abs(g.nixStore)
		if err != nil {
			return nil, fmt.Errorf("--nix-store: %w", err)
		}
		o.NixStore = &abs
	}
	return config.Load(o, os.Getenv)
}

func newLogger(cfg *config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	return newLoggerAt(cfg, w, level)
}

// newLoggerAt logs at level or above; one-shot commands pass warn so their output stays clean.
func newLoggerAt(cfg *config.Config, w io.Writer, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// benchLogger reports a benchmark's progress on w.
func benchLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// signalContext ends its context at the first SIGINT/SIGTERM and closes force at the second.
func signalContext() (ctx context.Context, force <-chan struct{}, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	f := make(chan struct{})
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case <-ch:
			cancel()
		case <-done:
			return
		}
		// The same signal often arrives twice at once (a terminal's process group, or make
		// forwarding it); only a deliberate second one, later, forces.
		first := time.Now()
		for {
			select {
			case <-ch:
				if time.Since(first) < time.Second {
					continue
				}
				close(f)
			case <-done:
			}
			return
		}
	}()
	return ctx, f, func() {
		signal.Stop(ch)
		close(done)
		cancel()
	}
}
