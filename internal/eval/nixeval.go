package eval

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

//go:embed walker.nix
var walkerNix []byte

// Attr is one attribute the walk reached: a derivation, or the error that stopped it.
type Attr struct {
	Name    string   // rendered attribute path, e.g. checks.x86_64-linux.foo
	Path    []string // the path's components
	DrvPath string   // "" when Error is set
	Error   string
	// unit and unitAttempt name the claim of the table unit it was found in (0: a root);
	// unitDone marks, instead of an attribute, the end of that unit's walk.
	unit        int64
	unitAttempt int
	unitDone    bool
}

// Spec says what to evaluate.
type Spec struct {
	// Source is the directory the project's code may read: for a flake, the repository that
	// FlakeRef names; for a file, the commit's tree (gitrepo.Mirror.Export), where File is.
	Source   string
	Mode     string     // "flake" or "file"
	FlakeRef string     // flake: git+file://…?rev=…
	Rev      string     // the commit
	File     string     // file: ci.nix or default.nix
	Roots    [][]string // attribute paths to walk; one empty path walks the whole value
	Force    int        // levels walked without recurseForDerivations (1: the root's attributes)
	AllowIFD bool
}

// NixRunner runs the walk with nix-instantiate, in Nix's restricted evaluation mode and in a
// filesystem view of its own (view.go): the project's code reads only its own source, what it
// imports from derivations and the paths of SearchPath, and no environment variable; a fetcher
// restricted mode lets through finds nothing else to read.
type NixRunner struct {
	// Bin is nix-instantiate; default from PATH.
	Bin string
	// Bwrap is bubblewrap's bwrap, which makes the view; default from PATH, else /usr/bin/bwrap.
	Bwrap string
	// Home is the child's HOME (Nix's fetcher cache lives there); required.
	Home string
	// Store is passed as --store when set (a chroot store directory).
	Store string
	// Env is the child's whole environment besides HOME; nil means DefaultChildEnv().
	Env []string
	// WorkDir holds each walk's walker.nix and spec; default the system's temporary directory.
	WorkDir string
	// SearchPath are extra -I entries ("name=path") the project may read; their directories
	// are in the view, at the same paths.
	SearchPath []string
	// User, if set, is who the child runs as (a root node's unprivileged evaluation user); it
	// then reaches the store through Daemon's socket and Home, WorkDir and the source must be
	// readable by it.
	User *Credential
	// Daemon returns the socket of the nix-daemon an unprivileged child uses.
	Daemon func(ctx context.Context) (string, error)
	// DaemonPid, if set, is that daemon's process, 0 unless it runs: it serves this walk alone,
	// so it and the builds it runs count towards MaxMemory.
	DaemonPid func() int
	// MaxMemory stops the walk once all its workers and the daemon together use more resident
	// memory; 0 means no limit.
	MaxMemory int64
	// MaxMemoryPerWorker restarts a worker whose process tree uses more; the attribute it was
	// on is retried alone once, and fails if it goes past the limit again. 0 means no limit.
	MaxMemoryPerWorker int64
	// Workers is how many walkers run at once, sharing the attribute tree (workers.go); 0 or 1
	// walks in one process.
	Workers int
	// SplitAbove: with several workers, a set the walk recurses into that has more children
	// is cut into units other workers take; default defaultSplitAbove.
	SplitAbove int
	// OnRestart, if set, is called with the attribute a worker was on when it went past
	// MaxMemoryPerWorker ("" if between attributes).
	OnRestart func(attr string)
	// OnStart, if set, is called with each child's pid (tests kill it).
	OnStart func(pid int)
}

// Credential is an unprivileged user to run Nix as.
type Credential struct {
	Name     string
	UID, GID uint32
}

// ErrMemory is the error of a walk whose Nix used more memory than NixRunner.MaxMemory.
var ErrMemory = errors.New("evaluation used too much memory")

