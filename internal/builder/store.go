package builder

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// Store is the builder's Nix store: the system store ("" root) or a chroot store directory, so
// several builders can share a machine; reached through nix-daemon children the builder starts,
// or through an existing daemon's socket.
type Store struct {
	Root string // "" = system store, else the chroot store directory (passed as --store)
	// Daemon is the socket of an existing nix-daemon to build through ([build] daemon), e.g. a
	// NixOS host's /nix/var/nix/daemon-socket/socket; "" starts `nix-daemon --stdio` children.
	// The daemon's own settings then hold (sandbox, build users, sandbox paths), and what the
	// builder may do depends on whether it trusts the builder (see Session).
	Daemon       string
	Substituters []string // binary cache URLs to fetch from (the cluster's cache nodes, then upstream)
	TrustedKeys  []string // "name:base64" public keys
	SandboxPaths []string // sandboxed builds see these besides those of /bin/sh /lib /lib64 /usr/lib that exist
	Env          []string // the Nix children's environment; nil = PATH, TMPDIR, NIX_REMOTE, NIX_CONF_DIR of this process; HOME is added unless set
	// Unsandboxed turns Nix's sandbox off ([build] sandbox = false): builds then see the whole
	// machine. Only for operators who trust every project.
	Unsandboxed bool
	// BuildUsersGroup is the group of Nix's build users, which builds in the system store run as
	// ([build] build_users_group). A chroot store's builds run in its sandbox without them.
	BuildUsersGroup string
	// Nice is the nice value of the store's daemons, which their builds inherit ([build] nice):
	// the node's own work comes first on a busy machine. 0 leaves this process's.
	Nice int
	// Cgroup is the cgroup directory the store's daemons, and so their builds, run in
	// ([build] cgroup; see PrepareCgroup). "" leaves them in the node's.
	Cgroup string

	// HTTP fetches from the substituters; nil: substitute's default client.
	HTTP *http.Client

	onStart   func(pid int) // tests: called with the pid of each session's daemon
	killGrace time.Duration // tests: hang-up to SIGTERM to SIGKILL of a stopped build's daemon; 0 = 5s
}

// ErrInputUnavailable means no substituter had a path a build needs.
var ErrInputUnavailable = errors.New("input not available from any substituter")

// Canonical gives the canonical NAR hash ("sha256:<nix32>") of store paths that have one; the
// builder answers from derivation_outputs.nar_hash, read with the job's inputs.
type Canonical func(ctx context.Context, paths []string) (map[string]string, error)

// BuildLimits bound one build; zero means no limit.
type BuildLimits struct {
	Timeout, MaxSilent time.Duration
	MaxOutputSize      int64
}

// BuildError is why a build did not succeed.
type BuildError struct {
	Kind     string // "failed" (Nix reported the build failed), "timeout", "silent", "output-size", "nix" (Nix itself failed: treat as transient)
	Message  string // "build timed out after 4h0m0s", "no output for 30m0s", "outputs are 5.2 GB, over max_output_size 4 GB", or Nix's error
	ExitCode int    // Nix's exit status when it exited on its own (Nix 2.8: 100 = build failure), else -1
}

func (e *BuildError) Error() string { return e.Message + " (" + e.Kind + ")" }

// Timeout reports whether the build went over its time or silence limit (the queue's failure
// metrics count these apart).
func (e *BuildError) Timeout() bool { return e.Kind == "timeout" || e.Kind == "silent" }

// deleteDead deletes paths unless something keeps them (a root, a referrer), as nix-store
// --delete does.
func (s *Store) deleteDead(ctx context.Context, paths []string) error {
	args := append([]string{"--delete"}, s.options(nil)...)
	if _, err := s.run(ctx, "nix-store", append(args, paths...)...); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	return nil
}

