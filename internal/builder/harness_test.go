package builder_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/builder"
	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/logtest"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/signertest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

// jobWait bounds every wait for a job's status: generous, since the package's tests build in
// parallel on a small machine.
const jobWait = 45 * time.Second

// harness is one test's cluster: a fresh database, an in-process signer and cache, and an
// evaluator's chroot store (src) where derivations are instantiated and from which their .drv
// closures are published, as the evaluator does. Builders are started on it with startBuilder.
type harness struct {
	t       *testing.T
	pool    *pgxpool.Pool
	cluster *signertest.Cluster
	src     string
	system  string
	salt    string
	logs    *logtest.Buffer
	logger  *slog.Logger

	mu      sync.Mutex
	results []handled
}

// handled is one Handle call's result, as the worker got it.
type handled struct {
	job queue.Job
	res queue.Result
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	nixtest.RequireNix(t)
	pool := dbtest.NewPool(t)
	h := &harness{
		t:       t,
		pool:    pool,
		cluster: signertest.Start(t, pool, signertest.Options{KeyName: "builder-test-1"}),
		src:     t.TempDir(),
		system:  currentSystem(t),
		salt:    fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano()),
		logs:    &logtest.Buffer{},
	}
	h.logger = slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("builder and worker logs:\n%s", h.logs.String())
		}
	})
	return h
}

var systemOnce = sync.OnceValues(func() (string, error) {
	out, err := exec.Command("nix-instantiate", "--eval", "--json", "--expr", "builtins.currentSystem").Output()
	return strings.Trim(strings.TrimSpace(string(out)), `"`), err
})

func currentSystem(t *testing.T) string {
	t.Helper()
	s, err := systemOnce()
	if err != nil || s == "" {
		t.Fatalf("nix-instantiate builtins.currentSystem: %q, %v", s, err)
	}
	return s
}

// nixRun runs a Nix command with a fresh HOME (no narinfo disk cache, no user configuration)
// and returns its trimmed standard output.
func nixRun(t *testing.T, name string, args ...string) string {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// sandboxOptions are the options of a sandboxed build in a chroot store, as builder.Store builds.
func sandboxOptions() []string {
	return []string{"--option", "build-users-group", "", "--option", "substituters", "",
		"--option", "sandbox", "true", "--option", "sandbox-paths", strings.Join(nix.SandboxPaths(nil), " ")}
}

// instantiate writes expr (an attribute set of derivations) and instantiates attrs into the
// store at root; it returns attr → .drv path.
func instantiate(t *testing.T, root, expr string, attrs ...string) map[string]string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "default.nix")
	if err := os.WriteFile(file, []byte(expr), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{file, "--store", root, "--option", "substituters", ""}
	for _, a := range attrs {
		args = append(args, "-A", a)
	}
	lines := strings.Fields(nixRun(t, "nix-instantiate", args...))
	if len(lines) != len(attrs) {
		t.Fatalf("nix-instantiate of %v printed %v", attrs, lines)
	}
	drvs := map[string]string{}
	for i, a := range attrs {
		drvs[a], _, _ = strings.Cut(lines[i], "!") // "x.drv!dev" names an output of x.drv
	}
	return drvs
}

// instantiate instantiates attrs of expr into the evaluator's store.
func (h *harness) instantiate(expr string, attrs ...string) map[string]string {
	h.t.Helper()
	return instantiate(h.t, h.src, expr, attrs...)
}

// ctx is a context for one step of the test.
func (h *harness) ctx() context.Context { return queuetest.Ctx(h.t, time.Minute) }

// publishDrvs publishes the .drv closures of drvs to the cache, as the evaluator does before it
// enqueues: builders fetch their derivations from there.
func (h *harness) publishDrvs(drvs ...string) {
	h.t.Helper()
	closure := strings.Fields(nixRun(h.t, "nix-store", append([]string{"--store", h.src, "--query", "--requisites"}, drvs...)...))
	infos := pathInfos(h.t, h.src, closure)
	paths := make([]signertest.SeedPath, len(closure))
	for i, p := range closure {
		info, ok := infos[p]
		if !ok {
			h.t.Fatalf("publish: %s is not valid in the evaluator's store", p)
		}
		paths[i] = signertest.SeedPath{StorePath: p, References: info.References}
	}
	h.cluster.Seed(h.t, h.src, paths...)
}

// derivation describes drv (in the evaluator's store) for the queue.
func (h *harness) derivation(drv string) queue.Derivation {
	h.t.Helper()
	d, err := nix.ReadDerivation(h.src, drv)
	if err != nil {
		h.t.Fatal(err)
	}
	narHash, narSize, err := nix.HashNAR(filepath.Join(h.src, drv))
	if err != nil {
		h.t.Fatal(err)
	}
	q := queue.Derivation{DrvPath: drv, Name: d.Name(), System: d.Platform, NarHash: narHash, NarSize: narSize, InputSrcs: d.InputSrcs}
	for _, name := range d.OutputNames() {
		q.Outputs = append(q.Outputs, queue.Output{Name: name, Path: d.Outputs[name].Path})
	}
	for _, in := range slices.Sorted(maps.Keys(d.InputDrvs)) {
		q.Inputs = append(q.Inputs, queue.Input{DrvPath: in, Outputs: d.InputDrvs[in]})
	}
	return q
}

