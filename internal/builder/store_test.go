package builder

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixgen"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/signertest"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

// storeTestCache is the cluster's cache the builder substitutes from: an in-process signer and
// cache, seeded with what the evaluator and earlier builds put there.
type storeTestCache struct {
	url     string
	key     nix.SecretKey
	cluster *signertest.Cluster
}

func newStoreTestCache(t *testing.T) *storeTestCache {
	t.Helper()
	c := signertest.Start(t, dbtest.NewPool(t), signertest.Options{KeyName: "build-store-test-1"})
	return &storeTestCache{url: c.URL, key: c.Key, cluster: c}
}

// store is a fresh chroot store substituting from the cache only.
func (c *storeTestCache) store(t *testing.T) *Store {
	return &Store{Root: t.TempDir(), Substituters: []string{c.url}, TrustedKeys: []string{c.key.Public().String()}}
}

// publish publishes system-store paths, as the evaluator and earlier builds did.
func (c *storeTestCache) publish(t *testing.T, paths ...string) {
	t.Helper()
	infos := storeTestSystemInfos(t, paths)
	var ps []signertest.SeedPath
	for _, p := range paths {
		info, ok := infos[p]
		if !ok {
			t.Fatalf("publish: %s is not valid in the system store", p)
		}
		ps = append(ps, signertest.SeedPath{StorePath: p, References: info.References, Deriver: info.Deriver})
	}
	c.cluster.Seed(t, "", ps...)
}

func storeTestCtx(t *testing.T) context.Context { return queuetest.Ctx(t, time.Minute) }

func storeTestSystemInfos(t *testing.T, paths []string) map[string]nix.PathInfo {
	t.Helper()
	infos, err := (&Store{}).pathInfos(storeTestCtx(t), paths)
	if err != nil {
		t.Fatal(err)
	}
	return infos
}

// storeTestSystemHashes is the Canonical of these tests: the system store built and published
// every path first, so its hashes are the cache's.
func storeTestSystemHashes(ctx context.Context, paths []string) (map[string]string, error) {
	infos, err := (&Store{}).pathInfos(ctx, paths)
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for p, info := range infos {
		m[p] = info.NarHash
	}
	return m, nil
}

func storeTestRun(t *testing.T, name string, args ...string) string {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// storeTestInstantiate instantiates attrs of expr into the store at root ("" = system store).
func storeTestInstantiate(t *testing.T, root, expr string, attrs ...string) map[string]string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "default.nix")
	if err := os.WriteFile(file, []byte(expr), 0o644); err != nil {
		t.Fatal(err)
	}
	drvs := map[string]string{}
	for _, a := range attrs {
		args := []string{file, "-A", a, "--option", "substituters", ""}
		if root != "" {
			args = append(args, "--store", root)
		}
		drvs[a] = storeTestRun(t, "nix-instantiate", args...)
	}
	return drvs
}

// storeTestBuildSystem builds drvs in the system store, as the cluster's earlier builds did.
func storeTestBuildSystem(t *testing.T, drvs ...string) {
	t.Helper()
	storeTestRun(t, "nix-store", append([]string{"--realise", "--option", "build-users-group", "",
		"--option", "sandbox", "false", "--option", "substituters", ""}, drvs...)...)
}

func storeTestOut(t *testing.T, root, drvPath string) string {
	t.Helper()
	d, err := nix.ReadDerivation(root, drvPath)
	if err != nil {
		t.Fatal(err)
	}
	return d.Outputs["out"].Path
}

func storeTestValid(t *testing.T, s *Store, path string) (nix.PathInfo, bool) {
	t.Helper()
	infos, err := s.pathInfos(storeTestCtx(t), []string{path})
	if err != nil {
		t.Fatal(err)
	}
	info, ok := infos[path]
	return info, ok
}

