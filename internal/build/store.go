package build

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// Store is the builder's Nix store: the system store ("" root) or a chroot store directory, so
// several builders can share a machine.
type Store struct {
	Root         string   // "" = system store, else the chroot store directory (passed as --store)
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

	onStart   func(pid int) // tests: called with the pid of each build's Nix
	killGrace time.Duration // tests: SIGTERM to SIGKILL of a stopped build; 0 = nixKillGrace
}

// ErrInputUnavailable means no substituter had a path a build needs.
var ErrInputUnavailable = errors.New("input not available from any substituter")

// Canonical gives the canonical NAR hash ("sha256:<nix32>") of store paths that have one; the
// builder passes a function reading derivation_outputs.nar_hash by output_path from PostgreSQL.
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

const (
	// nixKillGrace is how long Nix gets to stop its builder after SIGTERM: Nix starts the
	// builder in a session of its own, so only Nix (or the fallback below) can kill it.
	nixKillGrace = 10 * time.Second
	// substituteBatch bounds the paths of one nix-store command line.
	substituteBatch = 1000
	// nixTailBytes of Nix's output are kept for its error message.
	nixTailBytes = 8 << 10
)

// FetchDerivation makes drvPath and its .drv closure valid in the store, copying them from the
// first substituter that has them. A valid drvPath costs nothing: Nix keeps closures valid.
func (s *Store) FetchDerivation(ctx context.Context, drvPath string) error {
	if _, err := nix.ParseStorePath(drvPath); err != nil || !strings.HasSuffix(drvPath, ".drv") {
		return fmt.Errorf("fetch derivation: %q is not a .drv store path", drvPath)
	}
	valid, err := s.pathInfos(ctx, []string{drvPath})
	if err != nil {
		return fmt.Errorf("fetch derivation %s: %w", drvPath, err)
	}
	if _, ok := valid[drvPath]; ok {
		return nil
	}
	failures := []string{"no substituters"}
	if len(s.Substituters) > 0 {
		failures = nil
	}
	for _, sub := range s.Substituters {
		args := append([]string{"--extra-experimental-features", "nix-command", "copy", "--derivation", "--from", sub},
			s.options(s.Substituters)...)
		_, err := s.run(ctx, "nix", append(args, drvPath)...)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("fetch derivation %s: %w", drvPath, err)
		}
		failures = append(failures, sub+": "+err.Error())
	}
	return fmt.Errorf("fetch derivation %s: %w: %s", drvPath, ErrInputUnavailable, strings.Join(failures, "; "))
}

// InputPaths returns the store paths a build of drvPath needs, sorted: the selected outputs of
// its input derivations and its input sources. Their closures come with substitution.
func (s *Store) InputPaths(drvPath string) ([]string, error) {
	drv, err := nix.ReadDerivation(s.Root, drvPath)
	if err != nil {
		return nil, fmt.Errorf("input paths: %w", err)
	}
	paths := slices.Clone(drv.InputSrcs)
	for inDrv, names := range drv.InputDrvs {
		in, err := nix.ReadDerivation(s.Root, inDrv)
		if err != nil {
			return nil, fmt.Errorf("input paths of %s: %w", drvPath, err)
		}
		for _, name := range names {
			o, ok := in.Outputs[name]
			if !ok {
				return nil, fmt.Errorf("input paths of %s: %s has no output %q", drvPath, inDrv, name)
			}
			if o.Path == "" {
				return nil, fmt.Errorf("input paths of %s: output %q of %s is content-addressed, which is not supported", drvPath, name, inDrv)
			}
			paths = append(paths, o.Path)
		}
	}
	slices.Sort(paths)
	return slices.Compact(paths), nil
}

// OutputPaths returns the output paths drvPath names, sorted; content-addressed outputs, which
// Build refuses, have none.
func (s *Store) OutputPaths(drvPath string) ([]string, error) {
	drv, err := nix.ReadDerivation(s.Root, drvPath)
	if err != nil {
		return nil, fmt.Errorf("output paths: %w", err)
	}
	var paths []string
	for _, o := range drv.Outputs {
		if o.Path != "" {
			paths = append(paths, o.Path)
		}
	}
	slices.Sort(paths)
	return paths, nil
}

