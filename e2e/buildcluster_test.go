package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

// buildClusterOptions shape a build cluster.
type buildClusterOptions struct {
	// builders is the number of builder nodes b1…bN (each with its own chroot store).
	builders int
	// deferBuilders prepares the builders' stores but starts none: the test starts them with
	// startBuilder.
	deferBuilders bool
	// build holds [build] settings (without the table header), e.g. `timeout = "4s"`.
	build string
	// sandboxPaths are [build] extra_sandbox_paths.
	sandboxPaths []string
	// dbURL is the cluster's database; "" = a fresh database on the shared test server.
	dbURL string
	// deadThreshold replaces proctest.FastConfig's dead threshold (1s) if set.
	deadThreshold string
	// extraConfig is appended to the nodes' configuration (after every other table, so it may
	// hold [[forges]]).
	extraConfig string
	// frontendEnv is added to the environment of the nodes that run the frontend role (forge
	// secrets, the admin token).
	frontendEnv []string
	// backend is the cache's store: "s3" (MinIO, the default) or "local".
	backend string
	// nixRoot, if set, runs the nodes in inNixRoot there, on its Nix (2.26), and the others on
	// this machine's.
	nixRoot   *proctest.NixRoot
	inNixRoot []string
}

// buildCluster is a whole harmonia-ci cluster that builds with real Nix: front-1 (frontend,
// signer and an S3 cache on MinIO), eval-1 (evaluator) and builders b1…bN, each with a chroot
// store of its own; and one project whose ci.nix each test commits.
type buildCluster struct {
	*fixture
	nodeCfg  string   // the nodes' shared configuration
	env      []string // the nodes' environment (S3 credentials)
	pub      string   // the cluster's signing public key
	cacheURL string   // front-1's endpoint: the cache, the API
	stores   map[string]string
	stopped  map[string]bool // processes the test ended on purpose
	frontEnv []string        // added for frontend nodes
	cli      *ciCLI
	repo     *nixtest.Repo
	project  string
	// nixRoot and inNixRoot: as buildClusterOptions; rootBinds are what a node there needs.
	nixRoot   *proctest.NixRoot
	inNixRoot []string
	rootBinds []string
}

// newBuildCluster starts the cluster, waits until every node is active and adds the project
// (an empty repository: evaluate commits to it).
func newBuildCluster(t *testing.T, o buildClusterOptions) *buildCluster {
	t.Helper()
	requireNix(t)
	nixtest.RequireNix(t)
	dir := t.TempDir()
	base, env, pub := signerConfig(t, dir, "e2e-build-1", cmpOr(o.backend, "s3"))
	raw, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}
	paths := make([]string, len(o.sandboxPaths))
	for i, p := range o.sandboxPaths {
		paths[i] = strconv.Quote(p)
	}
	cfg := string(raw) + "[node]\nmax_jobs = 2\n" +
		"[queue]\npoll_interval = \"1s\"\nreap_interval = \"500ms\"\n" +
		"[eval]\npoll_interval = \"500ms\"\n" +
		"[build]\nextra_sandbox_paths = [" + strings.Join(paths, ", ") + "]\n" + o.build + "\n" + o.extraConfig + "\n"
	if o.deadThreshold != "" {
		const fast = `dead_threshold = "1s"`
		if !strings.Contains(cfg, fast) {
			t.Fatalf("no %s in the node configuration to replace:\n%s", fast, cfg)
		}
		cfg = strings.Replace(cfg, fast, fmt.Sprintf("dead_threshold = %q", o.deadThreshold), 1)
	}
	var f *fixture
	if o.dbURL == "" {
		f = newFixture(t, "")
	} else {
		f = newFixtureOn(t, o.dbURL, "")
	}
	c := &buildCluster{
		fixture: f, nodeCfg: proctest.WriteFile(t, "build-node.toml", cfg), env: env, pub: pub,
		stores: map[string]string{}, stopped: map[string]bool{}, project: "build", frontEnv: o.frontendEnv,
		nixRoot: o.nixRoot, inNixRoot: o.inNixRoot,
	}
	if c.nixRoot != nil {
		// The test's temporary directories (state, stores, configuration, the project) and the
		// database's socket directory.
		c.rootBinds = []string{filepath.Dir(t.TempDir()), dbSocketDir(t, f.dbURL)}
	}
	for i := 1; i <= o.builders; i++ {
		id := fmt.Sprintf("b%d", i)
		c.stores[id] = filepath.Join(t.TempDir(), "store")
		// After TempDir's own cleanup is registered, so it runs first: what a killed builder's
		// Nix left running in the store is gone before the store is removed.
		store := c.stores[id]
		t.Cleanup(func() { killStoreProcesses(t, store) })
	}
	c.startNode("front-1", "frontend,signer,cache")
	c.startNode("eval-1", "evaluator")
	var ids []string
	if !o.deferBuilders {
		for i := 1; i <= o.builders; i++ {
			id := fmt.Sprintf("b%d", i)
			c.startNode(id, "builder", "--nix-store", c.stores[id])
			ids = append(ids, id)
		}
	}
	for _, id := range append([]string{"front-1", "eval-1"}, ids...) {
		c.waitActive(id)
	}
	c.cacheURL = c.endpoint("front-1")
	c.cli = newCLI(t, f)
	c.repo = nixtest.NewRepo(t)
	c.cli.ok("project", "add", c.project, "--repo", c.repo.Dir)
	return c
}

