package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// flakyDrv is a derivation whose first build fails and whose later builds succeed: the first
// leaves a marker in dir, a directory outside the sandbox (among the builder's sandbox paths)
// that the test owns. Nothing of the derivation changes between the two.
func flakyDrv(name, salt, dir string) string {
	marker := filepath.Join(dir, name)
	return fmt.Sprintf(`builtins.derivation {
    name = %q; system = builtins.currentSystem; builder = "/bin/sh"; salt = %q;
    args = [ "-c" "if [ -e %s ]; then echo %s built on the retry; echo ok > $out; else : > %s; echo %s fails this time >&2; exit 1; fi" ];
  }`, name, salt, marker, name, marker, name)
}

// TestFlakyBuildRetried: with `[retry] attempts = 2` a build that fails once and then succeeds
// (with no change to its derivation) ends succeeded and flaky, both attempts' logs served, and
// its evaluation green; without the policy the same kind of failure fails the build, red. A
// failure older than the project's failure-expiry is built again by the next evaluation that
// needs it, and a younger one is not.
func TestFlakyBuildRetried(t *testing.T) {
	dir := markerDir(t)
	c := newBuildCluster(t, buildClusterOptions{builders: 1, sandboxPaths: []string{dir}})
	salt := uniqueSalt(t)
	ciNix := func(round int, attrs string) string {
		return nixtest.Lib(salt) + fmt.Sprintf("\n# round %d\n{ %s }\n", round, attrs)
	}
	withPolicy := "failure-expiry = \"1h\"\n[retry]\nattempts = 2\nbackoff = \"1s\"\n"
	c.repo.Commit("settings", map[string]string{".harmonia-ci.toml": withPolicy})
	attrs := `flaky = ` + flakyDrv("flaky", salt, dir) + `; bad = fail "bad" [ ]; ok = mk "ok" [ ];`
	e := c.evaluate(ciNix(1, attrs))
	flaky, bad := drvOf(t, e, "flaky"), drvOf(t, e, "bad")
	jobs := c.waitFinished(e.ID, 60*time.Second)

	// The flaky build: failed once, succeeded on the retry, green. (A fetch may fail
	// transiently too, see fetchRaces: those attempts built nothing and are not counted.)
	fj := c.job(flaky)
	built := c.builtAttempts(fj.ID)
	if fj.Status != status.JobSucceeded || len(built) != 2 || built[0].Status != status.AttemptFailed ||
		built[1].Status != status.AttemptSucceeded {
		t.Fatalf("%s, attempts that built %+v; want succeeded, one failure then a success", fj, built)
	}
	if log := c.fetchLogAt(queue.AttemptLogKey(flaky, built[0].N)); !strings.Contains(log, "flaky fails this time") {
		t.Errorf("the failed attempt's log: %q", lastLines(log, 10))
	}
	if log := c.fetchLogAt(queue.AttemptLogKey(flaky, built[1].N)); !strings.Contains(log, "flaky built on the retry") {
		t.Errorf("the retry's log: %q", lastLines(log, 10))
	}
	build := c.apiBuild(fj.ID)
	if !build.Flaky || build.Failures != 1 || build.Status != status.JobSucceeded {
		t.Errorf("GET /api/v1/builds/%d: %+v; want succeeded, flaky, 1 failure", fj.ID, build)
	}
	if show := c.cli.ok("job", "show", strconv.FormatInt(fj.ID, 10)); !strings.Contains(show, "succeeded after 1 build failure(s)") {
		t.Errorf("job show %d does not say it is flaky:\n%s", fj.ID, show)
	}
	page := c.get200(fmt.Sprintf("/ci/%s/build/%d", c.project, fj.ID))
	if !strings.Contains(page, "flaky: failed 1 of 2 attempts") {
		t.Errorf("the build page does not say it is flaky:\n%s", page)
	}
	if page := c.get200(fmt.Sprintf("/ci/%s/eval/%d", c.project, e.ID)); !strings.Contains(page, "1 flaky") {
		t.Errorf("the evaluation page does not count the flaky build:\n%s", page)
	}
	// The policy retried bad too, which failed both times: red.
	bj := c.job(bad)
	if n := len(c.builtAttempts(bj.ID)); bj.Status != status.JobFailed || n != 2 {
		t.Fatalf("%s after %d builds; want failed after 2", bj, n)
	}
	for _, j := range jobs {
		if j.DrvPath != bad && j.Status != status.JobSucceeded {
			t.Errorf("%s; want succeeded", j)
		}
	}

	// A failure younger than the expiry stays: the next evaluation takes it as failed.
	e2 := c.evaluate(ciNix(2, attrs))
	c.waitFinished(e2.ID, 30*time.Second)
	if j := c.job(bad); j.Status != status.JobFailed || j.Attempt != bj.Attempt {
		t.Fatalf("a failure younger than failure-expiry: %s; want failed, not built again (attempt %d)", j, bj.Attempt)
	}
	// Past it, the next evaluation builds it again (and the policy retries it again).
	c.queryJobs(`UPDATE build_jobs j SET finished_at = now() - interval '2 hours' WHERE drv_path = $1 RETURNING `+jobColumns, bad)
	e3 := c.evaluate(ciNix(3, attrs))
	var again []attemptResult
	c.waitJob(bad, 60*time.Second, "built again (twice, by the policy) and failed", func(j jobRow) bool {
		again = c.builtAttempts(j.ID)
		return j.Status == status.JobFailed && len(again) == 4
	})
	if log := c.fetchLogAt(queue.AttemptLogKey(bad, again[2].N)); again[2].N <= bj.Attempt || !strings.Contains(log, "failing bad") {
		t.Errorf("the expired failure's new attempt %d's log: %q", again[2].N, lastLines(log, 10))
	}
	c.waitFinished(e3.ID, 30*time.Second)

	// Without the policy: the same kind of flaky build fails, and stays failed.
	c.repo.Commit("no retry", map[string]string{".harmonia-ci.toml": "failure-expiry = \"1h\"\n"})
	e4 := c.evaluate(ciNix(4, `flakyOff = `+flakyDrv("flaky-off", salt, dir)+`;`))
	off := drvOf(t, e4, "flakyOff")
	c.waitFinished(e4.ID, 30*time.Second)
	if j := c.job(off); j.Status != status.JobFailed || len(c.builtAttempts(j.ID)) != 1 {
		t.Fatalf("without a retry policy: %s; want failed after 1 build", j)
	}
	if b := c.apiBuild(c.job(off).ID); b.Flaky || b.Failures != 1 {
		t.Errorf("without a retry policy: %+v; want 1 failure, not flaky", b)
	}
}