// EnsureInputs makes every path valid locally and canonical: a build never uses an input that
// differs from what the cache serves. A present path whose NAR hash in the store's database differs from the canonical
// one is a Frankenbuild: it is logged, deleted with its referrers (Nix deletes nothing still
// referenced) and substituted again. Missing paths are substituted; nothing is ever built, so a
// path no substituter has is an error wrapping ErrInputUnavailable. canonical may be nil.
func (s *Store) EnsureInputs(ctx context.Context, paths []string, canonical Canonical, logger *slog.Logger) (mismatches []string, err error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	paths = slices.Sorted(slices.Values(paths))
	paths = slices.Compact(paths)
	local, err := s.pathInfos(ctx, paths)
	if err != nil {
		return nil, fmt.Errorf("ensure inputs: %w", err)
	}
	want := map[string]string{}
	if canonical != nil && len(paths) > 0 {
		// All paths, not just present ones: substituted paths are checked too.
		if want, err = canonical(ctx, paths); err != nil {
			return nil, fmt.Errorf("ensure inputs: canonical hashes: %w", err)
		}
	}
	for _, p := range paths {
		info, ok := local[p]
		if h := want[p]; ok && h != "" && h != info.NarHash {
			logger.Warn("input differs from the binary cache (non-reproducible build?): deleting and substituting it",
				"path", p, "local_nar_hash", info.NarHash, "canonical_nar_hash", h)
			mismatches = append(mismatches, p)
		}
	}
	if len(mismatches) > 0 {
		if err := s.deleteWithReferrers(ctx, mismatches); err != nil {
			return mismatches, fmt.Errorf("ensure inputs: %w", err)
		}
		if local, err = s.pathInfos(ctx, paths); err != nil {
			return mismatches, fmt.Errorf("ensure inputs: %w", err)
		}
	}

	var missing []string
	for _, p := range paths {
		if _, ok := local[p]; !ok {
			missing = append(missing, p)
		}
	}
	var nixFailure string // for the message naming what is still missing
	for chunk := range slices.Chunk(missing, substituteBatch) {
		// Output paths, not .drv files: nix-store --realise can only substitute them.
		args := append([]string{"--realise"}, s.options(s.Substituters)...)
		if _, err := s.run(ctx, "nix-store", append(args, chunk...)...); err != nil {
			if ctx.Err() != nil {
				return mismatches, fmt.Errorf("ensure inputs: %w", err)
			}
			nixFailure = " (" + err.Error() + ")"
		}
	}

	if local, err = s.pathInfos(ctx, paths); err != nil {
		return mismatches, fmt.Errorf("ensure inputs: %w", err)
	}
	for _, p := range paths {
		info, ok := local[p]
		switch h := want[p]; {
		case !ok:
			return mismatches, fmt.Errorf("ensure inputs: %s: %w%s", p, ErrInputUnavailable, nixFailure)
		case h != "" && h != info.NarHash:
			return mismatches, fmt.Errorf("ensure inputs: %s was substituted with NAR hash %s, not the canonical %s", p, info.NarHash, h)
		}
	}
	return mismatches, nil
}

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

