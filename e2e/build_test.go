package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/pgembed"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// dagSize and dagWidth shape TestBuildClusterBuildsDAG's evaluation: ten layers. Every build is
// a handful of Nix processes (fetch the .drv, substitute the inputs, build in a sandbox) plus an
// upload, so a 2-CPU machine builds about four a second across the cluster: 150 keeps the test
// near half a minute there.
const dagSize, dagWidth = 150, 15

// TestBuildClusterBuildsDAG: three builders build an evaluation of dagSize derivations in ten
// layers. Every derivation is built exactly once, by more than one builder between them; every
// output is substitutable from the cluster's cache by a fresh store checking signatures (and
// refused under another key), every log is served, and no live tail is left behind.
func TestBuildClusterBuildsDAG(t *testing.T) {
	c := newBuildCluster(t, buildClusterOptions{builders: 3})
	e := c.evaluate(nixtest.Layered(uniqueSalt(t), dagSize, dagWidth))
	if len(e.Attrs) != dagSize {
		t.Fatalf("evaluation %d has %d attributes, want %d", e.ID, len(e.Attrs), dagSize)
	}
	jobs := c.waitFinished(e.ID, 90*time.Second)
	if len(jobs) != dagSize {
		t.Fatalf("%d jobs for %d derivations", len(jobs), dagSize)
	}
	builders := map[string]int{}
	for _, j := range jobs {
		builders[j.ClaimedBy]++
		if j.Status != status.JobSucceeded {
			t.Errorf("%s; want succeeded", j)
			continue
		}
		if j.Attempt == 1 && j.RetryCount == 0 {
			continue
		}
		// A retry is only acceptable if no attempt got as far as building: a builder's two job
		// slots sometimes trip over each other fetching .drv closures into one store (see
		// fetchRaces), and the builder retries.
		failures := c.buildFailures(j.ID)
		if len(failures) == 0 || slices.ContainsFunc(failures, func(f string) bool { return !strings.Contains(f, fetchRaces) }) {
			t.Errorf("%s; want succeeded at the first attempt; the builders logged for it:\n%s", j, strings.Join(failures, "\n"))
			continue
		}
		t.Logf("%s: retried after its .drv fetch failed:\n%s", j, strings.Join(failures, "\n"))
	}
	t.Logf("jobs per builder: %v", builders)
	if len(builders) < 2 {
		t.Errorf("every job was built by %v: the work was not spread", builders)
	}
	for id := range builders {
		if _, ok := c.stores[id]; !ok {
			t.Errorf("jobs claimed by %q, which is no builder", id)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	outs := c.outputPaths(jobs)
	c.checkSubstitutable(outs)
	c.checkWrongKeyRefused(outs[0])
	for _, j := range jobs {
		c.checkLog(j, fmt.Sprintf("building %s", drvName(j.DrvPath)))
	}
	c.waitNoTails()
}

// TestBuildSurvivesKilledBuilder: a builder is killed with SIGKILL in the middle of a build. Once
// it is silent past the dead threshold, the leader's reaper hands its claims back to the queue,
// another builder builds them, and the whole run completes, every output substitutable.
func TestBuildSurvivesKilledBuilder(t *testing.T) {
	c := newBuildCluster(t, buildClusterOptions{builders: 3, sandboxPaths: []string{"/bin/sleep"}})
	// Ten derivations of three seconds each: four roots, three above them, two, then one.
	expr := shLib(uniqueSalt(t)) + `
let
  s = name: deps: sh name deps "echo building ${name}; /bin/sleep 3";
  r0 = s "r0" [ ]; r1 = s "r1" [ ]; r2 = s "r2" [ ]; r3 = s "r3" [ ];
  m0 = s "m0" [ r0 r1 ]; m1 = s "m1" [ r1 r2 ]; m2 = s "m2" [ r2 r3 ];
  t0 = s "t0" [ m0 m1 ]; t1 = s "t1" [ m1 m2 ];
in { inherit r0 r1 r2 r3 m0 m1 m2 t0 t1; top = s "top" [ t0 t1 ]; }
`
	e := c.evaluate(expr)

	// The first build that runs, and its builder.
	var victim jobRow
	proctest.WaitFor(t, 30*time.Second, "a job building", func() bool {
		c.checkRunning()
		for _, j := range c.evalJobs(e.ID) {
			if j.Status == status.JobBuilding {
				victim = j
				return true
			}
		}
		return false
	})
	dead := victim.ClaimedBy
	t.Logf("killing %s while it builds %s", dead, victim)
	c.kill9(dead)
	// Everything the dead builder held goes back to the queue (reaped once it is silent past the
	// dead threshold) and is built elsewhere.
	var reclaimed []int64
	for _, j := range c.evalJobs(e.ID) {
		if j.ClaimedBy == dead && j.Status.Claimed() {
			reclaimed = append(reclaimed, j.ID)
		}
	}
	c.waitJob(victim.DrvPath, 20*time.Second, "reclaimed from "+dead, func(j jobRow) bool {
		return j.ClaimedBy != dead && j.RetryCount >= 1
	})

	jobs := c.waitFinished(e.ID, 50*time.Second)
	if len(jobs) != 10 {
		t.Fatalf("%d jobs for 10 derivations", len(jobs))
	}
	for _, j := range jobs {
		if j.Status != status.JobSucceeded {
			t.Errorf("%s; want succeeded", j)
		}
		if slices.Contains(reclaimed, j.ID) {
			if j.ClaimedBy == dead || j.RetryCount < 1 || j.Attempt < 2 {
				t.Errorf("%s: was building on %s when it was killed; want it rebuilt elsewhere (retry_count >= 1, attempt >= 2)", j, dead)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	c.checkSubstitutable(c.outputPaths(jobs))
	for _, j := range jobs {
		c.checkLog(j, "building "+drvName(j.DrvPath))
	}
}

// TestBuildFailureAndRebuild: a failing build fails with Nix's error, its exit code and its log,
// and its dependents, direct and indirect, are dep-failed. `job rebuild` queues it again at
// priority 100 with its dependents; it fails again (nothing changed) and so do they. A
// succeeded job cannot be rebuilt, and `job show` prints the error.
func TestBuildFailureAndRebuild(t *testing.T) {
	c := newBuildCluster(t, buildClusterOptions{builders: 1})
	salt := uniqueSalt(t)
	e := c.evaluate(nixtest.Lib(salt) + `
let bad = fail "bad" [ ]; dep = mk "dep" [ bad ]; in { inherit bad dep; top = mk "top" [ dep ]; ok = mk "ok" [ ]; }
`)
	bad, dep, top, ok := drvOf(t, e, "bad"), drvOf(t, e, "dep"), drvOf(t, e, "top"), drvOf(t, e, "ok")
	c.waitFinished(e.ID, 30*time.Second)

	// The failed build itself is never retried, but a fetch may fail and be (see fetchRaces):
	// builds counts the builds, the attempts may be more.
	checkFailed := func(round string, builds, minAttempt int) (jobRow, []jobRow) {
		t.Helper()
		j := c.job(bad)
		if j.Status != status.JobFailed || j.Attempt <= minAttempt || j.ExitCode == nil || *j.ExitCode == 0 ||
			!strings.Contains(j.ErrorMessage, "builder for '"+bad+"' failed with exit code 1") {
			t.Fatalf("%s: %s; want failed after attempt %d with a non-zero exit code and Nix's error", round, j, minAttempt)
		}
		// The worker logs a failure once it is recorded.
		var failures []string
		proctest.WaitFor(t, 5*time.Second, "the builder's log of every attempt at "+bad, func() bool {
			failures = c.buildFailures(j.ID)
			return len(failures) >= j.Attempt
		})
		var built int
		for _, f := range failures {
			switch {
			case strings.Contains(f, "failed with exit code 1"):
				built++
			case !strings.Contains(f, fetchRaces):
				built = -1000
			}
		}
		if len(failures) != j.Attempt || built != builds {
			t.Fatalf("%s: %s: the builder logged:\n%s\nwant %d build failure(s), the other attempts failing to fetch",
				round, j, strings.Join(failures, "\n"), builds)
		}
		c.checkLog(j, "failing bad")
		var deps []jobRow
		for _, d := range []string{dep, top} {
			dj := c.job(d)
			if dj.Status != status.JobDepFailed || dj.Attempt != 0 || dj.FinishedAt == nil {
				t.Fatalf("%s: %s; want dep-failed, never claimed", round, dj)
			}
			deps = append(deps, dj)
		}
		return j, deps
	}
	j, deps := checkFailed("first build", 1, 0)
	if okJob := c.job(ok); okJob.Status != status.JobSucceeded {
		t.Fatalf("%s; want succeeded", okJob)
	}
	id := strconv.FormatInt(j.ID, 10)
	show := c.cli.ok("job", "show", id)
	t.Logf("job show %s:\n%s", id, show)
	for _, want := range []string{"failed", j.ErrorMessage[:strings.IndexByte(j.ErrorMessage+"\n", '\n')], "/" + j.LogURL,
		fmt.Sprintf("attempt %d ", j.Attempt), " failed on "} {
		if !strings.Contains(show, want) {
			t.Errorf("job show %s does not print %q:\n%s", id, want, show)
		}
	}

	out := c.cli.ok("job", "rebuild", id)
	if !strings.Contains(out, fmt.Sprintf("queued job %d again (3 jobs reset)", j.ID)) {
		t.Fatalf("job rebuild %s: %s", id, out)
	}
	// The job is queued at priority 100 and its dependents reset: whatever the builder did since,
	// the rebuild's mark is on the rows (its fresh retries, its priority, the dependents'
	// finished_at cleared or set anew).
	again := c.job(bad)
	if again.Priority != 100 || again.RetryCount != 0 {
		t.Fatalf("after job rebuild: %s; want priority 100, no retries", again)
	}
	for _, d := range deps {
		now := c.job(d.DrvPath)
		if now.Status != status.JobPending && (now.Status != status.JobDepFailed || now.FinishedAt == nil || !now.FinishedAt.After(*d.FinishedAt)) {
			t.Fatalf("after job rebuild: %s; want pending, or dep-failed anew", now)
		}
	}
	c.waitJob(bad, 30*time.Second, "failed again", func(r jobRow) bool { return r.Status == status.JobFailed && r.Attempt > j.Attempt })
	c.waitFinished(e.ID, 30*time.Second)
	j2, deps2 := checkFailed("rebuild", 2, j.Attempt)
	if j2.Priority != 100 {
		t.Errorf("after the rebuild failed: %s; want priority 100", j2)
	}
	// The first round's failed attempt keeps its own log beside the rebuild's.
	if log := c.fetchLogAt(queue.AttemptLogKey(bad, j.Attempt)); !strings.Contains(log, "failing bad") {
		t.Errorf("the first round's log %s: %q", queue.AttemptLogKey(bad, j.Attempt), lastLines(log, 20))
	}
	for i, d := range deps2 {
		if !d.FinishedAt.After(*deps[i].FinishedAt) {
			t.Errorf("%s: dep-failed at %s, as before the rebuild: it was not reset", d, d.FinishedAt)
		}
	}

	okID := strconv.FormatInt(c.job(ok).ID, 10)
	c.cli.fails([]string{"job", "rebuild", okID}, "job "+okID+" is not failed, dep-failed or cancelled: nothing to rebuild")
	if okJob := c.job(ok); okJob.Status != status.JobSucceeded || okJob.Priority != 0 {
		t.Errorf("after a refused rebuild: %s; want succeeded, untouched", okJob)
	}
	c.cli.fails([]string{"job", "rebuild", "999999"}, "999999")
}

// TestBuildLimits: the [build] limits, each hit by one build on one builder: the wall-clock
// timeout, the silence limit and the output size fail the build with a message naming the
// limit; a log past max_log_size is truncated with a marker and the build succeeds.
func TestBuildLimits(t *testing.T) {
	c := newBuildCluster(t, buildClusterOptions{builders: 1, sandboxPaths: []string{"/bin/sleep"},
		build: `timeout = "4s"
max_silent = "2s"
max_log_size = "64KB"
max_output_size = "16KB"`})
	// chatty prints a line every half second forever; quiet prints a line and sleeps; loud
	// prints about 1 MB (20000 lines of 50 bytes); big writes a 200 KB output, saying so as it
	// goes (on a loaded machine its writes may take longer than max_silent).
	e := c.evaluate(shLib(uniqueSalt(t)) + `
{
  chatty = sh "chatty" [ ] "while :; do echo tick; /bin/sleep 0.5; done";
  quiet = sh "quiet" [ ] "echo once; /bin/sleep 30";
  loud = sh "loud" [ ] "i=0; while [ $i -lt 20000 ]; do echo \"line $i of the loud build, padded to fifty.\"; i=$((i+1)); done";
  big = sh "big" [ ] "i=0; while [ $i -lt 4000 ]; do echo 0123456789012345678901234567890123456789012345678 >> $out; i=$((i+1)); [ $((i % 500)) -ne 0 ] || echo \"$i lines written\"; done";
}
`)
	jobs := c.waitFinished(e.ID, 45*time.Second)
	if len(jobs) != 4 {
		t.Fatalf("%d jobs, want 4", len(jobs))
	}
	for _, j := range jobs {
		t.Logf("%s", j)
	}
	failed := func(attr, message string) jobRow {
		t.Helper()
		j := c.job(drvOf(t, e, attr))
		if j.Status != status.JobFailed || j.ErrorMessage != message {
			t.Errorf("%s: %s; want failed with error %q", attr, j, message)
		}
		return j
	}
	chatty := failed("chatty", "build timed out after 4s")
	c.checkLog(chatty, "tick")
	quiet := failed("quiet", "no output for 2s")
	c.checkLog(quiet, "once")

	big := c.job(drvOf(t, e, "big"))
	if big.Status != status.JobFailed || !strings.HasPrefix(big.ErrorMessage, "outputs are ") ||
		!strings.HasSuffix(big.ErrorMessage, " KB, over max_output_size 16 KB") {
		t.Errorf("big: %s; want failed with \"outputs are 200.x KB, over max_output_size 16 KB\"", big)
	}

	loud := c.job(drvOf(t, e, "loud"))
	if loud.Status != status.JobSucceeded {
		t.Fatalf("loud: %s; want succeeded (a long log is truncated, not a failure)", loud)
	}
	log := c.fetchLog(loud)
	const marker = "\n[... log truncated at 64 KB]\n"
	if !strings.HasSuffix(log, marker) || len(log) != 64000+len(marker) {
		t.Errorf("loud: the served log is %d bytes ending %q; want 64000 bytes and the marker %q",
			len(log), log[max(0, len(log)-80):], marker)
	}
	if !strings.Contains(log, "line 0 of the loud build") {
		t.Errorf("loud: the served log does not start with the build's first lines:\n%s", log[:min(len(log), 500)])
	}
	if t.Failed() {
		t.FailNow()
	}
	c.waitNoTails()
}

// TestBuildFrankenbuild: a builder whose store holds its own, different build of an input (the
// input is not reproducible) deletes it and substitutes the cluster's canonical one before it
// builds a dependent, warning about it.
func TestBuildFrankenbuild(t *testing.T) {
	c := newBuildCluster(t, buildClusterOptions{builders: 2, deferBuilders: true})
	lib := shLib(uniqueSalt(t)) + `
let input = sh "input" [ ] "read -r u < /proc/sys/kernel/random/uuid; echo \"$u\" > $out"; in
`
	only := lib + "{ inherit input; }\n"
	both := lib + "{ inherit input; dependent = sh \"dependent\" [ input ] \"echo dependent\"; }\n"

	// b1 builds the input into its own store before it ever joins: a build of its own.
	b1 := c.stores["b1"]
	file := filepath.Join(t.TempDir(), "ci.nix")
	if err := os.WriteFile(file, []byte(only), 0o644); err != nil {
		t.Fatal(err)
	}
	localDrv := strings.TrimSpace(nixOut(t, "nix-instantiate", "--store", b1, file, "-A", "input", "--option", "substituters", ""))
	sandbox := strings.Join(nix.SandboxPaths(nil), " ")
	localOut := strings.TrimSpace(nixOut(t, "nix-store", "--store", b1, "--realise", localDrv, "--option", "substituters", "",
		"--option", "build-users-group", "", "--option", "sandbox", "true", "--option", "sandbox-paths", sandbox))

	// Phase 1: b2 builds the input for the cluster; its NAR hash is the canonical one.
	c.startBuilder("b2")
	e1 := c.evaluate(only)
	if drv := drvOf(t, e1, "input"); drv != localDrv {
		t.Fatalf("the evaluator's input is %s, b1's %s: not the same derivation", drv, localDrv)
	}
	jobs := c.waitFinished(e1.ID, 30*time.Second)
	if len(jobs) != 1 || jobs[0].Status != status.JobSucceeded || jobs[0].ClaimedBy != "b2" {
		t.Fatalf("phase 1: %v; want the input succeeded on b2", jobs)
	}
	canonical := c.canonicalHash(localOut)
	local := narHashBase32(t, b1, localOut)
	if local == canonical {
		t.Fatalf("b1's build of the input has the canonical NAR hash %s: the test needs a different one", canonical)
	}

	// Phase 2: b2 leaves, b1 joins and builds the dependent.
	c.stop("b2")
	c.startBuilder("b1")
	e2 := c.evaluate(both)
	jobs = c.waitFinished(e2.ID, 30*time.Second)
	dependent := c.job(drvOf(t, e2, "dependent"))
	if len(jobs) != 2 || dependent.Status != status.JobSucceeded || dependent.ClaimedBy != "b1" {
		t.Fatalf("phase 2: %v; want the dependent succeeded on b1", jobs)
	}
	logs := c.procs["b1"].Logs()
	if !strings.Contains(logs, "input differs from the binary cache") || !strings.Contains(logs, localOut) {
		t.Errorf("b1 did not warn about its Frankenbuild of %s:\n%s", localOut, logs)
	}
	if got := narHashBase32(t, b1, localOut); got != canonical {
		t.Errorf("b1's store holds %s with NAR hash %s, want the canonical %s (its own build was %s)", localOut, got, canonical, local)
	}
	c.checkSubstitutable(c.outputPaths(jobs))
}

// pgOutage is how long PostgreSQL stays down in TestBuildSurvivesPostgresRestart: the fault
// injected, longer than the leader's lease (1.5s).
const pgOutage = 2 * time.Second

// TestBuildSurvivesPostgresRestart: the cluster's PostgreSQL (a private one) stops in the
// middle of a run and starts again on the same directory. Every node reconnects and stays up,
// and the run completes, every output substitutable: in particular, a build that finished while
// the database was down is still recorded (or handed back), not left claimed by a live node.
//
// The dead threshold is longer than the outage: the test is about reconnecting, not about the
// dead-node path (TestBuildSurvivesKilledBuilder). With FastConfig's 1s, the maintenance leader
// marks every node dead as the database comes back, itself included, and a builder claiming in
// that moment finds no live cache and burns a job's three retries in milliseconds.
func TestBuildSurvivesPostgresRestart(t *testing.T) {
	dir, err := os.MkdirTemp("", "hci-pg-build-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	opts := pgembed.Options{Dir: dir, Logger: slog.New(slog.DiscardHandler)}
	ctx := context.Background()
	srv, err := pgembed.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("stop PostgreSQL: %v", err)
		}
	})
	url := srv.URL("harmonia")
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.Migrate(ctx, pool, "e2e")
	pool.Close()
	if err != nil {
		t.Fatal(err)
	}

	c := newBuildCluster(t, buildClusterOptions{builders: 3, dbURL: url, sandboxPaths: []string{"/bin/sleep"}, deadThreshold: "5s"})
	// Forty derivations of half a second, in four layers of ten.
	e := c.evaluate(shLib(uniqueSalt(t)) + `
let
  s = name: deps: sh name deps "echo building ${name}; /bin/sleep 0.5";
  layer = prev: l: builtins.genList (j: s "p${toString (l * 10 + j)}"
    (if prev == [ ] then [ ] else [ (builtins.elemAt prev j) (builtins.elemAt prev (9 - j)) ])) 10;
  l0 = layer [ ] 0; l1 = layer l0 1; l2 = layer l1 2; l3 = layer l2 3;
in builtins.listToAttrs (map (d: { name = d.name; value = d; }) (l0 ++ l1 ++ l2 ++ l3))
`)
	proctest.WaitFor(t, 30*time.Second, "some jobs succeeded and others pending", func() bool {
		c.checkRunning()
		counts := map[status.JobStatus]int{}
		for _, j := range c.evalJobs(e.ID) {
			counts[j.Status]++
		}
		return counts[status.JobSucceeded] >= 5 && counts[status.JobPending] >= 10
	})

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("PostgreSQL stopped for %s", pgOutage)
	time.Sleep(pgOutage) // the fault: PostgreSQL is down this long
	if srv, err = pgembed.Start(ctx, opts); err != nil {
		t.Fatal(err)
	}
	if got := srv.URL("harmonia"); got != url {
		t.Fatalf("PostgreSQL came back at %s, not %s", got, url)
	}

	jobs := c.waitFinished(e.ID, 60*time.Second)
	if len(jobs) != 40 {
		t.Fatalf("%d jobs for 40 derivations", len(jobs))
	}
	retried := 0
	for _, j := range jobs {
		if j.Status != status.JobSucceeded {
			t.Errorf("%s; want succeeded", j)
		}
		if j.Attempt > 1 {
			retried++
		}
	}
	t.Logf("%d of 40 jobs needed more than one attempt", retried)
	for id := range c.procs {
		c.waitActive(id)
	}
	if t.Failed() {
		t.FailNow()
	}
	c.checkSubstitutable(c.outputPaths(jobs))
	for _, j := range jobs {
		if j.Attempt == 1 {
			c.checkLog(j, "building "+drvName(j.DrvPath))
			continue
		}
		// A retry on the builder that built the output before the outage finds it valid and does
		// not build again: its log is served but holds only Nix's messages.
		if log := c.fetchLog(j); !strings.Contains(log, "building "+drvName(j.DrvPath)) {
			t.Logf("log of the retried %s has no build output:\n%s", j, lastLines(log, 5))
		}
	}
}

// TestBuildLogStream: a running build's log is streamed as Server-Sent Events by the frontend;
// a client reconnecting with Last-Event-ID gets only newer tails; the stream ends with an "end"
// event when the build finishes; and a finished build's log is served whole by the frontend.
func TestBuildLogStream(t *testing.T) {
	c := newBuildCluster(t, buildClusterOptions{builders: 1, sandboxPaths: []string{"/bin/sleep"}})
	e := c.evaluate(shLib(uniqueSalt(t)) + `
{ talker = sh "talker" [ ] "i=0; while [ $i -lt 27 ]; do echo \"line $i\"; /bin/sleep 0.3; i=$((i+1)); done"; }
`)
	drv := drvOf(t, e, "talker")
	j := c.waitJob(drv, 30*time.Second, "building", func(j jobRow) bool { return j.Status == status.JobBuilding })
	url := fmt.Sprintf("%s/api/builds/%d/log", c.cacheURL, j.ID)

	// A first stream: the first tail holding build output.
	s1 := openLogStream(t, url, "")
	var first sseEvent
	for first.Data == "" || !strings.Contains(first.Data, "line ") {
		first = s1.next(t, "tail")
	}
	s1.close()
	firstLine := lastLineNumber(first.Data)
	t.Logf("first tail: id %d, up to line %d", first.ID, firstLine)

	// Reconnecting with its id: only a newer tail, with later lines.
	s2 := openLogStream(t, url, strconv.FormatInt(first.ID, 10))
	defer s2.close()
	second := s2.next(t, "tail")
	if second.ID <= first.ID || lastLineNumber(second.Data) <= firstLine {
		t.Fatalf("after reconnecting with Last-Event-ID %d: tail %d up to line %d; want a newer tail with lines after %d",
			first.ID, second.ID, lastLineNumber(second.Data), firstLine)
	}
	t.Logf("after reconnecting: tail %d, up to line %d", second.ID, lastLineNumber(second.Data))
	// The stream follows the build to its end.
	var end sseEvent
	for end.Event != "end" {
		end = s2.next(t, "")
		if end.Event == "tail" && end.ID <= second.ID {
			t.Fatalf("tail %d after tail %d on one stream", end.ID, second.ID)
		}
	}
	var endData struct {
		Status status.JobStatus `json:"status"`
		LogURL string           `json:"log_url"`
	}
	wantLoc := "/log/" + filepath.Base(drv) + ".1"
	if err := json.Unmarshal([]byte(end.Data), &endData); err != nil || endData.Status != status.JobSucceeded || endData.LogURL != wantLoc {
		t.Fatalf("end event %q (%v); want status succeeded, log_url %s", end.Data, err, wantLoc)
	}

	// A finished build's log is served whole by the frontend, which holds the blob store.
	finished := c.waitJob(drv, 10*time.Second, "succeeded", func(j jobRow) bool { return j.Status == status.JobSucceeded })
	noRedirect := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
	resp, err := noRedirect.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "line 1\n") || !strings.Contains(string(body), "line 26") {
		t.Fatalf("GET %s after the build: %d with %q; want 200 with the whole log", url, resp.StatusCode, body)
	}
	c.checkLog(finished, "line 26")
	c.waitNoTails()
}