// DefaultChildEnv is the environment the Nix child gets: only what Nix itself needs from this
// process. Database URLs, tokens and keys never reach evaluated code (builtins.getEnv).
func DefaultChildEnv() []string {
	var env []string
	for _, k := range []string{"PATH", "TMPDIR", "TZ", "LANG", "LC_ALL", "NIX_REMOTE", "NIX_DAEMON_SOCKET_PATH", "NIX_CONF_DIR", "NIX_USER_CONF_FILES", "NIX_STORE_DIR", "NIX_STATE_DIR"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// Version is the version of the Nix that walks, as its nix-instantiate says, run as a walk is
// (the same user and environment): no Nix process of the evaluator runs with the node's
// privileges or secrets.
func (r *NixRunner) Version(ctx context.Context) (string, error) {
	bin := r.Bin
	if bin == "" {
		bin = "nix-instantiate"
	}
	vbin, args, err := r.viewCommand([]string{bin, "--version"}, viewSpec{})
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", bin, err)
	}
	cmd := exec.CommandContext(ctx, vbin, args...)
	cmd.Env = r.Env
	if cmd.Env == nil {
		cmd.Env = DefaultChildEnv()
	}
	cmd.Dir = "/"
	if r.User != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: r.User.UID, Gid: r.User.GID, Groups: []uint32{}}}
	}
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", bin, err)
	}
	v, err := nix.ParseVersion(string(out))
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", bin, err)
	}
	return v, nil
}

// ErrCancelled is returned by Walk when its context was cancelled.
var ErrCancelled = errors.New("evaluation stopped")

// walkSpec is spec in the walker's JSON form.
type walkSpec struct {
	Mode     string     `json:"mode"`
	FlakeRef string     `json:"flakeRef,omitempty"`
	Source   string     `json:"source,omitempty"`
	Rev      string     `json:"rev,omitempty"`
	File     string     `json:"file,omitempty"`
	Roots    [][]string `json:"roots"`
	Force    int        `json:"force"`
	Skip     []string   `json:"skip"`
	Probe    []string   `json:"probe,omitempty"`
	Units    []unit     `json:"units,omitempty"`
	Split    int        `json:"split,omitempty"`
}

// record is one trace line of the walker.
type record struct {
	Begin  *string  `json:"begin"`
	Walk   bool     `json:"walk"`
	Attr   string   `json:"attr"`
	Path   []string `json:"path"`
	Drv    string   `json:"drv"`
	Failed bool     `json:"failed"`
	Error  string   `json:"error"`
	// A set not walked but reported, for its children to be walked as units.
	Split *string  `json:"split"`
	Force int      `json:"force"`
	Names []string `json:"names"`
}

// recordPrefix starts a walker record; the nonce, random per walk and passed as an argument the
// project's code cannot see, makes records unforgeable by a project's own builtins.trace.
func recordPrefix(nonce string) string { return "trace: @hci:" + nonce + " " }

// Walk evaluates spec and calls emit for every attribute as Nix reaches it, from Workers walkers
// at once (emit is called from one at a time). An attribute whose evaluation fails is emitted
// with its error, and the walk goes on. Walk fails when Nix fails outside any attribute (a
// syntax error in ci.nix, a missing flake.nix), is killed, or ctx ends.
func (r *NixRunner) Walk(ctx context.Context, spec Spec, emit func(Attr) error) error {
	return r.walk(ctx, spec, nil, emit)
}

// walk is Walk, with the units it splits off in the evaluation's table when shared is set
// (a helper's spec has no roots: it walks only units of the table).
func (r *NixRunner) walk(ctx context.Context, spec Spec, shared *sharedUnits, emit func(Attr) error) error {
	dir, ws, err := r.prepareWalk(spec)
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var rnd [12]byte
	_, _ = rand.Read(rnd[:])
	roots := make([]unit, len(spec.Roots))
	for i, p := range spec.Roots {
		roots[i] = unit{Path: p, Force: spec.Force}
	}
	p := newWalkPool(r, spec, ws, dir, hex.EncodeToString(rnd[:]), shared, emit)
	return p.walk(ctx, roots)
}