// startNode runs `harmonia-ci serve` as node id with roles on the shared configuration.
func (c *buildCluster) startNode(id, roles string, extra ...string) *proctest.Proc {
	c.t.Helper()
	args := append([]string{"serve", "--config", c.nodeCfg, "--database-url", c.dbURL, "--node-id", id,
		"--roles", roles, "--listen", "127.0.0.1:0", "--state-dir", filepath.Join(stateDir(c.t), "state")}, extra...)
	env := c.env
	if slices.Contains(strings.Split(roles, ","), "frontend") {
		env = append(slices.Clone(env), c.frontEnv...)
	}
	var p *proctest.Proc
	if slices.Contains(c.inNixRoot, id) {
		p = c.nixRoot.Start(c.t, id, c.rootBinds, nodeEnv(c.t, env, id, roles), args...)
	} else {
		p = proctest.Start(c.t, id, nodeEnv(c.t, env, id, roles), args...)
	}
	c.procs[id] = p
	delete(c.stopped, id)
	return p
}

// startBuilder starts builder id on its store and waits until it is active.
func (c *buildCluster) startBuilder(id string) {
	c.t.Helper()
	c.startNode(id, "builder", "--nix-store", c.stores[id])
	c.waitActive(id)
}

func (c *buildCluster) waitActive(id string) {
	c.t.Helper()
	proctest.WaitFor(c.t, 30*time.Second, "node "+id+" active", func() bool {
		c.checkRunning()
		return c.nodeStatus(id) == status.NodeActive
	})
}

// kill9 kills node id with SIGKILL and waits for it to die.
func (c *buildCluster) kill9(id string) {
	c.t.Helper()
	c.stopped[id] = true
	c.procs[id].Signal(c.t, syscall.SIGKILL)
	c.procs[id].Wait(c.t, 10*time.Second)
}

// stop stops node id with SIGTERM and waits for it to exit 0.
func (c *buildCluster) stop(id string) {
	c.t.Helper()
	c.stopped[id] = true
	c.procs[id].Signal(c.t, syscall.SIGTERM)
	if code := c.procs[id].Wait(c.t, 30*time.Second); code != 0 {
		c.t.Fatalf("%s exited %d after SIGTERM\n%s", id, code, c.procs[id].Logs())
	}
}

// checkRunning fails the test if a node the test did not stop has exited.
func (c *buildCluster) checkRunning() {
	c.t.Helper()
	for id, p := range c.procs {
		if !c.stopped[id] && p.Exited() {
			c.t.Fatalf("%s exited:\n%s", id, p.Logs())
		}
	}
}