// markerDir is a directory for flakyDrv's markers that the builds (as build users) may write.
func markerDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "harmonia-flaky-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestGiteaFlakyBuildStatus: the nix-build commit status of a commit whose build fails once
// and then succeeds is green, saying the build was flaky, when the project retries build
// failures, and never red on the way; without the policy the same kind of failure is red.
func TestGiteaFlakyBuildStatus(t *testing.T) {
	dir := markerDir(t)
	c := newForgeCluster(t, forgeOptions{sandboxPaths: []string{dir}})
	salt := uniqueSalt(t)
	c.enable(nil)

	on := c.push(c.owner, c.repo, "main", map[string]string{
		".harmonia-ci.toml": "[retry]\nattempts = 2\nbackoff = \"1s\"\n",
		"ci.nix":            "{ flaky = " + flakyDrv("flaky-on", salt, dir) + "; }",
	}, false)
	ss := c.waitStatuses(on, "success", "success", 2*time.Minute)
	checkOnce(t, ss)
	if b := latest(ss, ctxBuild); b.Description != "1/1 builds complete (1 flaky)" {
		t.Errorf("nix-build with the retry policy: %+v; want it to name the flaky build", b)
	}
	for _, s := range ss {
		if s.Context == ctxBuild && s.State == "failure" {
			t.Errorf("nix-build went red while the retry waited: %+v", s)
		}
	}

	off := c.push(c.owner, c.repo, "main", map[string]string{
		".harmonia-ci.toml": "# no retry\n",
		"ci.nix":            "{ flaky = " + flakyDrv("flaky-off", salt, dir) + "; }",
	}, false)
	ss = c.waitStatuses(off, "success", "failure", 2*time.Minute)
	if b := latest(ss, ctxBuild); !strings.HasPrefix(b.Description, "1/1 builds failed") {
		t.Errorf("nix-build without the retry policy: %+v", b)
	}
}

// attemptResult is an attempt that built: it succeeded or failed.
type attemptResult struct {
	N      int
	Status status.AttemptStatus
}

// builtAttempts are job id's attempts that built, the first first.
func (c *buildCluster) builtAttempts(id int64) []attemptResult {
	c.t.Helper()
	rows, err := c.pool.Query(context.Background(), `SELECT attempt, status FROM build_attempts
		WHERE job_id = $1 AND status IN ('succeeded', 'failed') ORDER BY attempt`, id)
	if err != nil {
		c.t.Fatal(err)
	}
	as, err := pgx.CollectRows(rows, pgx.RowToStructByPos[attemptResult])
	if err != nil {
		c.t.Fatal(err)
	}
	return as
}

// apiBuild is GET /api/v1/builds/{id}.
func (c *buildCluster) apiBuild(id int64) flakyBuild {
	c.t.Helper()
	var b flakyBuild
	if err := json.Unmarshal([]byte(c.get200("/api/v1/builds/"+strconv.FormatInt(id, 10))), &b); err != nil {
		c.t.Fatal(err)
	}
	return b
}

// flakyBuild is what TestFlakyBuildRetried reads of the read API's build.
type flakyBuild struct {
	Status   status.JobStatus `json:"status"`
	Flaky    bool             `json:"flaky"`
	Failures int              `json:"failures"`
}

// get200 is the body of GET path on front-1, which must answer 200.
func (c *buildCluster) get200(path string) string {
	c.t.Helper()
	var body string
	proctest.WaitFor(c.t, 10*time.Second, "GET "+path, func() bool {
		resp, err := http.Get(c.cacheURL + path)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b := new(strings.Builder)
		if _, err := io.Copy(b, resp.Body); err != nil || resp.StatusCode != http.StatusOK {
			return false
		}
		body = b.String()
		return true
	})
	return body
}