// storeTestOpen opens a session on s, closed at the test's end.
func storeTestOpen(t *testing.T, s *Store) *Session {
	t.Helper()
	ss, err := s.Open(storeTestCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ss.Close)
	return ss
}

func storeTestSalt(t *testing.T) string {
	return fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
}

// TestStoreFetchInputsAndBuild is a builder's way through a job: the .drv closure and the
// inputs come from the cache into a fresh store, rooted, and the build succeeds there.
func TestStoreFetchInputsAndBuild(t *testing.T) {
	nixtest.RequireNix(t)
	t.Parallel()
	c := newStoreTestCache(t)
	ctx := storeTestCtx(t)
	expr := nixgen.Lib(storeTestSalt(t)) + ` let a = mk "a" [ ]; b = mk "b" [ a ]; c = mk "c" [ b ]; in { inherit a b c; }`
	drvs := storeTestInstantiate(t, "", expr, "a", "b", "c")
	storeTestBuildSystem(t, drvs["a"], drvs["b"])
	outA, outB := storeTestOut(t, "", drvs["a"]), storeTestOut(t, "", drvs["b"])
	c.publish(t, outA, outB)
	c.publish(t, strings.Fields(storeTestRun(t, "nix-store", "--query", "--requisites", drvs["c"]))...)

	s := c.store(t)
	ss := storeTestOpen(t, s)
	drvC, err := ss.Derivation(ctx, drvs["c"])
	if err != nil {
		t.Fatal(err)
	}
	if want, err := nix.ReadDerivation("", drvs["c"]); err != nil || !reflect.DeepEqual(drvC, want) {
		t.Fatalf("Derivation(c) = %+v, %v; want %+v", drvC, err, want)
	}
	// The derivation comes over the connection to the build: no .drv lands in the store.
	for _, name := range []string{"a", "b", "c"} {
		if _, ok := storeTestValid(t, s, drvs[name]); ok {
			t.Fatalf("the .drv of %s was added to the store", name)
		}
	}

	// The input derivations' outputs come from the database; one it does not know is read from
	// its .drv in the cache.
	for _, known := range []map[string]map[string]string{nil, {drvs["b"]: {"out": outB}}} {
		inputs, err := ss.InputPaths(ctx, drvs["c"], drvC, known)
		if err != nil || !slices.Equal(inputs, []string{outB}) {
			t.Fatalf("InputPaths(c) with %v known = %v, %v; want just b's output %s", known, inputs, err, outB)
		}
	}
	inputs := []string{outB}
	mismatches, err := ss.EnsureInputs(ctx, inputs, storeTestSystemHashes, queuetest.TestLogger(t))
	if err != nil || len(mismatches) != 0 {
		t.Fatalf("EnsureInputs = %v, %v; want no mismatches", mismatches, err)
	}
	info, ok := storeTestValid(t, s, outB)
	if want := storeTestSystemInfos(t, inputs)[outB].NarHash; !ok || info.NarHash != want {
		t.Fatalf("b's output after EnsureInputs: valid %v, NAR hash %s, want %s", ok, info.NarHash, want)
	}
	// Valid and canonical now: nothing to substitute, no substituter is asked (this one would
	// refuse the connection).
	offline := *s
	offline.Substituters = []string{"http://127.0.0.1:1"}
	if _, err := storeTestOpen(t, &offline).EnsureInputs(ctx, inputs, storeTestSystemHashes, nil); err != nil {
		t.Fatalf("EnsureInputs of valid inputs: %v", err)
	}

	remove, err := s.AddRoots("job-42", inputs)
	if err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(s.Root, "nix/var/nix/gcroots/harmonia-ci/job-42-0")
	if target, err := os.Readlink(link); err != nil || target != outB {
		t.Fatalf("GC root %s → %q, %v; want %s", link, target, err, outB)
	}

	var log bytes.Buffer
	outs, err := ss.Build(ctx, drvs["c"], drvC, inputs, BuildLimits{Timeout: time.Minute, MaxSilent: time.Minute, MaxOutputSize: 1 << 20}, &log)
	if err != nil {
		t.Fatalf("Build: %v\n%s", err, log.String())
	}
	outC := storeTestOut(t, "", drvs["c"])
	if want := map[string]string{"out": outC}; !maps.Equal(outs, want) {
		t.Fatalf("Build = %v, want %v", outs, want)
	}
	if got, err := os.ReadFile(filepath.Join(s.Root, outC)); err != nil || string(got) != "c\nb\na\n" {
		t.Fatalf("c's output holds %q, %v", got, err)
	}
	if !strings.Contains(log.String(), "building c") || !strings.Contains(log.String(), "building '"+drvs["c"]+"'") {
		t.Errorf("build log %q lacks the builder's output or Nix's line naming the build", log.String())
	}
	infos, err := ss.OutputInfos(ctx, []string{outC})
	if err != nil {
		t.Fatal(err)
	}
	if i := infos[outC]; i.Deriver != drvs["c"] || !strings.HasPrefix(i.NarHash, "sha256:") || i.NarSize == 0 {
		t.Errorf("OutputInfos = %+v", i)
	}
	if _, err := ss.OutputInfos(ctx, []string{outA}); err == nil {
		t.Errorf("OutputInfos of a path not in the store succeeded")
	}
	// The output read back through the daemon is the NAR `nix-store --dump` gives.
	var nar bytes.Buffer
	if err := ss.DumpNAR(ctx, outC, &nar); err != nil {
		t.Fatal(err)
	}
	if want, err := exec.Command("nix-store", "--dump", filepath.Join(s.Root, outC)).Output(); err != nil || !bytes.Equal(nar.Bytes(), want) {
		t.Errorf("DumpNAR(c) differs from nix-store --dump (%v)", err)
	}
	ss.Close() // its daemon's temporary roots would keep outB

	// Nix honours the root, and after remove nothing is left of it.
	del := []string{"--store", s.Root, "--delete", outB, "--option", "build-users-group", ""}
	if out, err := exec.Command("nix-store", del...).CombinedOutput(); err == nil {
		t.Fatalf("nix-store --delete of a rooted input succeeded:\n%s", out)
	}
	remove()
	remove() // idempotent
	if _, err := os.Lstat(link); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("GC root still there after remove: %v", err)
	}
	storeTestRun(t, "nix-store", del...)
}

