package eval

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/harmonia-ci/harmonia-ci/internal/gitrepo"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixdaemon"
)

// Confinement configures how the evaluator confines the Nix that runs a project's code.
type Confinement struct {
	// User is the unprivileged user a root node evaluates as ([eval] user). Ignored when the node
	// does not run as root: it cannot switch users, and evaluates as itself.
	User string
	// MaxMemory is the resident memory one evaluation's Nix processes may use together, its
	// workers and its imports from derivation ([eval] max_memory); past it the evaluation
	// fails. 0 is unlimited.
	MaxMemory int64
	// MaxMemoryPerWorker is the resident memory of one walker process ([eval]
	// max_memory_per_worker); past it the walker is restarted (NixRunner.MaxMemoryPerWorker).
	// 0 is unlimited.
	MaxMemoryPerWorker int64
	// The sandbox of the builds Nix runs for imports from derivation, as for any build
	// ([build] sandbox, build_users_group, extra_sandbox_paths).
	Unsandboxed     bool
	BuildUsersGroup string
	SandboxPaths    []string
}

// confinement is the evaluation user and the private nix-daemons it reaches the store through.
type confinement struct {
	user     *Credential // nil: the child runs as this process's user
	daemon   nixdaemon.Config
	logger   *slog.Logger
	stateDir string
}

// Directories under the state directory. The evaluation user may traverse the state directory
// (0711) and read what it evaluates, nothing else: git mirrors (which may carry credentials in
// their configuration) stay root's.
const (
	mirrorsDir = "git"        // the repositories' mirrors, root's only
	runDir     = "run"        // harmonia-ci run's snapshots of the user's directories, root's only
	sourcesDir = "eval"       // per project: a credential-free copy of the mirror, readable
	homesDir   = "eval-home"  // per project: the evaluation user's HOME (Nix's fetcher cache)
	daemonsDir = "nix-daemon" // per evaluation: the socket of its nix-daemon
)