// prepareWalk writes what every walker of spec reads into a new directory: walker.nix and the
// git configuration. ws is spec in the walker's form, without units.
func (r *NixRunner) prepareWalk(spec Spec) (dir string, ws walkSpec, err error) {
	if !filepath.IsAbs(spec.Source) {
		return "", ws, fmt.Errorf("walk: the source directory %q is not absolute", spec.Source)
	}
	dir, err = os.MkdirTemp(r.WorkDir, "walk-")
	if err != nil {
		return "", ws, fmt.Errorf("walk: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	// Readable by the evaluation user; nothing in it is secret (the nonce is not in it).
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", ws, fmt.Errorf("walk: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "walker.nix"), walkerNix, 0o644); err != nil {
		return "", ws, fmt.Errorf("walk: %w", err)
	}
	// Nix sees the source at its place in the view.
	source, err := viewSource(spec.Source)
	if err != nil {
		return "", ws, fmt.Errorf("walk: %w", err)
	}
	flakeRef := spec.FlakeRef
	if spec.Mode == "flake" {
		host := "git+file://" + spec.Source + "?"
		if !strings.HasPrefix(flakeRef, host) {
			return "", ws, fmt.Errorf("walk: the flake reference %q does not name the source directory %s", flakeRef, spec.Source)
		}
		flakeRef = "git+file://" + source + "?" + strings.TrimPrefix(flakeRef, host)
	}
	// The source repository is root's; git 2.39 lets another user read it only when its global
	// configuration says so (safe.directory is ignored in the environment and on the command
	// line), so the child's global configuration is this file.
	gitconfig := "[safe]\n\tdirectory = " + strconv.Quote(source) + "\n"
	if err := os.WriteFile(filepath.Join(dir, "gitconfig"), []byte(gitconfig), 0o644); err != nil {
		return "", ws, fmt.Errorf("walk: %w", err)
	}
	ws = walkSpec{Mode: spec.Mode, FlakeRef: flakeRef, Source: source, Rev: spec.Rev, File: spec.File,
		Roots: spec.Roots, Force: spec.Force, Skip: []string{}}
	return dir, ws, nil
}

type runResult struct {
	ok          bool
	culprit     *string  // the attribute begun last, when Nix failed inside one
	culpritPath []string // its path
	message     string   // Nix's error output
	overWorker  bool     // killed past MaxMemoryPerWorker
}