// deleteWithReferrers deletes paths and every local path referring to them, even if rooted:
// anything built against a Frankenbuild is suspect too.
func (s *Store) deleteWithReferrers(ctx context.Context, paths []string) error {
	args := append([]string{"--query", "--referrers-closure"}, s.options(nil)...)
	out, err := s.run(ctx, "nix-store", append(args, paths...)...)
	if err != nil {
		return fmt.Errorf("query referrers: %w", err)
	}
	args = append([]string{"--delete", "--ignore-liveness"}, s.options(nil)...)
	if _, err := s.run(ctx, "nix-store", append(args, strings.Fields(out)...)...); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	return nil
}

// AddRoots creates GC roots for paths under <root>/nix/var/nix/gcroots/harmonia-ci/<name>-<i>
// (name is per job) and returns a func removing them. Stale roots of a crashed builder only keep
// some paths alive a while longer.
func (s *Store) AddRoots(name string, paths []string) (remove func(), err error) {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return nil, fmt.Errorf("add gc roots: invalid name %q", name)
	}
	dir := filepath.Join(s.rootDir(), "nix/var/nix/gcroots/harmonia-ci")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("add gc roots: %w", err)
	}
	var made []string
	var once sync.Once
	// Once: a late second call must not remove the roots of a new job that reused the name.
	remove = func() {
		once.Do(func() {
			for _, l := range made {
				_ = os.Remove(l)
			}
		})
	}
	for i, p := range paths {
		if _, err := nix.ParseStorePath(p); err != nil {
			remove()
			return nil, fmt.Errorf("add gc roots: %w", err)
		}
		link := filepath.Join(dir, name+"-"+strconv.Itoa(i))
		// A leftover of a crashed run with the same name is replaced.
		if err := os.Remove(link); err != nil && !errors.Is(err, fs.ErrNotExist) {
			remove()
			return nil, fmt.Errorf("add gc roots: %w", err)
		}
		if err := os.Symlink(p, link); err != nil {
			remove()
			return nil, fmt.Errorf("add gc roots: %w", err)
		}
		made = append(made, link)
	}
	return remove, nil
}

// DaemonInfo is what a store's Nix daemon says of itself.
type DaemonInfo struct {
	Version  string // its Nix version, "2.26.3"
	Protocol string // the worker protocol both speak, "1.38"
	Trusted  bool   // it builds derivations the builder sends (see Session)
}

// Init creates the store's directories and database if they do not exist yet, so the builder's
// concurrent sessions never race to create them (Nix 2.8 fails when two first opens do),
// checks that sandboxed builds in the system store have their build users, and returns what
// the daemon says of itself; a daemon older than MinNixVersion is an error (ErrNixTooOld).
func (s *Store) Init(ctx context.Context) (DaemonInfo, error) {
	if s.Root == "" && s.Daemon == "" && !s.Unsandboxed {
		if err := checkBuildUsers(s.BuildUsersGroup); err != nil {
			return DaemonInfo{}, err
		}
	}
	ss, err := s.Open(ctx)
	if err != nil {
		return DaemonInfo{}, fmt.Errorf("initialise store %s: %w", s.where(), err)
	}
	defer ss.Close()
	v, minor, trusted := ss.Daemon()
	return DaemonInfo{Version: v, Protocol: "1." + strconv.FormatUint(minor, 10), Trusted: trusted}, nil
}

// checkBuildUsers fails unless group exists with at least one member: Nix runs sandboxed builds
// in the system store as its members, and without them it would refuse every build.
func checkBuildUsers(group string) error {
	g, err := user.LookupGroup(group)
	if err != nil {
		return fmt.Errorf("sandboxed builds in the system store run as Nix's build users, but the group %q does not exist: run scripts/deps.sh (or create it and its users as Nix's installer does), or set build.build_users_group: %w", group, err)
	}
	data, err := os.ReadFile("/etc/group")
	if err != nil {
		return nil // members are not listed here (NSS); Nix will say if there are none
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		f := strings.Split(line, ":")
		if len(f) == 4 && f[2] == g.Gid && strings.TrimSpace(f[3]) != "" {
			return nil
		}
	}
	return fmt.Errorf("the build users group %q has no members: run scripts/deps.sh (it creates %s1…)", group, group)
}