// evaluate commits ci.nix and evaluates it, waiting for the evaluation to succeed.
func (c *buildCluster) evaluate(ciNix string) evalJSON {
	c.t.Helper()
	c.repo.Commit("ci", map[string]string{"ci.nix": ciNix})
	var done evalJSON
	c.cli.json(&done, "eval", c.project, "--wait", "--json")
	if done.Status != status.EvalSucceeded {
		c.t.Fatalf("evaluation %d: %s (%s)", done.ID, done.Status, done.Error)
	}
	for _, a := range done.Attrs {
		if a.Error != "" || a.DrvPath == "" {
			c.t.Fatalf("evaluation %d: attribute %s: drv %q, error %q", done.ID, a.Attr, a.DrvPath, a.Error)
		}
	}
	return done
}

// drvOf is the .drv path of attribute attr in an evaluation.
func drvOf(t *testing.T, e evalJSON, attr string) string {
	t.Helper()
	for _, a := range e.Attrs {
		if a.Attr == attr {
			return a.DrvPath
		}
	}
	t.Fatalf("evaluation %d has no attribute %s", e.ID, attr)
	return ""
}

// jobRow is one build_jobs row.
type jobRow struct {
	ID                              int64
	DrvPath                         string
	Status                          status.JobStatus
	Attempt, RetryCount, Priority   int
	ClaimedBy, LogURL, ErrorMessage string
	ExitCode                        *int
	FinishedAt                      *time.Time
}

func (j jobRow) String() string {
	code := "-"
	if j.ExitCode != nil {
		code = strconv.Itoa(*j.ExitCode)
	}
	return fmt.Sprintf("job %d %s: %s attempt %d retries %d priority %d by %q, exit %s, log %q, error %q",
		j.ID, filepath.Base(j.DrvPath), j.Status, j.Attempt, j.RetryCount, j.Priority, j.ClaimedBy, code, j.LogURL, j.ErrorMessage)
}

const jobColumns = `j.id, j.drv_path, j.status, j.attempt, j.retry_count, j.priority, COALESCE(j.claimed_by, ''),
	COALESCE(j.log_url, ''), COALESCE(j.error_message, ''), j.exit_code, j.finished_at`

func (c *buildCluster) queryJobs(sql string, args ...any) []jobRow {
	c.t.Helper()
	rows, err := c.pool.Query(context.Background(), sql, args...)
	if err != nil {
		c.t.Fatal(err)
	}
	jobs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (jobRow, error) {
		var j jobRow
		err := r.Scan(&j.ID, &j.DrvPath, &j.Status, &j.Attempt, &j.RetryCount, &j.Priority, &j.ClaimedBy,
			&j.LogURL, &j.ErrorMessage, &j.ExitCode, &j.FinishedAt)
		return j, err
	})
	if err != nil {
		c.t.Fatal(err)
	}
	return jobs
}

// evalJobs are the jobs of an evaluation: of its attributes' derivations and their inputs.
func (c *buildCluster) evalJobs(evalID int64) []jobRow {
	c.t.Helper()
	return c.queryJobs(`
WITH RECURSIVE drvs AS (
    SELECT drv_path FROM eval_attrs WHERE eval_id = $1 AND drv_path IS NOT NULL
  UNION
    SELECT di.input_drv FROM derivation_inputs di JOIN drvs ON di.referrer = drvs.drv_path
)
SELECT `+jobColumns+` FROM build_jobs j JOIN drvs USING (drv_path) ORDER BY j.id`, evalID)
}

// job is the job of drvPath.
func (c *buildCluster) job(drvPath string) jobRow {
	c.t.Helper()
	jobs := c.queryJobs(`SELECT `+jobColumns+` FROM build_jobs j WHERE j.drv_path = $1`, drvPath)
	if len(jobs) != 1 {
		c.t.Fatalf("%d jobs for %s", len(jobs), drvPath)
	}
	return jobs[0]
}