// TestEnsureInputsUnavailable: an input no cache has is an error, and nothing is built,
// although its .drv is in the store.
func TestEnsureInputsUnavailable(t *testing.T) {
	nixtest.RequireNix(t)
	t.Parallel()
	c := newStoreTestCache(t)
	ctx := storeTestCtx(t)
	expr := nixgen.Lib(storeTestSalt(t)) + ` let a = mk "a" [ ]; b = mk "b" [ a ]; in { inherit a b; }`
	drvs := storeTestInstantiate(t, "", expr, "a", "b")
	c.publish(t, strings.Fields(storeTestRun(t, "nix-store", "--query", "--requisites", drvs["b"]))...)

	s := c.store(t)
	ss := storeTestOpen(t, s)
	drvB, err := ss.Derivation(ctx, drvs["b"])
	if err != nil {
		t.Fatal(err)
	}
	outA := storeTestOut(t, "", drvs["a"])
	_, err = ss.EnsureInputs(ctx, []string{outA}, storeTestSystemHashes, nil)
	if !errors.Is(err, ErrInputUnavailable) || !strings.Contains(err.Error(), outA) {
		t.Fatalf("EnsureInputs of an input no cache has = %v, want ErrInputUnavailable naming %s", err, outA)
	}
	// Nor does Build make up for it by building the input.
	var be *BuildError
	if _, err := ss.Build(ctx, drvs["b"], drvB, []string{outA}, BuildLimits{}, nil); !errors.As(err, &be) || be.Kind != "nix" || !strings.Contains(be.Message, outA) {
		t.Fatalf("Build with a missing input = %v, want a nix BuildError naming %s", err, outA)
	}
	if _, ok := storeTestValid(t, s, outA); ok {
		t.Fatalf("%s was built", outA)
	}
	// Nor does a .drv no cache has arrive from anywhere.
	other := storeTestInstantiate(t, "", nixgen.Lib(storeTestSalt(t))+` { x = mk "x" [ ]; }`, "x")["x"]
	if _, err := ss.Derivation(ctx, other); !errors.Is(err, ErrInputUnavailable) {
		t.Fatalf("Derivation of a .drv no cache has = %v, want ErrInputUnavailable", err)
	}
}