// ClearRoots removes the GC roots AddRoots made under names starting with prefix: a builder
// calls it at start, when no job of its own runs, to drop what a crashed predecessor left.
func (s *Store) ClearRoots(prefix string) error {
	dir := filepath.Join(s.rootDir(), "nix/var/nix/gcroots/harmonia-ci")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("clear gc roots: %w", err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("clear gc roots: %w", err)
		}
	}
	return nil
}

// nixErrorMessage extracts Nix's error message from its output: from the last "error: " line on.
func nixErrorMessage(output string, code int) string {
	output = strings.TrimSpace(output)
	i := strings.LastIndex(output, "\nerror: ")
	switch {
	case i >= 0:
		output = output[i+len("\nerror: "):]
	case strings.HasPrefix(output, "error: "):
		output = output[len("error: "):]
	}
	if output == "" {
		return fmt.Sprintf("nix exited with code %d", code)
	}
	return output
}

// approxSize formats n in decimal units with one decimal at most: "5.2 GB", "4 GB", "512 B".
func approxSize(n int64) string {
	units := []string{"B", "KB", "MB", "GB", "TB", "PB", "EB"}
	f, i := float64(n), 0
	for f >= 1000 && i < len(units)-1 {
		f /= 1000
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%d B", n)
	}
	return strings.TrimSuffix(strconv.FormatFloat(f, 'f', 1, 64), ".0") + " " + units[i]
}

// options are the settings of every Nix call: never the default cache.nixos.org, which is out
// of reach, always signed paths, and no negative narinfo caching, since a path missing a moment
// ago may just have been uploaded.
func (s *Store) options(substituters []string) []string {
	var args []string
	switch {
	case s.Daemon != "":
		args = append(args, "--store", "unix://"+s.Daemon)
	case s.Root != "":
		args = append(args, "--store", s.Root)
	}
	return append(args,
		"--option", "substituters", strings.Join(substituters, " "),
		"--option", "trusted-public-keys", strings.Join(s.TrustedKeys, " "),
		"--option", "require-sigs", "true",
		"--option", "narinfo-cache-negative-ttl", "0",
		// Nothing but a build needs build users; Build sets them (sandboxOptions).
		"--option", "build-users-group", "",
	)
}

// run runs a short Nix command (not a build) and returns its standard output.
func (s *Store) run(ctx context.Context, name string, args ...string) (string, error) {
	// A fresh HOME per call: no stale narinfo disk cache, no user configuration.
	home, err := os.MkdirTemp("", "harmonia-build-home-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(home)
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = s.childEnv(home)
	cmd.Dir = home
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("%s: %w", name, context.Cause(ctx))
		}
		code := -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		return "", fmt.Errorf("%s: %s", name, nixErrorMessage(stderr.String(), code))
	}
	return stdout.String(), nil
}

// childEnv is the Nix children's environment: the configured one or a small allow list, so
// that nothing secret of the builder (database URLs, tokens) reaches Nix.
func (s *Store) childEnv(home string) []string {
	env := slices.Clone(s.Env)
	if s.Env == nil {
		for _, k := range []string{"PATH", "TMPDIR", "NIX_REMOTE", "NIX_CONF_DIR"} {
			if v, ok := os.LookupEnv(k); ok {
				env = append(env, k+"="+v)
			}
		}
	}
	if !slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, "HOME=") }) {
		env = append(env, "HOME="+home)
	}
	return env
}

// where names the store in messages: the daemon's socket, or the store's directory.
func (s *Store) where() string {
	if s.Daemon != "" {
		return "through the nix-daemon at " + s.Daemon
	}
	return s.rootDir()
}

func (s *Store) rootDir() string {
	if s.Root == "" {
		return "/"
	}
	return s.Root
}