func newConfinement(c Confinement, stateDir string, logger *slog.Logger) (*confinement, error) {
	cf := &confinement{stateDir: stateDir, logger: logger}
	if os.Geteuid() != 0 {
		logger.Warn("the evaluator does not run as root: projects are evaluated as this node's own user, confined by Nix's restricted mode and a filesystem view of their own")
		return cf, nil
	}
	if c.User == "" {
		return nil, errors.New("evaluator: eval.user is required when the node runs as root")
	}
	u, err := user.Lookup(c.User)
	if err != nil {
		return nil, fmt.Errorf("evaluator: projects are evaluated as the unprivileged user %q (eval.user), which does not exist: run scripts/deps.sh or create it (useradd --system --no-create-home %s): %w", c.User, c.User, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil || uid == 0 {
		return nil, fmt.Errorf("evaluator: eval.user %q must be an unprivileged user (uid %s)", c.User, u.Uid)
	}
	cf.user = &Credential{Name: c.User, UID: uint32(uid), GID: uint32(gid)}
	opts := [][2]string{{"substituters", ""}, {"sandbox", strconv.FormatBool(!c.Unsandboxed)}, {"sandbox-paths", strings.Join(nix.SandboxPaths(c.SandboxPaths), " ")}}
	if c.BuildUsersGroup != "" {
		opts = append(opts, [2]string{"build-users-group", c.BuildUsersGroup})
	}
	cf.daemon = nixdaemon.Config{Options: opts}
	return cf, nil
}

// prepare makes the state directory's layout and checks the evaluation user can reach it.
func (cf *confinement) prepare() error {
	for _, d := range []struct {
		name string
		mode os.FileMode
	}{{"", 0o711}, {mirrorsDir, 0o700}, {runDir, 0o700}, {sourcesDir, 0o711}, {homesDir, 0o711}, {daemonsDir, 0o711}} {
		p := filepath.Join(cf.stateDir, d.name)
		if err := os.MkdirAll(p, d.mode); err != nil {
			return fmt.Errorf("evaluator: %w", err)
		}
		if cf.user != nil {
			if err := os.Chmod(p, d.mode); err != nil {
				return fmt.Errorf("evaluator: %w", err)
			}
		}
	}
	if cf.user == nil {
		return nil
	}
	for p := filepath.Dir(cf.stateDir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("evaluator: %w", err)
		}
		if !searchable(fi, cf.user) {
			return fmt.Errorf("evaluator: the evaluation user %s cannot reach the state directory %s (%s is not searchable by others); choose one outside a private directory, e.g. /var/lib/harmonia-ci", cf.user.Name, cf.stateDir, p)
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

func searchable(fi os.FileInfo, u *Credential) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	switch perm := fi.Mode().Perm(); {
	case st.Uid == u.UID:
		return perm&0o100 != 0
	case st.Gid == u.GID:
		return perm&0o010 != 0
	default:
		return perm&0o001 != 0
	}
}

// workspace is where one evaluation of a project runs: the source the project's code may read
// (a credential-free copy of the mirror), the evaluation user's HOME, and a directory for the
// walker and the exported trees.
type workspace struct {
	source, home, work string
	copy               *gitrepo.Mirror // the copy at source
}

// tree exports commit from the source copy into a new directory named "source" under the
// workspace, readable by the evaluation user; remove deletes it.
func (ws workspace) tree(ctx context.Context, commit string) (dir string, remove func(), err error) {
	parent, err := os.MkdirTemp(ws.work, "tree-")
	if err != nil {
		return "", nil, fmt.Errorf("export the source for evaluation: %w", err)
	}
	remove = func() { _ = os.RemoveAll(parent) }
	if err := os.Chmod(parent, 0o755); err != nil {
		remove()
		return "", nil, fmt.Errorf("export the source for evaluation: %w", err)
	}
	dir = filepath.Join(parent, "source")
	if err := ws.copy.Export(ctx, commit, dir); err != nil {
		remove()
		return "", nil, fmt.Errorf("export the source for evaluation: %w", err)
	}
	return dir, remove, nil
}

// workspace brings the project's source copy up to date from its mirror (as this process: the
// evaluation user never writes where this process runs git) and makes the user's HOME.
func (cf *confinement) workspace(ctx context.Context, projectID int64, mirror *gitrepo.Mirror) (workspace, error) {
	id := strconv.FormatInt(projectID, 10)
	dir := filepath.Join(cf.stateDir, sourcesDir, id)
	ws := workspace{source: filepath.Join(dir, "source.git"), home: filepath.Join(cf.stateDir, homesDir, id), work: dir}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return ws, fmt.Errorf("evaluation workspace: %w", err)
	}
	// Fetched from the mirror's path, so the copy's configuration names no credentials.
	src, err := gitrepo.New(ws.source, mirror.Dir)
	if err != nil {
		return ws, err
	}
	ws.copy = src
	if err := src.Fetch(ctx); err != nil {
		return ws, fmt.Errorf("copy the source for evaluation: %w", err)
	}
	if err := os.MkdirAll(ws.home, 0o700); err != nil {
		return ws, fmt.Errorf("evaluation workspace: %w", err)
	}
	if cf.user != nil {
		if err := os.Chown(ws.home, int(cf.user.UID), int(cf.user.GID)); err != nil {
			return ws, fmt.Errorf("evaluation workspace: %w", err)
		}
	}
	return ws, nil
}

// newDaemon returns the nix-daemon of one evaluation, not started yet; close stops it and
// removes its socket. Each evaluation has its own, so that the builds of its imports from
// derivation are its daemon's descendants, counted in its memory.
func (cf *confinement) newDaemon() (d *nixdaemon.Daemon, closeFn func(), err error) {
	dir, err := os.MkdirTemp(filepath.Join(cf.stateDir, daemonsDir), "")
	if err != nil {
		return nil, nil, fmt.Errorf("evaluation daemon: %w", err)
	}
	c := cf.daemon
	c.Dir = dir
	d = nixdaemon.New(c, cf.logger)
	return d, func() {
		d.Close()
		_ = os.RemoveAll(dir)
	}, nil
}
