package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// TestReevaluateRun is the failure: `harmonia-ci run` on a machine where Nix cannot
// evaluate (nix-instantiate missing) fails the evaluation for a reason outside the project;
// once Nix is back, running the same files again evaluates the same snapshot again (the same
// evaluation, not a new one) and builds everything. A third run of the unchanged files reuses
// the evaluation that succeeded.
func TestReevaluateRun(t *testing.T) {
	nixtest.RequireNix(t)
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "ci.nix"), []byte(ciNix(t.Name()+fmt.Sprint(time.Now().UnixNano()))), 0o644); err != nil {
		t.Fatal(err)
	}
	state := stateDir(t)
	args := []string{"run", src, "--state-dir", state, "--nix-store", t.TempDir()}

	code, out := proctest.Run(t, []string{"PATH=" + pathWithout(t, "nix-instantiate")}, args...)
	id := runEvalID(t, out)
	if code != 1 || !strings.Contains(out, fmt.Sprintf("evaluation %d failed", id)) {
		t.Fatalf("run without nix-instantiate exited %d, want 1 with evaluation %d failed:\n%s", code, id, out)
	}
	if !strings.Contains(out, "nix-instantiate") {
		t.Errorf("the failure does not name nix-instantiate:\n%s", out)
	}

	code, out = proctest.Run(t, nil, args...)
	if code != 0 {
		t.Fatalf("run with Nix back exited %d:\n%s", code, out)
	}
	if again := runEvalID(t, out); again != id {
		t.Errorf("the second run followed evaluation %d, want %d again (same snapshot)", again, id)
	}
	if want := fmt.Sprintf("re-evaluating evaluation %d (was failed: ", id); !strings.Contains(out, want) {
		t.Errorf("the second run does not say %q:\n%s", want, out)
	}
	rows := summaryRows(t, out)
	for _, attr := range []string{"a", "b", "c"} {
		if rows[attr].status != "succeeded" { // the summary table's word
			t.Errorf("%s: %+v after the re-evaluation, want succeeded:\n%s", attr, rows[attr], out)
		}
	}

	code, out = proctest.Run(t, nil, args...)
	if code != 0 || runEvalID(t, out) != id || strings.Contains(out, "re-evaluating") {
		t.Fatalf("a third run of the same files exited %d, want 0 reusing evaluation %d without re-evaluating:\n%s", code, id, out)
	}
}

