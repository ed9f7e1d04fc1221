package eval_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/eval"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
	"github.com/harmonia-ci/harmonia-ci/internal/signerclient"
	"github.com/harmonia-ci/harmonia-ci/internal/signertest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/upload"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

const (
	// finishTimeout bounds the wait for one evaluation; they take well under a second alone,
	// a few seconds with every test of the package running in parallel.
	finishTimeout = 45 * time.Second
)

// harness is one test's cluster in a process: a fresh database, a signer and a binary cache
// over a local blob store on one HTTP server (registered as a live signer node), and the
// signer client and publisher an evaluator uses. Evaluators are started with startEvaluator.
type harness struct {
	t          *testing.T
	pool       *pgxpool.Pool
	logger     *slog.Logger
	salt       string // makes this test's derivations its own in the shared /nix/store
	cacheURL   string
	publicKey  string // the signer's key, in trusted-public-keys form
	cluster    *signertest.Cluster
	client     *signerclient.Client // authenticates as node "ev-test" (cache lookups)
	triggerDir string               // Trigger's mirrors, apart from the evaluators' state directories
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	nixtest.RequireNix(t)
	pool := dbtest.NewPool(t)
	logger := testLogger(t)
	c := signertest.Start(t, pool, signertest.Options{KeyName: "eval-test-1"})
	h := &harness{t: t, pool: pool, logger: logger, salt: salt(t), cacheURL: c.URL, cluster: c,
		publicKey: c.PublicKey(), triggerDir: t.TempDir(), client: c.Client(t, "ev-test", "evaluator")}
	return h
}

// testLogger writes warnings and errors to the test's output; HCI_TEST_LOG=debug shows all.
func testLogger(t *testing.T) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("HCI_TEST_LOG") == "debug" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: level}))
}

// salt is unique per test run: derivations of different tests, and of earlier runs, never
// share a store path.
func salt(t *testing.T) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, t.Name())
	return name + "-" + hex.EncodeToString(b[:])
}

// sub is the harness for a subtest of its test.
func (h *harness) sub(t *testing.T) *harness {
	c := *h
	c.t = t
	return &c
}

// lib is nixtest.Lib with this test's salt: a prelude defining mk and fail.
func (h *harness) lib() string { return nixtest.Lib(h.salt) }

// evalConfig is the configuration startEvaluator starts from: fast polling and batching, and
// the confinement of a real node (the evaluation user scripts/deps.sh creates) in a state
// directory that user can reach.
func (h *harness) evalConfig(nodeID string) eval.Config {
	client := h.cluster.Client(h.t, nodeID, "evaluator")
	return eval.Config{
		NodeID: nodeID, StateDir: reachableDir(h.t), Cache: client, Publisher: &upload.Publisher{Signer: client},
		PollInterval: 100 * time.Millisecond, StatusInterval: 100 * time.Millisecond, BatchWait: 200 * time.Millisecond,
		Confinement: eval.Confinement{User: "harmonia-eval", MaxMemory: 2 << 30},
	}
}

