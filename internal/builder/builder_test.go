package builder_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/builder"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixgen"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/signertest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

// sh is a Nix prelude defining sh NAME SCRIPT: a derivation running SCRIPT with /bin/sh, its
// command line naming the test's salt (to find its processes in /proc).
func sh(salt string) string {
	return fmt.Sprintf(`let
  sh = name: script: builtins.derivation {
    inherit name;
    system = builtins.currentSystem;
    builder = "/bin/sh";
    args = [ "-c" ": %s-${name}; ${script}" ];
  };
in `, salt)
}

// TestBuildsDAGIntoCache: a DAG, one derivation with two outputs, is built once each into the
// cache: signed narinfos any Nix trusting the cluster's key substitutes, canonical NAR hashes,
// and each build's log.
func TestBuildsDAGIntoCache(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	expr := nixgen.Lib(h.salt) + ` let
  multi = name: deps: builtins.derivation {
    inherit name;
    system = builtins.currentSystem;
    builder = "/bin/sh";
    salt = "` + h.salt + `";
    outputs = [ "out" "dev" ];
    args = [ "-c" "echo building ${name}; echo ${name} > $out; echo ${name}-dev > $dev; ${builtins.concatStringsSep ""
      (map (d: "while IFS= read -r l; do echo \"$l\" >> $out; done < ${d};") deps)}" ];
  };
  d0 = mk "d0" [ ];
  d1 = mk "d1" [ d0 ];
  d2 = mk "d2" [ d0 ];
  d3 = multi "d3" [ d1 ];
  d4 = mk "d4" [ d3.dev ];
  d5 = mk "d5" [ d3 d2 ];
  d6 = mk "d6" [ d4 d5 ];
  d7 = mk "d7" [ d1 ];
  d8 = mk "d8" [ d6 d7 ];
  d9 = mk "d9" [ d8 d3.dev ];
in { inherit d0 d1 d2 d3 d4 d5 d6 d7 d8 d9; }`
	names := []string{"d0", "d1", "d2", "d3", "d4", "d5", "d6", "d7", "d8", "d9"}
	drvs := h.instantiate(expr, names...)
	all := make([]string, len(names))
	for i, n := range names {
		all[i] = drvs[n]
	}
	h.enqueue(all...)
	node := h.startBuilder("builder-1", builder.Config{Limits: builder.BuildLimits{Timeout: time.Minute}})
	others := watchNixProcesses(t, node.store)

	var jobs []int64
	for _, name := range names {
		j := h.waitStatus(drvs[name], status.JobSucceeded)
		if j.Attempt != 1 || j.RetryCount != 0 {
			t.Errorf("%s: %v, want built once (attempt 1, no retries)", name, j)
		}
		// The job records its attempt's own log; the latest is served for `nix log` too.
		if want := queue.AttemptLogKey(drvs[name], 1); j.LogURL == nil || *j.LogURL != want {
			t.Errorf("%s: %v, want log_url %s", name, j, want)
		}
		for _, key := range []string{queue.LogKey(drvs[name]), queue.AttemptLogKey(drvs[name], 1)} {
			if log := h.buildLogAt(key); !strings.Contains(log, "building "+name) {
				t.Errorf("%s: served log %s %q lacks %q", name, key, log, "building "+name)
			}
		}
		jobs = append(jobs, j.ID)
	}
	waittest.For(t, 10*time.Second, func() bool {
		var n int
		if err := h.pool.QueryRow(context.Background(), `SELECT count(*) FROM build_log_tails`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	}, "no live log tails once every build is over")
	// The signer records a success before the handler returns: wait for the handler.
	for i, id := range jobs {
		waittest.For(t, 10*time.Second, func() bool { return len(h.handledResults(id)) > 0 }, "the handler of %s to return", names[i])
		if n := len(h.handledResults(id)); n != 1 {
			t.Errorf("%s: handled %d times, want once", names[i], n)
		}
	}

	// On the worker protocol, the builder's store saw no Nix process but its daemon sessions.
	if seen := others(); len(seen) > 0 {
		t.Errorf("Nix processes on the builder's store besides its daemon sessions: %q", seen)
	}

	// A fresh store trusting only the cluster's key substitutes every output, signatures
	// required; what it gets is what derivation_outputs names canonical.
	var outs []string
	canonical := map[string]string{}
	for _, name := range names {
		hashes := h.canonicalHashes(drvs[name])
		for out, p := range h.outputs(drvs[name]) {
			if hashes[out] == "" {
				t.Errorf("%s: output %s has no canonical NAR hash", name, out)
			}
			if code, info := h.narInfo(p); code != http.StatusOK || !strings.Contains(info, "\nSig: builder-test-1:") {
				t.Errorf("%s: narinfo of %s: %d %q, want one signed by builder-test-1", name, p, code, info)
			}
			outs = append(outs, p)
			canonical[p] = hashes[out]
		}
	}
	fresh := t.TempDir()
	nixRun(t, "nix-store", append([]string{"--store", fresh, "--realise",
		"--option", "substituters", h.cluster.URL, "--option", "require-sigs", "true",
		"--option", "trusted-public-keys", h.cluster.PublicKey(), "--option", "narinfo-cache-negative-ttl", "0",
		"--option", "build-users-group", ""}, outs...)...)
	infos := pathInfos(t, fresh, outs)
	for _, p := range outs {
		if info, ok := infos[p]; !ok || info.NarHash != canonical[p] {
			t.Errorf("%s in a fresh store: valid %v, NAR hash %s, want %s", p, ok, info.NarHash, canonical[p])
		}
	}
	d3 := h.outputs(drvs["d3"])
	for out, want := range map[string]string{d3["out"]: "d3\nd1\nd0\n", d3["dev"]: "d3-dev\n",
		h.outputs(drvs["d4"])["out"]: "d4\nd3-dev\n"} {
		if got, err := os.ReadFile(filepath.Join(fresh, out)); err != nil || string(got) != want {
			t.Errorf("%s holds %q, %v; want %q", out, got, err, want)
		}
	}
}

// TestFailedBuild: a failing build fails its job for good, with Nix's message, its exit code and
// its log, and its dependents with it; a rebuild builds it again, and it fails again.
func TestFailedBuild(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	drvs := h.instantiate(nixgen.Lib(h.salt)+` let bad = fail "bad" [ ]; in { inherit bad; user = mk "user" [ bad ]; }`,
		"bad", "user")
	h.enqueue(drvs["bad"], drvs["user"])
	h.startBuilder("builder-1", builder.Config{Limits: builder.BuildLimits{Timeout: time.Minute}})

	for attempt := 1; attempt <= 2; attempt++ {
		bad := h.waitJob(drvs["bad"], fmt.Sprintf("failed at attempt %d", attempt), func(j jobRow) bool {
			return j.Attempt == attempt && j.Status.Terminal()
		})
		if bad.Status != status.JobFailed || bad.ErrorMessage == nil || *bad.ErrorMessage == "" || bad.ExitCode == nil || *bad.ExitCode == 0 {
			t.Fatalf("attempt %d: %v, want failed with an error message and a non-zero exit code", attempt, bad)
		}
		if bad.RetryCount != 0 {
			t.Errorf("attempt %d: %v: a failed build is no transient failure", attempt, bad)
		}
		if want := queue.AttemptLogKey(drvs["bad"], attempt); bad.LogURL == nil || *bad.LogURL != want {
			t.Errorf("attempt %d: %v, want log_url %s", attempt, bad, want)
		}
		if log := h.buildLog(drvs["bad"]); !strings.Contains(log, "failing bad") {
			t.Errorf("attempt %d: served log %q lacks the build's output", attempt, log)
		}
		// Every attempt so far is recorded, with its own log still served.
		var rows []string
		for n := 1; n <= attempt; n++ {
			key := queue.AttemptLogKey(drvs["bad"], n)
			if log := h.buildLogAt(key); !strings.Contains(log, "failing bad") {
				t.Errorf("attempt %d: served log %s %q lacks the build's output", attempt, key, log)
			}
			rows = append(rows, fmt.Sprintf("%d builder-1 failed %s", n, key))
		}
		if got := h.attempts(bad.ID); !slices.Equal(got, rows) {
			t.Errorf("attempt %d: attempts %q, want %q", attempt, got, rows)
		}
		h.waitStatus(drvs["user"], status.JobDepFailed)
		if attempt == 1 {
			// Nothing is fixed: the rebuild fails the same way.
			if n, err := queue.Rebuild(h.ctx(), h.pool, bad.ID, queue.PriorityBoost); err != nil || n != 2 {
				t.Fatalf("Rebuild = %d, %v; want the job and its dependent reset", n, err)
			}
		}
	}
	if j := h.job(drvs["user"]); j.Attempt != 0 {
		t.Errorf("%v: the dependent of a failed build was claimed", j)
	}
	if !strings.Contains(h.logs.String(), "build failed") {
		t.Errorf("the worker logged no failed build")
	}
}

// TestLimits: each limit ends a build the way users read it in error_message, and a log past its
// cap is truncated with a marker while the build goes on.
func TestLimits(t *testing.T) {
	t.Parallel()
	const line = "0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789"
	loop := func(n int, redirect string) string {
		return fmt.Sprintf("i=0; while [ $i -lt %d ]; do echo %s; i=$((i+1)); done%s", n, line, redirect)
	}
	tests := []struct {
		name   string
		script string
		cfg    builder.Config
		status status.JobStatus
		msg    string // error_message: exact, or a substring when sub
		sub    bool
		log    string // in the served log
	}{
		{name: "timeout", script: "echo started; /bin/sleep 30",
			cfg:    builder.Config{Limits: builder.BuildLimits{Timeout: 2 * time.Second}},
			status: status.JobFailed, msg: "build timed out after 2s", log: "started"},
		{name: "silent", script: "echo once; /bin/sleep 30",
			cfg:    builder.Config{Limits: builder.BuildLimits{Timeout: time.Minute, MaxSilent: time.Second}},
			status: status.JobFailed, msg: "no output for 1s", log: "once"},
		{name: "log", script: loop(10_000, "") + "; echo done > $out",
			cfg:    builder.Config{Limits: builder.BuildLimits{Timeout: time.Minute}, MaxLogSize: 64 << 10},
			status: status.JobSucceeded, log: line},
		{name: "output", script: "echo writing; " + loop(640, " > $out"),
			cfg:    builder.Config{Limits: builder.BuildLimits{Timeout: time.Minute, MaxOutputSize: 1 << 10}},
			status: status.JobFailed, msg: "over max_output_size 1 KB", sub: true, log: "writing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			drv := h.instantiate(sh(h.salt)+fmt.Sprintf(`{ x = sh "%s" %q; }`, tt.name, tt.script), "x")["x"]
			h.enqueue(drv)
			tt.cfg.Store.SandboxPaths = []string{"/bin/sleep"}
			node := h.startBuilder("builder-1", tt.cfg)

			j := h.waitStatus(drv, tt.status)
			switch {
			case tt.msg == "" && j.ErrorMessage != nil:
				t.Errorf("%v, want no error message", j)
			case tt.msg != "" && (j.ErrorMessage == nil || (!tt.sub && *j.ErrorMessage != tt.msg) ||
				!strings.Contains(*j.ErrorMessage, tt.msg)):
				t.Errorf("%v, want error message %q", j, tt.msg)
			}
			if j.Attempt != 1 || j.RetryCount != 0 {
				t.Errorf("%v: want one attempt, no retries (limits are no transient failures)", j)
			}
			if killed := tt.name == "timeout" || tt.name == "silent"; killed && j.ExitCode != nil {
				t.Errorf("%v: a killed build has no exit code", j)
			}
			log := h.buildLog(drv)
			if !strings.Contains(log, tt.log) {
				t.Errorf("served log %q lacks %q", log, tt.log)
			}
			out := h.outputs(drv)["out"]
			switch tt.name {
			case "log":
				marker := "\n[... log truncated at 65536 B]\n"
				if !strings.HasSuffix(log, marker) || len(log) != 64<<10+len(marker) {
					t.Errorf("served log of %d bytes ending %q, want the cap (%d bytes) and the marker %q",
						len(log), log[max(0, len(log)-80):], 64<<10, marker)
				}
				if code, _ := h.narInfo(out); code != http.StatusOK {
					t.Errorf("the output of a build with a truncated log is not in the cache: %d", code)
				}
			default:
				if code, _ := h.narInfo(out); code != http.StatusNotFound {
					t.Errorf("narinfo of the output of a failed build: %d, want 404", code)
				}
				if hashes := h.canonicalHashes(drv); hashes["out"] != "" {
					t.Errorf("a failed build's output has a canonical NAR hash %s", hashes["out"])
				}
				// The job roots its outputs from the start; an oversized one is deleted all the same.
				if _, ok := pathInfos(t, node.store, []string{out})[out]; ok && tt.name == "output" {
					t.Errorf("the oversized output %s is still in the builder's store", out)
				}
			}
		})
	}
}