// enqueue publishes the .drv closures of drvs and enqueues a job for each, as an evaluation
// does.
func (h *harness) enqueue(drvs ...string) {
	h.t.Helper()
	h.publishDrvs(drvs...)
	ds := make([]queue.Derivation, len(drvs))
	for i, drv := range drvs {
		ds[i] = h.derivation(drv)
	}
	if _, err := queue.Enqueue(h.ctx(), h.pool, queue.EnqueueParams{Derivations: ds}); err != nil {
		h.t.Fatalf("enqueue: %v", err)
	}
}

// outputs returns drv's outputs (name → path).
func (h *harness) outputs(drv string) map[string]string {
	h.t.Helper()
	d, err := nix.ReadDerivation(h.src, drv)
	if err != nil {
		h.t.Fatal(err)
	}
	outs := map[string]string{}
	for name, o := range d.Outputs {
		outs[name] = o.Path
	}
	return outs
}

// builderNode is a running builder: its Builder and worker, on a chroot store of its own.
type builderNode struct {
	id      string
	store   string // the chroot store's directory
	builder *builder.Builder
	stop    func()
}

// startBuilder registers node id and runs a Builder with cfg (NodeID, Signer, a fresh chroot
// store and short intervals filled in) and a worker with two slots, stopped at the end of the
// test or by stop.
func (h *harness) startBuilder(id string, cfg builder.Config) *builderNode {
	h.t.Helper()
	return h.startBuilderWith(id, cfg, nil)
}

// startBuilderWith is startBuilder calling setup, if set, on the Builder before it starts.
func (h *harness) startBuilderWith(id string, cfg builder.Config, setup func(*builder.Builder)) *builderNode {
	h.t.Helper()
	queuetest.InsertNode(h.t, h.pool, queuetest.Node{ID: id, Systems: []string{h.system}})
	cfg.NodeID, cfg.Signer = id, h.cluster.Client(h.t, id, "builder")
	if cfg.Store.Root == "" {
		cfg.Store.Root = h.t.TempDir()
	}
	if cfg.TailInterval == 0 {
		cfg.TailInterval = 50 * time.Millisecond
	}
	if cfg.RetryPause == 0 {
		cfg.RetryPause = 20 * time.Millisecond
	}
	if cfg.CheckInterval == 0 {
		cfg.CheckInterval = 200 * time.Millisecond
	}
	b, err := builder.New(cfg, h.pool, h.logger, clock.Real{})
	if err != nil {
		h.t.Fatal(err)
	}
	if setup != nil {
		setup(b)
	}
	if err := b.Start(context.Background()); err != nil {
		h.t.Fatal(err)
	}
	record := func(job queue.Job, res queue.Result) queue.Result {
		h.mu.Lock()
		h.results = append(h.results, handled{job: job, res: res})
		h.mu.Unlock()
		return res
	}
	handler := func(ctx context.Context, job queue.Job) queue.Result {
		res := b.Handle(ctx, job)
		if next := res.Continue; next != nil {
			// The job's result is its continuation's (the upload's).
			return queue.Result{Continue: func(ctx context.Context) queue.Result { return record(job, next(ctx)) }}
		}
		return record(job, res)
	}
	w, err := queue.NewWorker(queue.WorkerConfig{
		Claimer:      queue.Claimer{NodeID: id, Systems: []string{h.system}},
		MaxJobs:      2,
		PollInterval: 100 * time.Millisecond,
		Handler:      handler,
	}, h.pool, h.logger, clock.Real{})
	if err != nil {
		h.t.Fatal(err)
	}
	if err := w.Start(context.Background()); err != nil {
		b.Stop()
		h.t.Fatal(err)
	}
	// The worker first: its handlers end, and their claims are released, before the checks do.
	stop := func() { w.Stop(); b.Stop() }
	h.t.Cleanup(stop)
	return &builderNode{id: id, store: cfg.Store.Root, builder: b, stop: stop}
}

// handledResults returns the results of the Handle calls for jobID so far.
func (h *harness) handledResults(jobID int64) []queue.Result {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []queue.Result
	for _, r := range h.results {
		if r.job.ID == jobID {
			out = append(out, r.res)
		}
	}
	return out
}

// jobRow is a build job as users see it.
type jobRow struct {
	ID           int64
	DrvPath      string
	Status       status.JobStatus
	Attempt      int
	RetryCount   int
	ExitCode     *int
	ErrorMessage *string
	LogURL       *string
}

func (j jobRow) String() string {
	s := func(p *string) string {
		if p == nil {
			return "<nil>"
		}
		return fmt.Sprintf("%q", *p)
	}
	code := "<nil>"
	if j.ExitCode != nil {
		code = fmt.Sprint(*j.ExitCode)
	}
	return fmt.Sprintf("job %d %s status=%s attempt=%d retries=%d exit_code=%s error_message=%s log_url=%s",
		j.ID, path.Base(j.DrvPath), j.Status, j.Attempt, j.RetryCount, code, s(j.ErrorMessage), s(j.LogURL))
}