// reachableDir is a temporary directory other users may traverse to (its parent is the test's
// private temporary directory), as a state directory must be for the evaluation user.
func reachableDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startEvaluator starts an evaluator on evalConfig(nodeID) changed by opts, stopped at the
// end of the test.
func (h *harness) startEvaluator(nodeID string, opts ...func(*eval.Config)) *eval.Evaluator {
	h.t.Helper()
	cfg := h.evalConfig(nodeID)
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.Runner == nil {
		cfg.Runner = &eval.NixRunner{}
	}
	// Gates are read through the search path: restricted evaluation reads nothing else.
	cfg.Runner.SearchPath = append(cfg.Runner.SearchPath, "hci-test-gates="+gateDir(h.t))
	ev, err := eval.New(cfg, h.pool, h.logger, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := ev.Start(context.Background()); err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(ev.Stop)
	return ev
}

// newProject creates a repository with files on main and a project of it; it returns the
// repository and the commit.
func (h *harness) newProject(name string, files map[string]string) (*nixtest.Repo, string) {
	h.t.Helper()
	repo := nixtest.NewRepo(h.t)
	commit := repo.Commit("init", files)
	if _, err := project.Add(h.ctx(), h.pool, project.AddParams{Name: name, RepoURL: repo.Dir}); err != nil {
		h.t.Fatal(err)
	}
	return repo, commit
}

// trigger requests the evaluation of commit on branch ("" for the defaults).
func (h *harness) trigger(proj, branch, commit string) (evaluation.Evaluation, bool) {
	h.t.Helper()
	e, created, err := eval.Trigger(h.ctx(), h.pool, eval.TriggerParams{Project: proj, Branch: branch, Commit: commit, StateDir: h.triggerDir})
	if err != nil {
		h.t.Fatalf("trigger %s %s@%s: %v", proj, branch, commit, err)
	}
	return e, created
}

func (h *harness) get(id int64) evaluation.Evaluation {
	h.t.Helper()
	e, err := evaluation.Get(h.ctx(), h.pool, id)
	if err != nil {
		h.t.Fatal(err)
	}
	return e
}

// waitStatus waits until evaluation id has status want (polling, with a deadline) and fails
// early if it finishes otherwise.
func (h *harness) waitStatus(id int64, want status.EvalStatus) evaluation.Evaluation {
	h.t.Helper()
	var e evaluation.Evaluation
	waittest.For(h.t, finishTimeout, func() bool {
		e = h.get(id)
		if e.Finished() && e.Status != want {
			h.t.Fatalf("evaluation %d finished %s (error %q), want %s", id, e.Status, e.Error, want)
		}
		return e.Status == want
	}, "evaluation %d to be %s", id, want)
	return e
}

func (h *harness) waitSucceeded(id int64) evaluation.Evaluation {
	h.t.Helper()
	return h.waitStatus(id, status.EvalSucceeded)
}

// attrs returns an evaluation's attributes by name.
func (h *harness) attrs(id int64) map[string]evaluation.AttrResult {
	h.t.Helper()
	as, err := evaluation.Attrs(h.ctx(), h.pool, id)
	if err != nil {
		h.t.Fatal(err)
	}
	m := map[string]evaluation.AttrResult{}
	for _, a := range as {
		m[a.Attr] = a
	}
	return m
}

// attrNames is the sorted names of an evaluation's attributes.
// evaluateOnce evaluates ci.nix (the harness's lib, then expr) as a new project name, waits
// for the evaluation to succeed and returns its attributes, which must be want of them.
func (h *harness) evaluateOnce(name, expr string, want int) map[string]evaluation.AttrResult {
	h.t.Helper()
	_, commit := h.newProject(name, map[string]string{"ci.nix": h.lib() + expr})
	e, _ := h.trigger(name, "", commit)
	h.waitSucceeded(e.ID)
	attrs := h.attrs(e.ID)
	if len(attrs) != want {
		h.t.Fatalf("attributes %+v, want %d of them", attrs, want)
	}
	return attrs
}

func (h *harness) attrNames(id int64) []string {
	h.t.Helper()
	return slices.Sorted(maps.Keys(h.attrs(id)))
}

// waitAttrs waits until evaluation id has at least n attributes recorded.
func (h *harness) waitAttrs(id int64, n int) {
	h.t.Helper()
	waittest.For(h.t, finishTimeout, func() bool {
		if e := h.get(id); e.Finished() {
			h.t.Fatalf("evaluation %d finished %s (error %q) before %d attributes were recorded", id, e.Status, e.Error, n)
		}
		return h.queryInt(`SELECT count(*) FROM eval_attrs WHERE eval_id = $1`, id) >= int64(n)
	}, "evaluation %d to record %d attributes", id, n)
}

// jobStatus is the status of the build job of drv, "" when it has none.
func (h *harness) jobStatus(drv string) status.JobStatus {
	h.t.Helper()
	var s status.JobStatus
	err := h.pool.QueryRow(h.ctx(), `SELECT status FROM build_jobs WHERE drv_path = $1`, drv).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	if err != nil {
		h.t.Fatal(err)
	}
	return s
}

func (h *harness) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	h.t.Cleanup(cancel)
	return ctx
}

func (h *harness) exec(sql string, args ...any) int64 {
	h.t.Helper()
	tag, err := h.pool.Exec(h.ctx(), sql, args...)
	if err != nil {
		h.t.Fatalf("exec %q: %v", sql, err)
	}
	return tag.RowsAffected()
}

func (h *harness) queryInt(sql string, args ...any) int64 {
	h.t.Helper()
	var n int64
	if err := h.pool.QueryRow(h.ctx(), sql, args...).Scan(&n); err != nil {
		h.t.Fatalf("query %q: %v", sql, err)
	}
	return n
}

func (h *harness) queryStrings(sql string, args ...any) []string {
	h.t.Helper()
	rows, err := h.pool.Query(h.ctx(), sql, args...)
	if err != nil {
		h.t.Fatalf("query %q: %v", sql, err)
	}
	s, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		h.t.Fatalf("query %q: %v", sql, err)
	}
	return s
}

// sorted returns s sorted, in Go's order (not the database's collation).
func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// ---- Nix ----

// nixOptions keep every Nix call offline and working as root without build users.
var nixOptions = []string{"--option", "substituters", "", "--option", "build-users-group", ""}

// runNix runs a Nix command with nixOptions and returns its trimmed standard output.
func runNix(t *testing.T, bin string, args ...string) string {
	t.Helper()
	return runNixEnv(t, nil, bin, args...)
}