// TestFailedThenBuiltKeepsBothAttempts: a derivation that fails, then builds once rebuilt (it
// reads a file outside the sandbox that the test changes), keeps both attempts with their
// node, result and own log, each served by the cache; the latest log is the success's.
func TestFailedThenBuiltKeepsBothAttempts(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	marker := filepath.Join(t.TempDir(), "marker")
	if err := os.WriteFile(marker, []byte("fail\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	expr := fmt.Sprintf(`{ flaky = builtins.derivation {
    name = "flaky";
    system = builtins.currentSystem;
    builder = "/bin/sh";
    salt = "%s";
    args = [ "-c" "read -r v < %s; echo \"this attempt says $v\"; [ \"$v\" = ok ] && echo ok > $out" ];
  }; }`, h.salt, marker)
	drv := h.instantiate(expr, "flaky")["flaky"]
	h.enqueue(drv)
	h.startBuilder("builder-1", builder.Config{Store: builder.Store{SandboxPaths: []string{marker}},
		Limits: builder.BuildLimits{Timeout: time.Minute}})

	failed := h.waitStatus(drv, status.JobFailed)
	if err := os.WriteFile(marker, []byte("ok\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if n, err := queue.Rebuild(h.ctx(), h.pool, failed.ID, queue.PriorityNormal); err != nil || n != 1 {
		t.Fatalf("Rebuild = %d, %v", n, err)
	}
	built := h.waitStatus(drv, status.JobSucceeded)
	if built.Attempt != 2 {
		t.Fatalf("%v: want built at attempt 2", built)
	}
	want := []string{
		"1 builder-1 failed " + queue.AttemptLogKey(drv, 1),
		"2 builder-1 succeeded " + queue.AttemptLogKey(drv, 2),
	}
	if got := h.attempts(built.ID); !slices.Equal(got, want) {
		t.Fatalf("attempts %q, want %q", got, want)
	}
	for key, says := range map[string]string{
		queue.AttemptLogKey(drv, 1): "this attempt says fail",
		queue.AttemptLogKey(drv, 2): "this attempt says ok",
		queue.LogKey(drv):           "this attempt says ok",
	} {
		if log := h.buildLogAt(key); !strings.Contains(log, says) {
			t.Errorf("served log %s %q lacks %q", key, log, says)
		}
	}
}

// TestFrankenbuild: a builder whose store holds an input built differently from the cache's
// copy (a non-reproducible build of its own) warns, replaces it with the canonical one, and
// builds against that.
func TestFrankenbuild(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	// imp reads a file only the first builder's sandbox shows it: its builds differ.
	marker := filepath.Join(t.TempDir(), "marker")
	if err := os.WriteFile(marker, []byte("canonical build\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	expr := fmt.Sprintf(`let
  drv = name: script: builtins.derivation {
    inherit name;
    system = builtins.currentSystem;
    builder = "/bin/sh";
    salt = "%s";
    args = [ "-c" script ];
  };
  imp = drv "imp" "if [ -e %[2]s ]; then read -r v < %[2]s; else v=frankenbuild; fi; echo \"$v\" > $out";
  user = drv "user" "read -r v < ${imp}; echo \"user of $v\" > $out";
in { inherit imp user; }`, h.salt, marker)
	drvs := h.instantiate(expr, "imp", "user")
	imp := h.outputs(drvs["imp"])["out"]

	// The cluster's first build of imp, on builder-a, is the canonical one.
	h.enqueue(drvs["imp"])
	a := h.startBuilder("builder-a", builder.Config{Store: builder.Store{SandboxPaths: []string{marker}},
		Limits: builder.BuildLimits{Timeout: time.Minute}})
	h.waitStatus(drvs["imp"], status.JobSucceeded)
	a.stop()
	canonical := h.canonicalHashes(drvs["imp"])["out"]
	if canonical == "" {
		t.Fatalf("imp's output has no canonical NAR hash after its build")
	}

	// builder-b's store has its own build of imp.
	storeB := t.TempDir()
	instantiate(t, storeB, expr, "imp")
	nixRun(t, "nix-store", append([]string{"--store", storeB, "--realise", drvs["imp"]}, sandboxOptions()...)...)
	if info, ok := pathInfos(t, storeB, []string{imp})[imp]; !ok || info.NarHash == canonical {
		t.Fatalf("builder-b's own build of imp: valid %v, NAR hash %s: the test needs one differing from the canonical %s",
			ok, info.NarHash, canonical)
	}

	h.enqueue(drvs["user"])
	h.startBuilder("builder-b", builder.Config{Store: builder.Store{Root: storeB}, Limits: builder.BuildLimits{Timeout: time.Minute}})
	h.waitStatus(drvs["user"], status.JobSucceeded)

	if logs := h.logs.String(); !strings.Contains(logs, "level=WARN msg=\"input differs from the binary cache") ||
		!strings.Contains(logs, "path="+imp) || !strings.Contains(logs, "canonical_nar_hash="+canonical) {
		t.Errorf("builder-b logged no warning about its differing %s", imp)
	}
	if info, ok := pathInfos(t, storeB, []string{imp})[imp]; !ok || info.NarHash != canonical {
		t.Errorf("imp in builder-b's store after the build: valid %v, NAR hash %s, want the canonical %s", ok, info.NarHash, canonical)
	}
	user := h.outputs(drvs["user"])["out"]
	for file, want := range map[string]string{imp: "canonical build\n", user: "user of canonical build\n"} {
		if got, err := os.ReadFile(filepath.Join(storeB, file)); err != nil || string(got) != want {
			t.Errorf("%s in builder-b's store holds %q, %v; want %q", file, got, err, want)
		}
	}
}

// TestCancelKillsBuild: a user's cancel reaches the build within a claim check: its processes are
// gone, and the job stays cancelled, with nothing recorded as failed.
func TestCancelKillsBuild(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	drv := h.instantiate(sh(h.salt)+`{ spin = sh "spin" "echo spinning; while :; do :; done"; }`, "spin")["spin"]
	h.enqueue(drv)
	const checkInterval = 200 * time.Millisecond
	h.startBuilder("builder-1", builder.Config{Limits: builder.BuildLimits{Timeout: 5 * time.Minute}, CheckInterval: checkInterval})

	j := h.waitStatus(drv, status.JobBuilding)
	waittest.For(t, jobWait, func() bool {
		tail, ok := h.tail(j.ID)
		return ok && strings.Contains(tail, "spinning")
	}, "the live tail of job %d to show the build running", j.ID)
	builder := h.salt + "-spin" // in the command line of the build's /bin/sh
	if len(processesWith(builder)) == 0 {
		t.Fatalf("no build processes found")
	}

	start := time.Now()
	if err := queue.Cancel(h.ctx(), h.pool, j.ID); err != nil {
		t.Fatal(err)
	}
	waittest.For(t, checkInterval+5*time.Second, func() bool {
		return len(processesWith(builder)) == 0
	}, "the build's processes to be gone after the cancel")
	t.Logf("build processes gone %s after the cancel", time.Since(start).Round(time.Millisecond))

	waittest.For(t, 10*time.Second, func() bool { return len(h.handledResults(j.ID)) == 1 },
		"the handler of job %d to return", j.ID)
	if res := h.handledResults(j.ID)[0]; !res.Abandoned || res.Err != nil {
		t.Errorf("Handle of the cancelled job = %+v, want abandoned", res)
	}
	waittest.For(t, 10*time.Second, func() bool { _, ok := h.tail(j.ID); return !ok },
		"the live tail of the cancelled job %d to be deleted", j.ID)
	waittest.Hold(t, time.Second, func() {
		if j := h.job(drv); j.Status != status.JobCancelled || j.ErrorMessage != nil || j.ExitCode != nil {
			t.Fatalf("%v, want it to stay cancelled as the user left it", j)
		}
	})
	logs := h.logs.String()
	for _, want := range []string{"killing a build whose job was cancelled or reclaimed", "build abandoned"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q", want)
		}
	}
	for _, unwanted := range []string{"build failed", "level=ERROR", "nothing recorded"} {
		if strings.Contains(logs, unwanted) {
			t.Errorf("logs hold %q", unwanted)
		}
	}
}

// TestInputUnavailableIsTransient: an input no cache has is the cluster's problem, not the
// build's: the job goes back to the queue, naming the input, until its retries run out; and
// the builder never builds the input itself.
func TestInputUnavailableIsTransient(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	drvs := h.instantiate(nixgen.Lib(h.salt)+` let a = mk "a" [ ]; in { inherit a; b = mk "b" [ a ]; }`, "a", "b")
	h.enqueue(drvs["a"], drvs["b"])
	// a succeeded as far as the database knows, but its output never reached a cache.
	queuetest.Exec(t, h.pool, `UPDATE build_jobs SET status = 'succeeded', finished_at = now() WHERE drv_path = $1`, drvs["a"])
	outA := h.outputs(drvs["a"])["out"]
	node := h.startBuilder("builder-1", builder.Config{Limits: builder.BuildLimits{Timeout: time.Minute}})

	first := h.waitJob(drvs["b"], "a first retry", func(j jobRow) bool { return j.RetryCount >= 1 })
	if first.RetryCount == 1 && (first.Status != status.JobPending && first.Status != status.JobBuilding ||
		first.ErrorMessage == nil || !strings.Contains(*first.ErrorMessage, outA)) {
		t.Errorf("after the first attempt: %v, want it back in the queue with an error naming %s", first, outA)
	}
	j := h.waitStatus(drvs["b"], status.JobFailed)
	if j.RetryCount != 3 || j.Attempt != 4 || j.ErrorMessage == nil ||
		!strings.Contains(*j.ErrorMessage, outA) || !strings.Contains(*j.ErrorMessage, builder.ErrInputUnavailable.Error()) {
		t.Errorf("%v, want failed after 3 retries (4 attempts), with an error naming %s", j, outA)
	}
	results := h.handledResults(j.ID)
	if len(results) != 4 {
		t.Errorf("handled %d times, want 4", len(results))
	}
	for i, res := range results {
		if !errors.Is(res.Err, builder.ErrInputUnavailable) || res.Kind != queue.Transient {
			t.Errorf("attempt %d: %+v, want a transient ErrInputUnavailable", i+1, res)
		}
	}
	if _, ok := pathInfos(t, node.store, []string{outA})[outA]; ok {
		t.Errorf("the builder built the unavailable input %s itself", outA)
	}
}

// TestLiveTail: while a build runs, its output so far is in build_log_tails for log watchers;
// once it is over, the tail is gone and the whole log is in the cache.
func TestLiveTail(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	drv := h.instantiate(sh(h.salt)+`{ slow = sh "slow" "for i in 1 2 3 4 5; do echo line$i; /bin/sleep 0.3; done; echo done > $out"; }`,
		"slow")["slow"]
	h.enqueue(drv)
	h.startBuilder("builder-1", builder.Config{Store: builder.Store{SandboxPaths: []string{"/bin/sleep"}},
		Limits: builder.BuildLimits{Timeout: time.Minute}})

	var last liveTail
	waittest.For(t, jobWait, func() bool {
		if err := h.pool.QueryRow(context.Background(), `
SELECT j.status, t.log_tail FROM build_jobs j LEFT JOIN build_log_tails t ON t.build_job_id = j.id
WHERE j.drv_path = $1`, drv).Scan(&last.status, &last.tail); err != nil {
			t.Fatal(err)
		}
		if last.status.Terminal() {
			t.Fatalf("the job is %s, and no live tail was seen while it ran", last.status)
		}
		return last.status == status.JobBuilding && strings.Contains(string(last.tail), "line1")
	}, "a live tail showing the build's first line (last seen: %v)", &last)
	if strings.Contains(string(last.tail), "line5") {
		t.Errorf("the first tail seen %q holds the build's last line already", last.tail)
	}

	j := h.waitStatus(drv, status.JobSucceeded)
	waittest.For(t, 10*time.Second, func() bool { _, ok := h.tail(j.ID); return !ok },
		"the live tail of the finished job %d to be deleted", j.ID)
	log := h.buildLog(drv)
	if i := strings.Index(log, "line1\nline2\nline3\nline4\nline5\n"); i < 0 {
		t.Errorf("served log %q lacks the build's lines", log)
	}
}

// liveTail is a job's status and live tail, read together.
type liveTail struct {
	status status.JobStatus
	tail   []byte
}

func (l *liveTail) String() string { return fmt.Sprintf("status %s, tail %q", l.status, l.tail) }

// watchNixProcesses samples the processes working on the chroot store at root until the
// returned func is called, which returns the command lines of those that are not its daemon
// sessions (`unshare … nix-daemon --stdio --store root`).
func watchNixProcesses(t *testing.T, root string) func() []string {
	t.Helper()
	seen := map[string]bool{}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
			for _, f := range cmdlines {
				b, err := os.ReadFile(f)
				if err != nil || !bytes.Contains(b, []byte(root)) {
					continue
				}
				args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
				if argv0 := filepath.Base(args[0]); argv0 != "unshare" && argv0 != "nix-daemon" {
					seen[strings.Join(args, " ")] = true
				}
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	return func() []string {
		close(stop)
		<-done
		return slices.Sorted(maps.Keys(seen))
	}
}

// TestDaemonStoppedMidBuild: a build slot's daemon stopped mid-build (SIGTERM) stops the build;
// the job fails as a transient failure, the slot opens a new session, and the job is built on
// its retry.
func TestDaemonStoppedMidBuild(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	// Long enough to be killed in the first attempt, short enough for the retry.
	drv := h.instantiate(sh(h.salt)+`{ slow = sh "slow" "echo started; i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done; echo done > $out"; }`, "slow")["slow"]
	h.enqueue(drv)
	node := h.startBuilder("builder-1", builder.Config{Limits: builder.BuildLimits{Timeout: 5 * time.Minute}})
	j := h.waitStatus(drv, status.JobBuilding)
	waittest.For(t, jobWait, func() bool {
		tail, ok := h.tail(j.ID)
		return ok && strings.Contains(tail, "started")
	}, "the build of job %d to run", j.ID)
	var daemons []int
	for _, pid := range processesWith(node.store) {
		if b, err := os.ReadFile(filepath.Join("/proc", pid, "cmdline")); err == nil && bytes.HasPrefix(b, []byte("nix-daemon\x00")) {
			n, _ := strconv.Atoi(pid)
			daemons = append(daemons, n)
		}
	}
	if len(daemons) == 0 {
		t.Fatal("no daemon session found")
	}
	first := processesWith(h.salt + "-slow") // the first attempt's build
	if len(first) == 0 {
		t.Fatal("no build process found")
	}
	for _, pid := range daemons {
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	waittest.For(t, 10*time.Second, func() bool {
		for _, pid := range first {
			if _, err := os.Stat(filepath.Join("/proc", pid)); err == nil {
				return false
			}
		}
		return true
	}, "the stopped daemon's build to be gone")
	j = h.waitStatus(drv, status.JobSucceeded)
	if j.Attempt != 2 || j.RetryCount != 1 {
		t.Errorf("%v, want built on its retry (attempt 2, one retry)", j)
	}
	if !strings.Contains(h.logs.String(), "transient build failure") {
		t.Errorf("the stopped build was not reported as a transient failure:\n%s", h.logs.String())
	}
}

// TestForgedDerivationNotBuilt: a .drv that claims another derivation's output path (the
// poisoning of issue 24), had it reached the cache and the queue, fails its job for good with
// an error saying why; the daemon never builds it, and nothing is signed for the victim's path.
func TestForgedDerivationNotBuilt(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	drvs := h.instantiate(nixgen.Lib(h.salt)+` { victim = mk "victim" [ ]; }`, "victim")
	victim, err := nix.ReadDerivation(h.src, drvs["victim"])
	if err != nil {
		t.Fatal(err)
	}
	victimOut := victim.Outputs["out"].Path
	forgedPath, text := nixtest.ForgedDerivation(victim)
	// A file in the evaluator's store directory that Nix never registered, as the attack leaves.
	if err := os.WriteFile(filepath.Join(h.src, forgedPath), text, 0o444); err != nil {
		t.Fatal(err)
	}
	h.cluster.Seed(t, h.src, signertest.SeedPath{StorePath: forgedPath})
	if _, err := queue.Enqueue(h.ctx(), h.pool, queue.EnqueueParams{Derivations: []queue.Derivation{h.derivation(forgedPath)}}); err != nil {
		t.Fatal(err)
	}
	b := h.startBuilder("builder-1", builder.Config{Limits: builder.BuildLimits{Timeout: time.Minute}})

	j := h.waitJob(forgedPath, "failed", func(j jobRow) bool { return j.Status.Terminal() })
	if j.Status != status.JobFailed || j.ErrorMessage == nil || !strings.Contains(*j.ErrorMessage, "refusing to build a derivation whose outputs are not its own") {
		t.Fatalf("%v; want failed, saying why", j)
	}
	if code, body := h.narInfo(victimOut); code != http.StatusNotFound {
		t.Errorf("the victim's output is served (%d): %s", code, body)
	}
	if _, err := os.Stat(filepath.Join(b.store, victimOut)); err == nil {
		t.Errorf("the forged derivation was built")
	}
}