// waitFinished waits until every job of the evaluation is finished and returns them.
func (c *buildCluster) waitFinished(evalID int64, timeout time.Duration) []jobRow {
	c.t.Helper()
	var jobs []jobRow
	var last string
	done := false
	defer func() {
		if !done {
			c.t.Logf("jobs of evaluation %d when the wait failed: %s", evalID, last)
		}
	}()
	proctest.WaitFor(c.t, timeout, fmt.Sprintf("every job of evaluation %d finished", evalID), func() bool {
		c.checkRunning()
		jobs = c.evalJobs(evalID)
		counts := map[status.JobStatus]int{}
		var open []string
		for _, j := range jobs {
			counts[j.Status]++
			if !j.Status.Terminal() && len(open) < 10 {
				open = append(open, j.String())
			}
		}
		last = fmt.Sprint(counts) + "\n" + strings.Join(open, "\n")
		return len(jobs) > 0 && !slices.ContainsFunc(jobs, func(j jobRow) bool { return !j.Status.Terminal() })
	})
	done = true
	return jobs
}

// waitJob waits until drvPath's job satisfies cond and returns it.
func (c *buildCluster) waitJob(drvPath string, timeout time.Duration, what string, cond func(jobRow) bool) jobRow {
	c.t.Helper()
	var j jobRow
	proctest.WaitFor(c.t, timeout, filepath.Base(drvPath)+": "+what, func() bool {
		c.checkRunning()
		j = c.job(drvPath)
		return cond(j)
	})
	return j
}

// outputPaths are the output paths of the jobs' derivations.
func (c *buildCluster) outputPaths(jobs []jobRow) []string {
	c.t.Helper()
	var drvs []string
	for _, j := range jobs {
		drvs = append(drvs, j.DrvPath)
	}
	rows, err := c.pool.Query(context.Background(),
		`SELECT output_path FROM derivation_outputs WHERE drv_path = ANY($1) AND output_path IS NOT NULL ORDER BY output_path`, drvs)
	if err != nil {
		c.t.Fatal(err)
	}
	paths, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		c.t.Fatal(err)
	}
	if len(paths) < len(jobs) {
		c.t.Fatalf("%d output paths for %d jobs", len(paths), len(jobs))
	}
	return paths
}

// canonicalHash is the NAR hash the cluster recorded for output path p.
func (c *buildCluster) canonicalHash(p string) string {
	c.t.Helper()
	var h string
	if err := c.pool.QueryRow(context.Background(),
		`SELECT nar_hash FROM derivation_outputs WHERE output_path = $1 AND nar_hash IS NOT NULL`, p).Scan(&h); err != nil {
		c.t.Fatalf("canonical NAR hash of %s: %v", p, err)
	}
	return h
}

// substitute realises paths in a fresh store from front-1's cache only, trusting key, with
// signatures required and building forbidden (max-jobs 0); it returns Nix's output and error.
func (c *buildCluster) substitute(key string, paths ...string) (string, error) {
	c.t.Helper()
	args := append([]string{"--store", c.t.TempDir(), "--realise"}, paths...)
	args = append(args, "--option", "substituters", c.cacheURL, "--option", "trusted-public-keys", key,
		"--option", "require-sigs", "true", "--option", "build-users-group", "", "--option", "max-jobs", "0",
		"--option", "narinfo-cache-negative-ttl", "0")
	cmd := exec.Command("nix-store", args...)
	// A fresh HOME: no narinfo disk cache from another run.
	cmd.Env = append(os.Environ(), "HOME="+c.t.TempDir())
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// checkSubstitutable fails unless a fresh store substitutes every path with the cluster's key.
func (c *buildCluster) checkSubstitutable(paths []string) {
	c.t.Helper()
	if out, err := c.substitute(c.pub, paths...); err != nil {
		c.t.Fatalf("a fresh store could not substitute the %d outputs from %s: %v\n%s", len(paths), c.cacheURL, err, lastLines(out, 30))
	}
}

// checkWrongKeyRefused fails if a store trusting another key substitutes p.
func (c *buildCluster) checkWrongKeyRefused(p string) {
	c.t.Helper()
	other, err := nix.GenerateKey("e2e-build-1")
	if err != nil {
		c.t.Fatal(err)
	}
	if out, err := c.substitute(other.Public().String(), p); err == nil {
		c.t.Fatalf("a store trusting another key substituted %s:\n%s", p, out)
	}
}

// fetchLog GETs a finished job's log from the cache (log_url is its attempt's own log,
// "log/<drv basename>.<attempt>").
func (c *buildCluster) fetchLog(j jobRow) string {
	c.t.Helper()
	if want := queue.AttemptLogKey(j.DrvPath, j.Attempt); j.LogURL != want {
		c.t.Fatalf("%s: log_url %q, want %q", j, j.LogURL, want)
	}
	return c.fetchLogAt(j.LogURL)
}

// fetchLogAt GETs the log at blob key key ("log/…") from the cache.
func (c *buildCluster) fetchLogAt(key string) string {
	c.t.Helper()
	resp, err := http.Get(c.cacheURL + "/" + key)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		c.t.Fatalf("GET %s/%s: %d %s", c.cacheURL, key, resp.StatusCode, body)
	}
	return string(body)
}