// runNixEnv is runNix with env added to the environment.
func runNixEnv(t *testing.T, env []string, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, append(args, nixOptions...)...)
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// drvClosure is the derivations in the closure of drvs, by Nix.
func drvClosure(t *testing.T, drvs ...string) []string {
	t.Helper()
	var out []string
	for _, p := range strings.Fields(runNix(t, "nix-store", append([]string{"-q", "--requisites"}, drvs...)...)) {
		if strings.HasSuffix(p, ".drv") {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// nixSystem is the Nix system of this machine, spelled out for flakes (which have no
// builtins.currentSystem).
func nixSystem(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("uname", "-m").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out)) + "-linux"
}

// gate is a FIFO a Nix expression reads (as <hci-test-gates/NAME>, the search path entry every
// test evaluator has): its evaluation blocks, using no CPU, until the test opens the gate (or
// kills Nix).
type gate struct{ path, name string }

var (
	gateDirOnce sync.Once
	gateDirPath string
)

// gateDir is where this test binary's gates live: a directory the evaluation user can read.
func gateDir(t *testing.T) string {
	gateDirOnce.Do(func() {
		d, err := os.MkdirTemp("", "hci-eval-gates-")
		if err == nil {
			err = os.Chmod(d, 0o711)
		}
		if err != nil {
			t.Fatal(err)
		}
		gateDirPath = d
	})
	return gateDirPath
}

func newGate(t *testing.T) *gate {
	t.Helper()
	name := "gate-" + salt(t)
	p := filepath.Join(gateDir(t), name)
	if err := syscall.Mkfifo(p, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o666); err != nil { // past the umask: the evaluation user reads it
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(p) })
	return &gate{path: p, name: name}
}

// expr is a Nix expression that reads the gate, blocking until it opens.
func (g *gate) expr() string { return fmt.Sprintf("builtins.readFile <hci-test-gates/%s>", g.name) }

// drv is a derivation whose evaluation (its drvPath) blocks on the gate; its name and salt
// come from the caller.
func (g *gate) drv(name, salt string) string {
	return fmt.Sprintf(`builtins.derivation { name = %q; system = builtins.currentSystem; builder = "/bin/sh";
    args = [ "-c" "echo > $out" ]; salt = %q; gate = %s; }`, name, salt, g.expr())
}

// open lets the reader through once it waits: one byte, then end of file. Nix 2.26 reads as
// many bytes as the file's size, none for a FIFO: its reader is through as soon as a writer
// opens, and may be gone before the write, which then fails with EPIPE.
func (g *gate) open(t *testing.T) {
	t.Helper()
	// A non-blocking open for writing fails (ENXIO) until a reader has the FIFO open.
	waittest.For(t, finishTimeout, func() bool {
		fd, err := syscall.Open(g.path, syscall.O_WRONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
		if errors.Is(err, syscall.ENXIO) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		defer syscall.Close(fd)
		if _, err := syscall.Write(fd, []byte("x")); err != nil && !errors.Is(err, syscall.EPIPE) {
			t.Fatal(err)
		}
		return true
	}, "a reader of %s", g.path)
}

// pids records the Nix children an evaluator's runner started (eval.NixRunner.OnStart).
type pids struct {
	mu   sync.Mutex
	list []int
}

func (p *pids) onStart(pid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.list = append(p.list, pid)
}

// alive lists the recorded children still running.
func (p *pids) alive() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []int
	for _, pid := range p.list {
		if nixAlive(pid) {
			out = append(out, pid)
		}
	}
	return out
}

func (p *pids) last() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.list) == 0 {
		return 0
	}
	return p.list[len(p.list)-1]
}

// nixAlive reports whether pid is still a running (not reaped) nix-instantiate.
func nixAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(b), "nix-instantiate")
}

// waitNixGone waits until the Nix child pid has exited and been reaped.
func waitNixGone(t *testing.T, pid int) {
	t.Helper()
	if pid == 0 {
		t.Fatal("no Nix child was started")
	}
	waittest.For(t, 10*time.Second, func() bool { return !nixAlive(pid) }, "nix-instantiate %d to exit", pid)
}

// narInfo fetches the cache's narinfo of store path p.
func (h *harness) narInfo(p string) *nix.NarInfo {
	h.t.Helper()
	sp, err := nix.ParseStorePath(p)
	if err != nil {
		h.t.Fatal(err)
	}
	resp, err := http.Get(h.cacheURL + "/" + sp.Hash + ".narinfo")
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		h.t.Fatalf("narinfo of %s: %s %v", p, resp.Status, err)
	}
	ni, err := nix.ParseNarInfo(data)
	if err != nil {
		h.t.Fatal(err)
	}
	return ni
}