// Init creates the store's directories and database if they do not exist yet, so the builder's
// concurrent jobs never race to create them (Nix 2.8 fails when two first commands do), and
// checks that sandboxed builds in the system store have their build users.
func (s *Store) Init(ctx context.Context) error {
	if s.Root == "" && !s.Unsandboxed {
		if err := checkBuildUsers(s.BuildUsersGroup); err != nil {
			return err
		}
	}
	if _, err := s.run(ctx, "nix-store", append([]string{"--init"}, s.options(nil)...)...); err != nil {
		return fmt.Errorf("initialise store %s: %w", s.rootDir(), err)
	}
	return nil
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

// sandboxOptions are a build's sandbox settings: Nix's sandbox with the sandbox paths, and in
// the system store Nix's build users.
func (s *Store) sandboxOptions() []string {
	args := []string{"--option", "sandbox", strconv.FormatBool(!s.Unsandboxed),
		"--option", "sandbox-paths", strings.Join(nix.SandboxPaths(s.SandboxPaths), " ")}
	if s.Root == "" && s.BuildUsersGroup != "" {
		args = append(args, "--option", "build-users-group", s.BuildUsersGroup)
	}
	return args
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

// Build realises drvPath with nothing substituted and no other derivation built, streaming Nix's
// output (the build log) to log. It enforces limits itself: Nix's own timeouts would end in an
// exit code that does not say which limit was hit. It returns the outputs (name → path), a
// *BuildError, or the context's error when ctx ended first.
func (s *Store) Build(ctx context.Context, drvPath string, limits BuildLimits, log io.Writer) (map[string]string, error) {
	if log == nil {
		log = io.Discard
	}
	outputs, err := s.checkBuildable(ctx, drvPath)
	if err != nil {
		return nil, &BuildError{Kind: "nix", Message: err.Error(), ExitCode: -1}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("build %s: %w", drvPath, context.Cause(ctx))
	}
	home, err := os.MkdirTemp("", "harmonia-build-home-")
	if err != nil {
		return nil, &BuildError{Kind: "nix", Message: err.Error(), ExitCode: -1}
	}
	defer os.RemoveAll(home)

	args := append([]string{"--realise", drvPath}, s.options(nil)...)
	args = append(args, "--option", "keep-going", "false", "--option", "builders", "")
	args = append(args, s.sandboxOptions()...)
	// Not CommandContext: stopping a build is the watchdog's job, which lets Nix kill its builder.
	cmd := exec.Command("nix-store", args...)
	cmd.Env = s.childEnv(home)
	cmd.Dir = home
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out := &nixOutput{w: log, start: time.Now()}
	cmd.Stdout = io.Discard // the output paths, which the .drv already names
	cmd.Stderr = out
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, &BuildError{Kind: "nix", Message: fmt.Sprintf("start nix-store: %v", err), ExitCode: -1}
	}
	pid := cmd.Process.Pid
	if s.onStart != nil {
		s.onStart(pid)
	}
	exited := make(chan struct{})
	stopped := make(chan buildStop, 1)
	go func() { stopped <- s.watchdog(ctx, pid, limits, out, exited) }()
	waitErr := waitExitNoReap(pid)
	close(exited)
	reason := <-stopped
	if waitErr == nil {
		// Nix is an unreaped zombie, so its group id cannot have been reused: this reaches only
		// what Nix left behind in its group.
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	// A limit hit just as Nix succeeded does not undo the build.
	if err := cmd.Wait(); err != nil {
		switch reason {
		case buildCancelled:
			return nil, fmt.Errorf("build %s: %w", drvPath, context.Cause(ctx))
		case buildTimedOut:
			return nil, &BuildError{Kind: "timeout", Message: fmt.Sprintf("build timed out after %s", limits.Timeout), ExitCode: -1}
		case buildSilent:
			return nil, &BuildError{Kind: "silent", Message: fmt.Sprintf("no output for %s", limits.MaxSilent), ExitCode: -1}
		}
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.Exited() {
			kind := "nix"
			if nixBuildFailed(ee.ExitCode()) {
				kind = "failed"
			}
			return nil, &BuildError{Kind: kind, Message: nixErrorMessage(out.tailString(), ee.ExitCode()), ExitCode: ee.ExitCode()}
		}
		return nil, &BuildError{Kind: "nix", Message: fmt.Sprintf("nix-store: %v", err), ExitCode: -1}
	}
	return s.checkOutputs(ctx, outputs, limits.MaxOutputSize)
}

// checkBuildable returns drvPath's outputs after checking that every input is valid: Nix would
// otherwise build missing ones here, unchecked against the binary cache.
func (s *Store) checkBuildable(ctx context.Context, drvPath string) (map[string]string, error) {
	drv, err := nix.ReadDerivation(s.Root, drvPath)
	if err != nil {
		return nil, err
	}
	outputs := map[string]string{}
	for name, o := range drv.Outputs {
		if o.Path == "" {
			return nil, fmt.Errorf("output %q of %s is content-addressed, which is not supported", name, drvPath)
		}
		outputs[name] = o.Path
	}
	inputs, err := s.InputPaths(drvPath)
	if err != nil {
		return nil, err
	}
	valid, err := s.pathInfos(ctx, inputs)
	if err != nil {
		return nil, err
	}
	for _, p := range inputs {
		if _, ok := valid[p]; !ok {
			return nil, fmt.Errorf("input %s of %s is not valid in the store", p, drvPath)
		}
	}
	return outputs, nil
}

// checkOutputs checks a successful build's outputs against maxSize. Oversized outputs are
// deleted at once unless rooted (the builder, which roots a job's outputs, deletes them itself
// then): they must not wait for the store's GC, which runs only when the disk is short.
func (s *Store) checkOutputs(ctx context.Context, outputs map[string]string, maxSize int64) (map[string]string, error) {
	paths := slices.Sorted(maps.Values(outputs))
	infos, err := s.pathInfos(ctx, paths)
	if err != nil {
		return nil, &BuildError{Kind: "nix", Message: err.Error(), ExitCode: -1}
	}
	var total int64
	for _, p := range paths {
		info, ok := infos[p]
		if !ok {
			return nil, &BuildError{Kind: "nix", Message: fmt.Sprintf("output %s is not valid after the build", p), ExitCode: -1}
		}
		total += info.NarSize
	}
	if maxSize > 0 && total > maxSize {
		_ = s.deleteDead(ctx, paths)
		return nil, &BuildError{Kind: "output-size",
			Message: fmt.Sprintf("outputs are %s, over max_output_size %s", approxSize(total), approxSize(maxSize)), ExitCode: -1}
	}
	return outputs, nil
}

// OutputInfos returns the path infos of the outputs (for upload: NarHash, NarSize, References,
// Deriver); every path must be valid.
func (s *Store) OutputInfos(ctx context.Context, paths []string) (map[string]nix.PathInfo, error) {
	infos, err := s.pathInfos(ctx, paths)
	if err != nil {
		return nil, fmt.Errorf("output infos: %w", err)
	}
	for _, p := range paths {
		if _, ok := infos[p]; !ok {
			return nil, fmt.Errorf("output infos: %s is not valid in the store", p)
		}
	}
	return infos, nil
}

type buildStop int

const (
	buildNotStopped buildStop = iota
	buildCancelled
	buildTimedOut
	buildSilent
)

// watchdog stops the build when ctx ends or a limit is hit, and returns why; buildNotStopped when Nix
// exited first.
func (s *Store) watchdog(ctx context.Context, pid int, limits BuildLimits, out *nixOutput, exited <-chan struct{}) buildStop {
	var wall, silent <-chan time.Time
	if limits.Timeout > 0 {
		t := time.NewTimer(limits.Timeout)
		defer t.Stop()
		wall = t.C
	}
	var silentTimer *time.Timer
	if limits.MaxSilent > 0 {
		silentTimer = time.NewTimer(limits.MaxSilent)
		defer silentTimer.Stop()
		silent = silentTimer.C
	}
	var reason buildStop
	for reason == buildNotStopped {
		select {
		case <-exited:
			return buildNotStopped
		case <-ctx.Done():
			reason = buildCancelled
		case <-wall:
			reason = buildTimedOut
		case <-silent:
			// One timer re-armed from the last output, instead of a reset per write.
			if idle := out.idle(); idle < limits.MaxSilent {
				silentTimer.Reset(limits.MaxSilent - idle)
				continue
			}
			reason = buildSilent
		}
	}
	// SIGTERM lets Nix kill its builder, which lives in a session of its own.
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	grace := s.killGrace
	if grace <= 0 {
		grace = nixKillGrace
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-exited:
	case <-t.C:
		// Nix is still there (unreaped at worst), so its children are still its children.
		builders := childProcessGroups(pid)
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		for _, g := range builders {
			_ = syscall.Kill(-g, syscall.SIGKILL)
		}
	}
	return reason
}

// waitExitNoReap blocks until process pid has exited but leaves it unreaped, so its pid and process
// group id stay reserved.
func waitExitNoReap(pid int) error {
	const pPID = 1     // P_PID
	var info [128]byte // siginfo_t
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid), uintptr(unsafe.Pointer(&info[0])),
			syscall.WEXITED|syscall.WNOWAIT, 0, 0)
		switch errno {
		case 0:
			return nil
		case syscall.EINTR:
			continue
		default:
			return errno
		}
	}
}