// checkLog fails unless the job's served log contains want.
func (c *buildCluster) checkLog(j jobRow, want string) {
	c.t.Helper()
	if log := c.fetchLog(j); !strings.Contains(log, want) {
		c.t.Fatalf("log of %s does not contain %q:\n%s", j, want, lastLines(log, 20))
	}
}

// tails is the number of rows in build_log_tails.
func (c *buildCluster) tails() int {
	c.t.Helper()
	var n int
	if err := c.pool.QueryRow(context.Background(), `SELECT count(*) FROM build_log_tails`).Scan(&n); err != nil {
		c.t.Fatal(err)
	}
	return n
}

// waitNoTails waits until every live log tail is gone. A builder deletes a job's tail just
// after recording its result, so a finished job may keep its tail a moment longer.
func (c *buildCluster) waitNoTails() {
	c.t.Helper()
	waittest.For(c.t, 20*time.Second, func() bool { return c.tails() == 0 }, "every live log tail deleted after the builds finished")
}

// killStoreProcesses kills every process working in the chroot store dir: a builder killed with
// SIGKILL leaves its Nix behind (in a process group of its own) and Nix its sandboxed builder.
// It waits until they are gone.
func killStoreProcesses(t *testing.T, dir string) {
	t.Helper()
	proctest.WaitFor(t, 10*time.Second, "processes in "+dir+" gone", func() bool {
		pids := storeProcesses(dir)
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		return len(pids) == 0
	})
}

// storeProcesses are the processes whose command line names dir, or whose working or root
// directory is inside it.
func storeProcesses(dir string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		p := filepath.Join("/proc", e.Name())
		cmdline, _ := os.ReadFile(filepath.Join(p, "cmdline"))
		match := bytes.Contains(cmdline, []byte(dir))
		for _, link := range []string{"cwd", "root"} {
			if target, err := os.Readlink(filepath.Join(p, link)); err == nil && (target == dir || strings.HasPrefix(target, dir+"/")) {
				match = true
			}
		}
		if match {
			pids = append(pids, pid)
		}
	}
	return pids
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// shLib is a Nix prelude defining sh: sh NAME DEPS SCRIPT is a derivation that runs SCRIPT (a
// /bin/sh script; it may write $out itself) and then appends its name and its dependencies'
// outputs to $out. salt changes every derivation's hash.
func shLib(salt string) string {
	return `let
  sh = name: deps: script: builtins.derivation {
    inherit name;
    system = builtins.currentSystem;
    builder = "/bin/sh";
    salt = "` + salt + `";
    args = [ "-c" (script + "\necho ${name} >> $out; ${builtins.concatStringsSep ""
      (map (d: "while IFS= read -r l; do echo \"$l\" >> $out; done < ${d};") deps)}") ];
  };
in`
}