func (h *harness) job(drv string) jobRow {
	h.t.Helper()
	var j jobRow
	err := h.pool.QueryRow(context.Background(), `
SELECT id, drv_path, status, attempt, retry_count, exit_code, error_message, log_url
FROM build_jobs WHERE drv_path = $1`, drv).
		Scan(&j.ID, &j.DrvPath, &j.Status, &j.Attempt, &j.RetryCount, &j.ExitCode, &j.ErrorMessage, &j.LogURL)
	if err != nil {
		h.t.Fatalf("read the job of %s: %v", drv, err)
	}
	return j
}

// waitJob waits until drv's job satisfies cond and returns it.
func (h *harness) waitJob(drv, what string, cond func(jobRow) bool) jobRow {
	h.t.Helper()
	var j jobRow
	waittest.For(h.t, jobWait, func() bool {
		j = h.job(drv)
		return cond(j)
	}, "%s: %s (last seen: %v)", path.Base(drv), what, &j)
	return j
}

// waitStatus waits until drv's job is in status want; a job that ends in another status fails
// the test at once.
func (h *harness) waitStatus(drv string, want status.JobStatus) jobRow {
	h.t.Helper()
	j := h.waitJob(drv, "status "+string(want), func(j jobRow) bool {
		return j.Status == want || j.Status.Terminal()
	})
	if j.Status != want {
		h.t.Fatalf("%v, want status %s", j, want)
	}
	return j
}

// tail returns job jobID's live log tail; ok is false when it has none.
func (h *harness) tail(jobID int64) (tail string, ok bool) {
	h.t.Helper()
	var b []byte
	err := h.pool.QueryRow(context.Background(), `SELECT log_tail FROM build_log_tails WHERE build_job_id = $1`, jobID).Scan(&b)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false
	}
	if err != nil {
		h.t.Fatalf("read the log tail of job %d: %v", jobID, err)
	}
	return string(b), true
}

// get fetches a path of the cache.
func (h *harness) get(p string) (int, string) {
	h.t.Helper()
	resp, err := http.Get(h.cluster.URL + "/" + p)
	if err != nil {
		h.t.Fatalf("GET %s: %v", p, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatalf("GET %s: %v", p, err)
	}
	return resp.StatusCode, string(body)
}

// buildLog fetches drv's build log from the cache, failing the test unless it is served.
func (h *harness) buildLog(drv string) string {
	h.t.Helper()
	return h.buildLogAt("log/" + path.Base(drv))
}

// buildLogAt fetches the log at blob key key ("log/…") from the cache, failing the test
// unless it is served.
func (h *harness) buildLogAt(key string) string {
	h.t.Helper()
	code, body := h.get(key)
	if code != http.StatusOK {
		h.t.Fatalf("GET /%s: %d %s", key, code, body)
	}
	return body
}

// attempts lists job id's recorded attempts as "<attempt> <node> <status> <log key>".
func (h *harness) attempts(id int64) []string {
	h.t.Helper()
	rows, err := h.pool.Query(context.Background(), `
SELECT attempt || ' ' || COALESCE(node, '') || ' ' || status || ' ' || COALESCE(log_key, '')
FROM build_attempts WHERE job_id = $1 ORDER BY attempt`, id)
	if err != nil {
		h.t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		h.t.Fatal(err)
	}
	return got
}

// narInfo fetches the narinfo of a store path: its status and body.
func (h *harness) narInfo(storePath string) (int, string) {
	h.t.Helper()
	sp, err := nix.ParseStorePath(storePath)
	if err != nil {
		h.t.Fatal(err)
	}
	return h.get(sp.Hash + ".narinfo")
}

// canonicalHashes reads derivation_outputs.nar_hash of drv's outputs (name → hash, "" for NULL).
func (h *harness) canonicalHashes(drv string) map[string]string {
	h.t.Helper()
	rows, err := h.pool.Query(context.Background(),
		`SELECT output_name, COALESCE(nar_hash, '') FROM derivation_outputs WHERE drv_path = $1`, drv)
	if err != nil {
		h.t.Fatal(err)
	}
	m := map[string]string{}
	var name, hash string
	if _, err := pgx.ForEachRow(rows, []any{&name, &hash}, func() error {
		m[name] = hash
		return nil
	}); err != nil {
		h.t.Fatal(err)
	}
	return m
}

// pathInfos reads the valid paths among paths from the store at root.
func pathInfos(t *testing.T, root string, paths []string) map[string]nix.PathInfo {
	t.Helper()
	db, err := nix.OpenStoreDB(root)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]nix.PathInfo{}
	}
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	infos, err := db.PathInfos(context.Background(), paths)
	if err != nil {
		t.Fatal(err)
	}
	return infos
}

// processesWith returns the pids of processes whose command line contains s.
func processesWith(s string) []string {
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