// command is nix-instantiate running the walker in its view; info is the read end of bwrap's
// info fd (see started).
func (r *NixRunner) command(ctx context.Context, dir, nonce string, spec Spec, ws walkSpec) (cmd *exec.Cmd, info *os.File, err error) {
	// A spec file per run: several workers run at once from one directory.
	f, err := os.CreateTemp(dir, "spec-*.json")
	if err != nil {
		return nil, nil, err
	}
	b, _ := json.Marshal(ws)
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err != nil {
		return nil, nil, err
	}
	specFile := viewWalker + "/" + filepath.Base(f.Name())
	bin := r.Bin
	if bin == "" {
		bin = "nix-instantiate"
	}
	args := []string{"--eval", "--strict", "--read-write-mode",
		"--extra-experimental-features", "nix-command flakes",
		"--option", "substituters", "",
		"--option", "allow-import-from-derivation", fmt.Sprint(spec.AllowIFD),
		"--option", "pure-eval", "false",
		// Restricted: files only under the search path (the walker's directory, the project's
		// source), no fetch by URI, builtins.getEnv always "". No allowed-uris: Nix 2.8
		// compares them as prefixes without resolving "..", so "file://<source>/../…" would
		// pass; without any, a file:// URI goes through the path check, which resolves it.
		// That is also why a file project is read from its exported tree, not fetched with
		// builtins.fetchGit: Nix 2.20 and later check fetchGit's "git+file://…" URL against
		// allowed-uris alone.
		"--option", "restrict-eval", "true",
		"--option", "allowed-uris", "",
		"-I", "hci-walker=" + viewWalker,
		"-I", "hci-source=" + ws.Source,
	}
	for _, e := range r.SearchPath {
		args = append(args, "-I", e)
	}
	args = append(args,
		"--argstr", "specFile", specFile,
		"--argstr", "nonce", nonce,
		viewWalker+"/walker.nix",
	)
	if r.Store != "" {
		args = append([]string{"--store", r.Store}, args...)
	}
	env := r.Env
	if env == nil {
		env = DefaultChildEnv()
	}
	env = append(append([]string{}, env...),
		// git reads no configuration of the node's: the view's global one is the walker's.
		"GIT_CONFIG_GLOBAL="+viewWalker+"/gitconfig", "GIT_CONFIG_NOSYSTEM=1")
	v := viewSpec{walker: dir, source: spec.Source, sourceAt: ws.Source, home: r.Home, info: true}
	if r.User != nil {
		if v.socket, err = r.Daemon(ctx); err != nil {
			return nil, nil, err
		}
		// The store through the daemon, as an untrusted client.
		env = append(env, "NIX_REMOTE=daemon", "NIX_DAEMON_SOCKET_PATH="+viewSocket)
	}
	vbin, vargs, err := r.viewCommand(append([]string{bin}, args...), v)
	if err != nil {
		return nil, nil, err
	}
	info, infoW, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	cmd = exec.CommandContext(ctx, vbin, vargs...)
	cmd.Env = env
	cmd.Dir = dir
	cmd.ExtraFiles = []*os.File{infoW} // fd 3, bwrap's --info-fd
	// bwrap gets its own process group so a timeout or cancel kills it, and with it the view.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if r.User != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: r.User.UID, Gid: r.User.GID, Groups: []uint32{}}
	}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	return cmd, info, nil
}

// closeInfo closes both ends of the info fd of a cmd that did not start.
func closeInfo(cmd *exec.Cmd, info *os.File) {
	_ = info.Close()
	for _, f := range cmd.ExtraFiles {
		_ = f.Close()
	}
}

// started is called once cmd (from command) has started: it closes this process's copy of the
// info fd's write end and passes OnStart the pid of the Nix inside the view, as bwrap reports it
// (the pid in this process's namespace), or bwrap's own if it reported none.
func (r *NixRunner) started(cmd *exec.Cmd, info *os.File) {
	for _, f := range cmd.ExtraFiles {
		_ = f.Close()
	}
	pid := readChildPid(info)
	if pid == 0 {
		pid = cmd.Process.Pid
	}
	if r.OnStart != nil {
		r.OnStart(pid)
	}
}

func (r *NixRunner) memoryError() error {
	return fmt.Errorf("%w: over eval.max_memory (%d MiB)", ErrMemory, r.MaxMemory>>20)
}

// workerMemoryMessage is the error of an attribute that alone took a worker past its limit.
func (r *NixRunner) workerMemoryMessage() string {
	return fmt.Sprintf("evaluating this attribute exceeds eval.max_memory_per_worker (%d MiB)", r.MaxMemoryPerWorker>>20)
}