// uniqueSalt makes a salt no other run of the test shares.
func uniqueSalt(t *testing.T) string {
	return fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())
}

// drvName is the derivation name of a .drv path: "/nix/store/<hash>-d5.drv" is "d5".
func drvName(drvPath string) string {
	base := strings.TrimSuffix(filepath.Base(drvPath), ".drv")
	if len(base) > 33 {
		return base[33:]
	}
	return base
}

// narHashBase32 is path's NAR hash in the chroot store, as "sha256:<nix32>" (the cluster's
// format), from `nix path-info --json`.
func narHashBase32(t *testing.T, store, path string) string {
	t.Helper()
	return nixtest.PathInfos(t, nil, "--store", store, path)[path].NarHash
}

// sseEvent is one Server-Sent Event.
type sseEvent struct {
	ID    int64
	Event string
	Data  string // data lines joined with "\n"
}

// logStream is an open GET /api/builds/{id}/log event stream.
type logStream struct {
	body   io.ReadCloser
	r      *bufio.Reader
	cancel context.CancelFunc
}

// openLogStream opens the stream at url, with Last-Event-ID lastID unless "", and checks that
// it is one.
func openLogStream(t *testing.T, url, lastID string) *logStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		t.Fatalf("GET %s: %d %s %s", url, resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	return &logStream{body: resp.Body, r: bufio.NewReader(resp.Body), cancel: cancel}
}

func (s *logStream) close() {
	s.cancel()
	s.body.Close()
}

// next reads the next event (of type want, unless ""; others are skipped). Comments
// (keep-alives) are skipped.
func (s *logStream) next(t *testing.T, want string) sseEvent {
	t.Helper()
	for {
		var ev sseEvent
		var data []string
		seen := false
		for {
			line, err := s.r.ReadString('\n')
			if err != nil {
				t.Fatalf("read the log stream: %v (partial event %+v)", err, ev)
			}
			line = strings.TrimSuffix(line, "\n")
			if line == "" {
				if seen {
					break
				}
				continue
			}
			if strings.HasPrefix(line, ":") {
				continue
			}
			seen = true
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "id":
				id, err := strconv.ParseInt(value, 10, 64)
				if err != nil {
					t.Fatalf("event id %q", value)
				}
				ev.ID = id
			case "event":
				ev.Event = value
			case "data":
				data = append(data, value)
			}
		}
		ev.Data = strings.Join(data, "\n")
		if want == "" || ev.Event == want {
			return ev
		}
	}
}

var lineRE = regexp.MustCompile(`line (\d+)`)

// lastLineNumber is the highest N of the "line N" lines in s, -1 if none.
func lastLineNumber(s string) int {
	n := -1
	for _, m := range lineRE.FindAllStringSubmatch(s, -1) {
		if v, err := strconv.Atoi(m[1]); err == nil && v > n {
			n = v
		}
	}
	return n
}

// fetchRaces: a builder's two job slots run Nix at once on one chroot store, and Nix 2.8 is not
// safe there. Two `nix copy --derivation` of closures sharing a path sometimes fail with "not an
// absolute path: 'nix-archive-1'" (NixOS/nix#6253), and on a fresh store two first commands race
// creating it ("creating symlink ... gcroots/profiles ...: File exists", or the builder reading a
// db.sqlite that has no tables yet). Each fails the job's "fetch derivation" step, before any
// build, as a transient failure: the job is retried. The tests accept such retries and log them.
const fetchRaces = "fetch derivation"

// buildFailures are the "build failed" lines the builders logged for job id.
func (c *buildCluster) buildFailures(id int64) []string {
	var lines []string
	tag := fmt.Sprintf(" job_id=%d ", id)
	for name, p := range c.procs {
		if _, builder := c.stores[name]; !builder {
			continue
		}
		for line := range strings.SplitSeq(p.Logs(), "\n") {
			if strings.Contains(line, `msg="build failed"`) && strings.Contains(line, tag) {
				lines = append(lines, name+": "+line)
			}
		}
	}
	return lines
}