// TestReevaluateEval: `harmonia-ci eval PROJECT --commit SHA --again` on a cluster (`up`) whose
// evaluator could not run Nix. With the cluster stopped it re-queues the failed evaluation
// under its id, and asked again only says it is queued; the restarted cluster evaluates it; and
// a succeeded evaluation is re-evaluated too, followed with --wait.
func TestReevaluateEval(t *testing.T) {
	nixtest.RequireNix(t)
	t.Parallel()
	state := stateDir(t)
	store := t.TempDir()
	listen := freeAddr(t)
	env := []string{"HARMONIA_DATABASE_URL="}
	cli := func(args ...string) (int, string) {
		t.Helper()
		return proctest.Run(t, env, append(args, "--state-dir", state)...)
	}
	up := func(name string, env []string) *proctest.Proc {
		t.Helper()
		p := proctest.Start(t, name, env, "up", "--state-dir", state, "--nix-store", store, "--listen", listen)
		waitHealthy(t, p, "http://"+listen)
		return p
	}
	stop := func(p *proctest.Proc) {
		t.Helper()
		p.Signal(t, syscall.SIGTERM)
		if code := p.Wait(t, time.Minute); code != 0 {
			t.Fatalf("%s exited %d after SIGTERM", p.Name, code)
		}
	}
	repo := nixtest.NewRepo(t)
	commit := repo.Commit("init", map[string]string{"ci.nix": ciNix(t.Name() + fmt.Sprint(time.Now().UnixNano()))})

	noNix := up("up without nix-instantiate", append([]string{"PATH=" + pathWithout(t, "nix-instantiate")}, env...))
	if code, out := cli("project", "add", "demo", "--repo", repo.Dir); code != 0 {
		t.Fatalf("project add: exit %d\n%s", code, out)
	}
	code, out := cli("eval", "demo", "--commit", commit, "--wait")
	id := evalID(t, out)
	if code == 0 || !strings.Contains(out, fmt.Sprintf("evaluation %d failed", id)) {
		t.Fatalf("eval --wait without nix-instantiate exited %d, want evaluation %d failed:\n%s", code, id, out)
	}
	stop(noNix)

	// No cluster runs: --again re-queues; asked again, it is already queued.
	code, out = cli("eval", "demo", "--commit", commit, "--again")
	if want := fmt.Sprintf("re-evaluating evaluation %d of demo at %s on main (was failed: ", id, commit[:12]); code != 0 || !strings.Contains(out, want) {
		t.Fatalf("eval --again exited %d, want 0 and %q:\n%s", code, want, out)
	}
	if e := showEvalJSON(t, cli, id); e.Status != status.EvalQueued || e.Error != "" || e.Attempt != 1 {
		t.Fatalf("after eval --again: %s at attempt %d, error %q; want queued at attempt 1 without error", e.Status, e.Attempt, e.Error)
	}
	code, out = cli("eval", "demo", "--commit", commit, "--again")
	if want := fmt.Sprintf("already queued, nothing to re-evaluate: evaluation %d of demo", id); code != 0 || !strings.Contains(out, want) {
		t.Fatalf("eval --again of a queued evaluation exited %d, want 0 and %q:\n%s", code, want, out)
	}

	withNix := up("up", env)
	if code, out := cli("eval", "show", strconv.FormatInt(id, 10), "--wait"); code != 0 {
		t.Fatalf("the re-queued evaluation did not succeed: exit %d\n%s", code, out)
	}
	code, out = cli("eval", "demo", "--commit", commit, "--again", "--wait")
	if want := fmt.Sprintf("re-evaluating evaluation %d of demo at %s on main (was succeeded)", id, commit[:12]); code != 0 || !strings.Contains(out, want) {
		t.Fatalf("eval --again --wait of the succeeded evaluation exited %d, want 0 and %q:\n%s", code, want, out)
	}
	e := showEvalJSON(t, cli, id)
	if e.Status != status.EvalSucceeded || e.Attempt != 3 {
		t.Errorf("after the second re-evaluation: %s at attempt %d, want succeeded at attempt 3", e.Status, e.Attempt)
	}
	wantAttrs(t, "re-evaluated", e.Attrs)
	// Re-evaluated in place: demo has this one evaluation and no other.
	var list []evalJSON
	decodeJSONOutput(t, mustCLI(t, cli, "eval", "list", "demo", "--json"), &list)
	if len(list) != 1 || list[0].ID != id {
		t.Errorf("evaluations of demo: %+v, want only %d", list, id)
	}
	stop(withNix)
}

var runEvalRE = regexp.MustCompile(`(?m)^evaluating .* \(evaluation (\d+), snapshot `)

// runEvalID is the evaluation `run` said it follows.
func runEvalID(t *testing.T, out string) int64 {
	t.Helper()
	m := runEvalRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("run did not name its evaluation:\n%s", out)
	}
	id, _ := strconv.ParseInt(m[1], 10, 64)
	return id
}

// showEvalJSON is `eval show ID --json`.
func showEvalJSON(t *testing.T, cli func(...string) (int, string), id int64) evalJSON {
	t.Helper()
	var e evalJSON
	decodeJSONOutput(t, mustCLI(t, cli, "eval", "show", strconv.FormatInt(id, 10), "--json"), &e)
	return e
}

func mustCLI(t *testing.T, cli func(...string) (int, string), args ...string) string {
	t.Helper()
	code, out := cli(args...)
	if code != 0 {
		t.Fatalf("harmonia-ci %s: exit %d\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

// pathWithout is a PATH of one directory holding a link to every program on this PATH but
// the missing ones: a machine where they are not installed, for a process started with it.
func pathWithout(t *testing.T, missing ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range filepath.SplitList(os.Getenv("PATH")) {
		entries, err := os.ReadDir(d)
		if err != nil || !filepath.IsAbs(d) {
			continue
		}
		for _, e := range entries {
			link := filepath.Join(dir, e.Name())
			if slices.Contains(missing, e.Name()) {
				continue
			}
			if _, err := os.Lstat(link); err == nil {
				continue // an earlier PATH entry wins, as in a lookup
			}
			if err := os.Symlink(filepath.Join(d, e.Name()), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}