// run runs the walker once, passing each record to onRecord.
func (r *NixRunner) run(ctx context.Context, mw *memoryWatch, dir, nonce string, spec Spec, ws walkSpec, onRecord func(record) error) (runResult, error) {
	cmd, info, err := r.command(ctx, dir, nonce, spec, ws)
	if err != nil {
		return runResult{}, fmt.Errorf("walk: %w", err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		closeInfo(cmd, info)
		return runResult{}, fmt.Errorf("walk: %w", err)
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		closeInfo(cmd, info)
		return runResult{}, fmt.Errorf("start nix-instantiate: %w", err)
	}
	r.started(cmd, info)
	overWorker := mw.add(cmd.Process.Pid)
	prefix := recordPrefix(nonce)
	var (
		walking   bool
		begun     *string
		begunPath []string
		tail      tailBuffer
		emitErr   error
		sc        = bufio.NewScanner(stderr)
	)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		js, ok := strings.CutPrefix(line, prefix)
		if !ok {
			if !strings.HasPrefix(line, "warning: ") {
				tail.add(line)
			}
			continue
		}
		var rec record
		if err := json.Unmarshal([]byte(js), &rec); err != nil {
			tail.add(line)
			continue
		}
		switch {
		case rec.Walk:
			walking = true
		case rec.Begin != nil:
			b := *rec.Begin
			begun, begunPath = &b, rec.Path
			tail.reset()
		case emitErr == nil:
			begun = nil
			tail.reset()
			if emitErr = onRecord(rec); emitErr != nil {
				_ = cmd.Cancel()
			}
		}
	}
	_, _ = io.Copy(io.Discard, stderr)
	waitErr := cmd.Wait()
	if mw.exceeded() {
		return runResult{}, r.memoryError()
	}
	if emitErr != nil {
		return runResult{}, emitErr
	}
	if ctx.Err() != nil {
		return runResult{}, fmt.Errorf("%w: %w", ErrCancelled, context.Cause(ctx))
	}
	if overWorker() {
		res := runResult{overWorker: true}
		if walking && begun != nil && *begun != "" {
			res.culprit, res.culpritPath = begun, begunPath
		}
		return res, nil
	}
	if waitErr == nil {
		return runResult{ok: true}, nil
	}
	var exit *exec.ExitError
	if !errors.As(waitErr, &exit) {
		return runResult{}, fmt.Errorf("nix-instantiate: %w", waitErr)
	}
	if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return runResult{}, fmt.Errorf("nix-instantiate was killed by signal %s", ws.Signal())
	}
	if sig, ok := bwrapSignal(exit); ok {
		return runResult{}, fmt.Errorf("nix-instantiate was killed by signal %s", sig)
	}
	msg := tail.String()
	if msg == "" {
		msg = fmt.Sprintf("nix-instantiate exited with code %d", exit.ExitCode())
	}
	res := runResult{message: msg}
	if walking && begun != nil && *begun != "" {
		res.culprit, res.culpritPath = begun, begunPath
	}
	return res, nil
}

// probe evaluates one attribute on its own to get the message of the error tryEval swallowed.
func (r *NixRunner) probe(ctx context.Context, mw *memoryWatch, dir, nonce string, spec Spec, ws walkSpec, path []string) (string, error) {
	ws.Probe = path
	cmd, info, err := r.command(ctx, dir, nonce, spec, ws)
	if err != nil {
		return "", fmt.Errorf("probe: %w", err)
	}
	var out bytes.Buffer
	cmd.Stderr = &out
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		closeInfo(cmd, info)
		return "", fmt.Errorf("probe: start nix-instantiate: %w", err)
	}
	r.started(cmd, info)
	overWorker := mw.add(cmd.Process.Pid)
	err = cmd.Wait()
	if mw.exceeded() {
		return "", r.memoryError()
	}
	if ctx.Err() != nil {
		return "", fmt.Errorf("%w: %w", ErrCancelled, context.Cause(ctx))
	}
	if overWorker() {
		return r.workerMemoryMessage(), nil
	}
	var tail tailBuffer
	for line := range strings.SplitSeq(out.String(), "\n") {
		if line != "" && !strings.HasPrefix(line, "warning: ") && !strings.HasPrefix(line, recordPrefix(nonce)) {
			tail.add(line)
		}
	}
	if err == nil || tail.String() == "" {
		return "evaluation failed", nil
	}
	return tail.String(), nil
}

// tailBuffer keeps the last lines of Nix's error output, bounded.
type tailBuffer struct{ lines []string }

const maxErrorLines = 60

func (t *tailBuffer) add(l string) {
	t.lines = append(t.lines, l)
	if len(t.lines) > maxErrorLines {
		t.lines = t.lines[len(t.lines)-maxErrorLines:]
	}
}
func (t *tailBuffer) reset()         { t.lines = t.lines[:0] }
func (t *tailBuffer) String() string { return strings.TrimSpace(strings.Join(t.lines, "\n")) }