// TestEnsureInputsFrankenbuild: a local build of an input that differs from the cache's is
// accepted while there is no canonical hash, then deleted (with what refers to it) and
// substituted again once there is.
func TestEnsureInputsFrankenbuild(t *testing.T) {
	nixtest.RequireNix(t)
	t.Parallel()
	c := newStoreTestCache(t)
	ctx := storeTestCtx(t)
	// imp reads a file the sandbox hides: the system store's unsandboxed build differs from the
	// builder's.
	marker := filepath.Join(t.TempDir(), "marker")
	if err := os.WriteFile(marker, []byte("canonical build\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	salt := storeTestSalt(t)
	expr := fmt.Sprintf(`let
  drv = name: script: builtins.derivation {
    inherit name;
    system = builtins.currentSystem;
    builder = "/bin/sh";
    salt = "%s";
    args = [ "-c" script ];
  };
  imp = drv "imp" "if [ -e %s ]; then read -r v < %s; else v=frankenbuild; fi; echo \"$v\" > $out";
  user = drv "user" "echo ${imp} > $out";
in { inherit imp user; }`, salt, marker, marker)
	drvs := storeTestInstantiate(t, "", expr, "imp", "user")
	storeTestBuildSystem(t, drvs["imp"])
	c.publish(t, storeTestOut(t, "", drvs["imp"]))
	c.publish(t, strings.Fields(storeTestRun(t, "nix-store", "--query", "--requisites", drvs["user"]))...)

	s := c.store(t)
	ss := storeTestOpen(t, s)
	imp := storeTestOut(t, "", drvs["imp"])
	for _, name := range []string{"imp", "user"} {
		drv, err := ss.Derivation(ctx, drvs[name])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ss.Build(ctx, drvs[name], drv, []string{imp}[:len(drv.InputDrvs)], BuildLimits{}, nil); err != nil {
			t.Fatalf("local build of %s: %v", name, err)
		}
	}
	user := storeTestOut(t, "", drvs["user"])
	canonical := storeTestSystemInfos(t, []string{imp})[imp].NarHash
	local, _ := storeTestValid(t, s, imp)
	if local.NarHash == canonical {
		t.Fatalf("the local build of imp has the canonical NAR hash %s: the test needs a Frankenbuild", canonical)
	}

	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	tests := []struct {
		name      string
		canonical Canonical
		mismatch  bool
		wantHash  string
	}{
		{"no canonical hash yet: the local build is accepted", func(context.Context, []string) (map[string]string, error) {
			return map[string]string{}, nil
		}, false, local.NarHash},
		{"canonical hash differs: substituted again", storeTestSystemHashes, true, canonical},
		{"canonical now", storeTestSystemHashes, false, canonical},
	}
	for _, tt := range tests {
		logs.Reset()
		mismatches, err := ss.EnsureInputs(ctx, []string{imp}, tt.canonical, logger)
		if err != nil {
			t.Fatalf("%s: EnsureInputs: %v", tt.name, err)
		}
		if got := len(mismatches) > 0; got != tt.mismatch || (got && !slices.Equal(mismatches, []string{imp})) {
			t.Fatalf("%s: mismatches %v", tt.name, mismatches)
		}
		if tt.mismatch != strings.Contains(logs.String(), imp) {
			t.Errorf("%s: warning log %q", tt.name, logs.String())
		}
		if info, ok := storeTestValid(t, s, imp); !ok || info.NarHash != tt.wantHash {
			t.Fatalf("%s: imp valid %v with NAR hash %s, want %s", tt.name, ok, info.NarHash, tt.wantHash)
		}
	}
	if got, err := os.ReadFile(filepath.Join(s.Root, imp)); err != nil || string(got) != "canonical build\n" {
		t.Fatalf("imp holds %q, %v after substitution", got, err)
	}
	// user was built against the Frankenbuild: it went with it.
	if _, ok := storeTestValid(t, s, user); ok {
		t.Fatalf("%s, which refers to the deleted Frankenbuild, is still valid", user)
	}
}

// storeTestLog is a build log that cancels the build when it sees a string.
type storeTestLog struct {
	mu       sync.Mutex
	buf      bytes.Buffer
	cancelOn string
	cancel   context.CancelFunc
}

func (l *storeTestLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	if l.cancelOn != "" && strings.Contains(l.buf.String(), l.cancelOn) {
		l.cancel()
	}
	return len(p), nil
}

func (l *storeTestLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// storeTestProcesses returns the pids of processes whose command line contains s.
func storeTestProcesses(s string) []string {
	entries, _ := os.ReadDir("/proc")
	var pids []string
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte(s)) {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

// TestBuildFailures: each way a build ends badly is its BuildError, and neither Nix's process
// group nor the builder (in a session of its own) outlives Build.
func TestBuildFailures(t *testing.T) {
	nixtest.RequireNix(t)
	t.Parallel()
	root := t.TempDir()
	salt := storeTestSalt(t)
	// Every builder's command line names its case, to find leftovers in /proc.
	expr := nixgen.Lib(salt) + fmt.Sprintf(` let
  sh = name: script: builtins.derivation {
    inherit name;
    system = builtins.currentSystem;
    builder = "/bin/sh";
    args = [ "-c" ": %s-${name}; ${script}" ];
  };
  spin = "while :; do :; done";
in {
  failing = fail "failing" [ ];
  timeout = sh "timeout" spin;
  killed = sh "killed" spin;
  silent = sh "silent" "echo once; ${spin}";
  cancelled = sh "cancelled" "echo spinning; ${spin}";
  big = sh "big" "i=0; while [ $i -lt 2000 ]; do echo 0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789; i=$((i+1)); done > $out";
}`, salt)
	names := []string{"failing", "timeout", "killed", "silent", "cancelled", "big"}
	drvs := storeTestInstantiate(t, root, expr, names...)

	tests := []struct {
		name      string
		limits    BuildLimits
		killGrace time.Duration
		cancelOn  string
		kind      string
		message   string // a substring
		exitCode  int
		log       string
	}{
		{name: "failing", limits: BuildLimits{Timeout: time.Minute}, kind: "failed",
			message: "failed with exit code 1", exitCode: 100, log: "failing failing"},
		{name: "timeout", limits: BuildLimits{Timeout: 2 * time.Second}, kind: "timeout",
			message: "build timed out after 2s", exitCode: -1},
		// Nix gets no time to stop its builder: Build kills it.
		{name: "killed", limits: BuildLimits{Timeout: time.Second}, killGrace: time.Nanosecond, kind: "timeout",
			message: "build timed out after 1s", exitCode: -1},
		{name: "silent", limits: BuildLimits{Timeout: time.Minute, MaxSilent: time.Second}, kind: "silent",
			message: "no output for 1s", exitCode: -1, log: "once"},
		{name: "cancelled", limits: BuildLimits{Timeout: time.Minute}, cancelOn: "spinning"},
		{name: "big", limits: BuildLimits{Timeout: time.Minute, MaxOutputSize: 1000}, kind: "output-size",
			message: "KB, over max_output_size 1 KB", exitCode: -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var pids []int
			s := &Store{Root: root, killGrace: tt.killGrace, onStart: func(p int) {
				mu.Lock()
				defer mu.Unlock()
				pids = append(pids, p)
			}}
			ss := storeTestOpen(t, s)
			drv, err := nix.ReadDerivation(root, drvs[tt.name])
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(storeTestCtx(t))
			defer cancel()
			log := &storeTestLog{cancelOn: tt.cancelOn, cancel: cancel}
			start := time.Now()
			outs, err := ss.Build(ctx, drvs[tt.name], drv, nil, tt.limits, log)
			elapsed := time.Since(start)

			var be *BuildError
			switch {
			case tt.cancelOn != "":
				if !errors.Is(err, context.Canceled) || errors.As(err, &be) {
					t.Fatalf("cancelled Build = %v, %v; want context.Canceled", outs, err)
				}
			case !errors.As(err, &be):
				t.Fatalf("Build = %v, %v; want a BuildError\nlog:\n%s", outs, err, log.String())
			case be.Kind != tt.kind || !strings.Contains(be.Message, tt.message) || be.ExitCode != tt.exitCode:
				t.Fatalf("Build = %+v, want kind %s, message with %q, exit code %d\nlog:\n%s", be, tt.kind, tt.message, tt.exitCode, log.String())
			}
			if !strings.Contains(log.String(), tt.log) {
				t.Errorf("log %q lacks %q", log.String(), tt.log)
			}
			if tt.kind == "timeout" && elapsed < tt.limits.Timeout {
				t.Errorf("timed out after %s, before %s", elapsed, tt.limits.Timeout)
			}
			// A stopped build's daemon is gone when Build returns; a build that ended on its
			// own leaves its session usable for the next job.
			mu.Lock()
			pid := pids[0]
			mu.Unlock()
			stopped := tt.cancelOn != "" || tt.kind == "timeout" || tt.kind == "silent"
			// Deleting the oversized output replaced the connection (its daemon rooted them).
			gone := stopped || tt.kind == "output-size"
			if err := syscall.Kill(-pid, 0); gone != errors.Is(err, syscall.ESRCH) {
				t.Errorf("the daemon's process group %d after Build: %v; want it gone: %v", pid, err, gone)
			}
			if _, err := ss.PathInfos(ctx, []string{drvs[tt.name]}); !stopped && err != nil {
				t.Errorf("the session after a build that ended on its own: %v", err)
			}
			// A SIGKILLed builder may take a moment to die.
			marker := salt + "-" + tt.name
			waittest.For(t, 5*time.Second, func() bool { return len(storeTestProcesses(marker)) == 0 },
				"the builder of %s to be gone", tt.name)
			if tt.name == "big" {
				if _, ok := storeTestValid(t, s, storeTestOut(t, root, drvs["big"])); ok {
					t.Errorf("the oversized output is still in the store")
				}
			}
		})
	}
}

func TestApproxSize(t *testing.T) {
	tests := []struct {
		n    int64
		want string
	}{
		{0, "0 B"}, {999, "999 B"}, {1000, "1 KB"}, {204_000, "204 KB"}, {5_200_000_000, "5.2 GB"},
		{4_000_000_000, "4 GB"}, {1_260_000, "1.3 MB"},
	}
	for _, tt := range tests {
		if got := approxSize(tt.n); got != tt.want {
			t.Errorf("approxSize(%d) = %q, want %q", tt.n, got, tt.want)
		}
	}
}

func TestSystemStoreBuildsCannotReadSecrets(t *testing.T) {
	t.Parallel()
	secretValue := "hci-build-secret-" + storeTestSalt(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil { // visible, if anything could see it
		t.Fatal(err)
	}
	secret := filepath.Join(dir, "signing-key")
	if err := os.WriteFile(secret, []byte(secretValue+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name     string
		store    Store
		readable bool
	}{
		{"root without sandbox (the old default)", Store{Unsandboxed: true}, true},
		{"build users without sandbox", Store{Unsandboxed: true, BuildUsersGroup: "nixbld"}, false},
		{"default: sandbox and build users", Store{BuildUsersGroup: "nixbld"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			salt := storeTestSalt(t)
			drv := storeTestInstantiate(t, "", fmt.Sprintf(`{ steal = derivation {
  name = "steal"; salt = %q; system = builtins.currentSystem; builder = "/bin/sh";
  args = [ "-c" "read l < %s || exit 3; echo \"$l\"; echo \"$l\" > $out" ]; }; }`, salt, secret), "steal")["steal"]
			s := tt.store
			if _, err := s.Init(storeTestCtx(t)); err != nil {
				t.Fatal(err)
			}
			d, err := nix.ReadDerivation("", drv)
			if err != nil {
				t.Fatal(err)
			}
			var log storeTestLog
			outs, err := storeTestOpen(t, &s).Build(storeTestCtx(t), drv, d, nil, BuildLimits{Timeout: time.Minute}, &log)
			if tt.readable {
				if err != nil {
					t.Fatalf("the unconfined build failed: %v\n%s", err, log.String())
				}
				got, _ := os.ReadFile(outs["out"])
				if !strings.Contains(string(got), secretValue) {
					t.Fatalf("the unconfined build's output %q lacks the secret", got)
				}
				return
			}
			var be *BuildError
			if !errors.As(err, &be) || be.Kind != "failed" {
				t.Fatalf("Build = %v, want a failed build\n%s", err, log.String())
			}
			if strings.Contains(log.String(), secretValue) {
				t.Fatalf("the log shows the secret:\n%s", log.String())
			}
		})
	}
}

// pathInfos reads the infos of the valid paths among paths from the store's database itself:
// the tests' view, independent of the daemon's.
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

// TestDerivationFromAnotherPath: a cache that serves, under a .drv's path, another derivation's
// text (signed by a trusted key: a compromised or confused cache) is refused, since the builder
// would otherwise build something else under the job's name.
func TestDerivationFromAnotherPath(t *testing.T) {
	nixtest.RequireNix(t)
	t.Parallel()
	root := t.TempDir()
	salt := storeTestSalt(t)
	drvs := storeTestInstantiate(t, root, nixgen.Lib(salt)+` { wanted = mk "wanted" [ ]; other = mk "other" [ ]; }`, "wanted", "other")
	key, err := nix.GenerateKey("evil-cache-1")
	if err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(filepath.Join(root, drvs["other"]))
	if err != nil {
		t.Fatal(err)
	}
	nar := nix.FileNAR(text, false)
	body := nix.Compress(nar)
	sizes := nix.Sizes{NarHash: nix.FormatSHA256(sha256.Sum256(nar)), NarSize: int64(len(nar)),
		FileHash: nix.FormatSHA256(sha256.Sum256(body)), FileSize: int64(len(body))}
	ni := nix.NewNarInfo(drvs["wanted"], sizes, nil)
	if err := ni.Sign(key); err != nil {
		t.Fatal(err)
	}
	info, err := ni.MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	hash := strings.TrimPrefix(drvs["wanted"], nix.StoreDir+"/")[:32]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/" + hash + ".narinfo":
			w.Write(info)
		case "/" + ni.URL:
			w.Write(body)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()

	s := &Store{Root: t.TempDir(), Substituters: []string{srv.URL}, TrustedKeys: []string{key.Public().String()}}
	d, err := storeTestOpen(t, s).Derivation(storeTestCtx(t), drvs["wanted"])
	if err == nil || !strings.Contains(err.Error(), "another derivation's") {
		t.Fatalf("Derivation from a cache serving another derivation's text = %+v, %v; want refused", d, err)
	}
}