// childProcessGroups returns the process groups of pid's children that are not pid's own group.
func childProcessGroups(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var groups []int
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// "pid (comm) state ppid pgrp …", and comm may contain anything, even ") ".
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 3 {
			continue
		}
		ppid, err1 := strconv.Atoi(f[1])
		pgrp, err2 := strconv.Atoi(f[2])
		if err1 == nil && err2 == nil && ppid == pid && pgrp != pid && pgrp > 0 {
			groups = append(groups, pgrp)
		}
	}
	return groups
}

// nixOutput passes Nix's output on to the build log, noting when it last wrote and keeping the
// tail for Nix's error message.
type nixOutput struct {
	w     io.Writer
	start time.Time
	last  atomic.Int64 // time of the last output, as nanoseconds since start (monotonic)

	mu   sync.Mutex
	tail []byte
}

func (o *nixOutput) Write(p []byte) (int, error) {
	o.last.Store(int64(time.Since(o.start)))
	// A failing log must not stall Nix on a full pipe, so its errors are dropped.
	_, _ = o.w.Write(p)
	o.mu.Lock()
	o.tail = append(o.tail, p...)
	if len(o.tail) > 2*nixTailBytes {
		o.tail = append(o.tail[:0], o.tail[len(o.tail)-nixTailBytes:]...)
	}
	o.mu.Unlock()
	return len(p), nil
}

func (o *nixOutput) idle() time.Duration {
	return time.Since(o.start) - time.Duration(o.last.Load())
}

func (o *nixOutput) tailString() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return string(o.tail)
}

// nixBuildFailed tells Nix 2.8's "a build failed" exit statuses (0x60 plus flag bits, 0x04 set
// for a failed build) from its other errors (1).
func nixBuildFailed(code int) bool { return code&^0x0f == 0x60 && code&0x04 != 0 }

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
	if s.Root != "" {
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

func (s *Store) rootDir() string {
	if s.Root == "" {
		return "/"
	}
	return s.Root
}

// pathInfos returns the infos of the valid paths among paths.
func (s *Store) pathInfos(ctx context.Context, paths []string) (map[string]nix.PathInfo, error) {
	db, err := nix.OpenStoreDB(s.Root)
	if errors.Is(err, fs.ErrNotExist) {
		// A fresh chroot store: Nix creates the database on first use.
		return map[string]nix.PathInfo{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer db.Close()
	return db.PathInfos(ctx, paths)
}
