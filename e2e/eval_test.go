package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// ciCLI runs one-shot harmonia-ci commands against a fixture's database, with a state
// directory of their own (where `eval` keeps its repository mirrors).
type ciCLI struct {
	t     *testing.T
	f     *fixture
	state string
}

func newCLI(t *testing.T, f *fixture) *ciCLI {
	t.Helper()
	return &ciCLI{t: t, f: f, state: filepath.Join(t.TempDir(), "cli-state")}
}

// run runs harmonia-ci args and returns its exit code and combined output.
func (c *ciCLI) run(args ...string) (int, string) {
	c.t.Helper()
	args = append(args, "--config", c.f.cfgPath, "--database-url", c.f.dbURL, "--state-dir", c.state)
	return proctest.Run(c.t, nil, args...)
}

// ok runs args, failing the test unless they exit 0.
func (c *ciCLI) ok(args ...string) string {
	c.t.Helper()
	code, out := c.run(args...)
	if code != 0 {
		c.t.Fatalf("harmonia-ci %s: exit %d\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

// fails runs args, failing the test unless they exit non-zero with every one of want in the
// output.
func (c *ciCLI) fails(args []string, want ...string) string {
	c.t.Helper()
	code, out := c.run(args...)
	if code == 0 {
		c.t.Fatalf("harmonia-ci %s exited 0, want a failure\n%s", strings.Join(args, " "), out)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			c.t.Errorf("harmonia-ci %s: output does not contain %q:\n%s", strings.Join(args, " "), w, out)
		}
	}
	return out
}

// json runs args (which must exit 0) and decodes the JSON document they print into v.
func (c *ciCLI) json(v any, args ...string) {
	c.t.Helper()
	decodeJSONOutput(c.t, c.ok(args...), v)
}

// decodeJSONOutput decodes the JSON document in out: the one starting on the first line that
// opens an object or an array (anything before it is log output on stderr).
func decodeJSONOutput(t *testing.T, out string, v any) {
	t.Helper()
	start := -1
	for i := 0; i < len(out); i++ {
		if (i == 0 || out[i-1] == '\n') && (out[i] == '{' || out[i] == '[') {
			start = i
			break
		}
	}
	if start < 0 {
		t.Fatalf("no JSON in output:\n%s", out)
	}
	if err := json.NewDecoder(strings.NewReader(out[start:])).Decode(v); err != nil {
		t.Fatalf("decode JSON: %v\n%s", err, out)
	}
}

// evalJSON is `eval --json` and `eval show --json` output.
type evalJSON struct {
	evaluation.Evaluation
	Attrs []evaluation.AttrResult `json:"attrs"`
}

var queuedRE = regexp.MustCompile(`(?m)^(?:queued|already requested:) evaluation (\d+) of `)

// evalID is the evaluation id `eval` reported queueing (or finding already requested).
func evalID(t *testing.T, out string) int64 {
	t.Helper()
	m := queuedRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no evaluation id in output:\n%s", out)
	}
	id, _ := strconv.ParseInt(m[1], 10, 64)
	return id
}

// ciNix is a ci.nix of three derivations, a <- b <- c, whose hashes salt makes unique.
func ciNix(salt string) string {
	return nixtest.Lib(salt) + `
let a = mk "a" [ ]; b = mk "b" [ a ]; in { inherit a b; c = mk "c" [ a b ]; }
`
}

// wantAttrs checks that attrs are exactly a, b and c, each with a .drv path and no error, and
// returns their .drv paths.
func wantAttrs(t *testing.T, what string, attrs []evaluation.AttrResult) []string {
	t.Helper()
	var names, drvs []string
	for _, a := range attrs {
		names = append(names, a.Attr)
		if a.Error != "" || !strings.HasPrefix(a.DrvPath, nix.StoreDir+"/") || !strings.HasSuffix(a.DrvPath, "-"+a.Attr+".drv") {
			t.Errorf("%s: attribute %s has drv %q, error %q", what, a.Attr, a.DrvPath, a.Error)
		}
		drvs = append(drvs, a.DrvPath)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"a", "b", "c"}) {
		t.Errorf("%s: attributes %v, want a, b, c", what, names)
	}
	return drvs
}

// TestTwoEvaluatorsShareTheQueue: an evaluator node that also signs and serves the cache, and
// an evaluator-only node, on one database. Twelve evaluations of three projects, queued through
// the CLI while both nodes claim, each run exactly once, on one node or the other, and every
// .drv closure lands in the cache whichever node evaluated it.
func TestTwoEvaluatorsShareTheQueue(t *testing.T) {
	requireNix(t)
	nixtest.RequireNix(t)
	t.Parallel()
	dir := t.TempDir()
	cfg, env, _ := signerConfig(t, dir, "e2e-eval-1", "local")
	base, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg = proctest.WriteFile(t, "eval-node.toml", string(base)+"[node]\nmax_evals = 2\n[eval]\npoll_interval = \"500ms\"\n")
	f := newFixture(t, "")
	nodes := map[string]string{"eval-a": "frontend,evaluator,signer,cache", "eval-b": "evaluator"}
	for id, roles := range nodes {
		f.procs[id] = proctest.Start(t, id, nodeEnv(t, env, id, roles), "serve", "--config", cfg, "--database-url", f.dbURL, "--node-id", id,
			"--roles", roles, "--listen", "127.0.0.1:0", "--state-dir", filepath.Join(stateDir(t), id))
	}
	for id := range nodes {
		proctest.WaitFor(t, 30*time.Second, id+" active", func() bool { return f.nodeStatus(id) == status.NodeActive })
	}
	cacheURL := f.endpoint("eval-a")

	// Three projects of four branches each; every branch head has its own tree (so none is
	// skipped as a duplicate) and its own derivations.
	cli := newCLI(t, f)
	salt := fmt.Sprint(time.Now().UnixNano())
	const projects, branches = 3, 4
	for p := range projects {
		repo := nixtest.NewRepo(t)
		for b := range branches {
			repo.Commit(fmt.Sprintf("b%d", b), map[string]string{"ci.nix": ciNix(fmt.Sprintf("%s-p%d-b%d", salt, p, b))})
			repo.Git("branch", fmt.Sprintf("b%d", b))
		}
		cli.ok("project", "add", fmt.Sprintf("p%d", p), "--repo", repo.Dir)
	}
	type key struct{ project, branch string }
	queued := map[int64]key{}
	for b := range branches {
		for p := range projects {
			k := key{fmt.Sprintf("p%d", p), fmt.Sprintf("b%d", b)}
			out := cli.ok("eval", k.project, "--branch", k.branch)
			if !strings.Contains(out, "queued evaluation") {
				t.Fatalf("eval %s --branch %s did not queue a new evaluation:\n%s", k.project, k.branch, out)
			}
			queued[evalID(t, out)] = k
		}
	}
	if len(queued) != projects*branches {
		t.Fatalf("%d distinct evaluation ids for %d requests", len(queued), projects*branches)
	}

	ctx := context.Background()
	proctest.WaitFor(t, 45*time.Second, "every evaluation finished", func() bool {
		for id, p := range f.procs {
			if p.Exited() {
				t.Fatalf("%s exited:\n%s", id, p.Logs())
			}
		}
		var unfinished int
		if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM evaluations WHERE status IN ('queued', 'running')`).Scan(&unfinished); err != nil {
			t.Fatal(err)
		}
		return unfinished == 0
	})

	rows, err := f.pool.Query(ctx, `SELECT id, status, attempt, COALESCE(claimed_by, ''), COALESCE(error, '') FROM evaluations ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	type evalRow struct {
		id               int64
		status           status.EvalStatus
		attempt          int
		claimedBy, error string
	}
	var evals []evalRow
	for rows.Next() {
		var r evalRow
		if err := rows.Scan(&r.id, &r.status, &r.attempt, &r.claimedBy, &r.error); err != nil {
			t.Fatal(err)
		}
		evals = append(evals, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(evals) != len(queued) {
		t.Fatalf("%d evaluations in the table, %d queued", len(evals), len(queued))
	}
	perNode := map[string]int{}
	for _, e := range evals {
		if _, ok := queued[e.id]; !ok {
			t.Errorf("evaluation %d was never queued", e.id)
		}
		if e.status != status.EvalSucceeded || e.attempt != 1 || nodes[e.claimedBy] == "" {
			t.Errorf("evaluation %d (%v): %s at attempt %d by %q, error %q; want succeeded at attempt 1 by eval-a or eval-b",
				e.id, queued[e.id], e.status, e.attempt, e.claimedBy, e.error)
		}
		perNode[e.claimedBy]++
	}
	t.Logf("evaluations per node: %v", perNode)

	// Every evaluation's attributes, as `eval show --json` prints them and as the table holds
	// them; every .drv is distinct (each evaluation evaluated its own commit) and in the cache.
	seen := map[string]int64{}
	for id, k := range queued {
		var shown evalJSON
		cli.json(&shown, "eval", "show", strconv.FormatInt(id, 10), "--json")
		if shown.ID != id || shown.Project != k.project || shown.Branch != k.branch || shown.Status != status.EvalSucceeded || shown.Attempt != 1 {
			t.Errorf("eval show %d: %+v, want %v succeeded at attempt 1", id, shown.Evaluation, k)
		}
		drvs := wantAttrs(t, fmt.Sprintf("eval show %d", id), shown.Attrs)
		var inTable int
		if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM eval_attrs WHERE eval_id = $1 AND drv_path = ANY($2) AND error IS NULL`,
			id, drvs).Scan(&inTable); err != nil {
			t.Fatal(err)
		}
		if inTable != len(drvs) {
			t.Errorf("evaluation %d: %d of the %d attributes `eval show` printed are in eval_attrs", id, inTable, len(drvs))
		}
		for _, d := range drvs {
			if other, dup := seen[d]; dup {
				t.Errorf("%s evaluated by both evaluation %d and %d", d, other, id)
			}
			seen[d] = id
			sp, err := nix.ParseStorePath(d)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.Head(cacheURL + "/" + sp.Hash + ".narinfo")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("%s (evaluation %d) is not in the cache: HEAD narinfo = %d", d, id, resp.StatusCode)
			}
		}
	}
	var jobs int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM build_jobs`).Scan(&jobs); err != nil {
		t.Fatal(err)
	}
	if jobs != len(seen) {
		t.Errorf("%d build jobs for %d new derivations", jobs, len(seen))
	}
}

// TestEvalCLI: the project and eval commands as a user runs them against a node with the
// evaluator role, including every way they refuse.
func TestEvalCLI(t *testing.T) {
	requireNix(t)
	nixtest.RequireNix(t)
	t.Parallel()
	f := newFixture(t, "[eval]\npoll_interval = \"500ms\"\n")
	f.start("evaluator-1", "--roles", "evaluator")
	proctest.WaitFor(t, 30*time.Second, "evaluator-1 active", func() bool { return f.nodeStatus("evaluator-1") == status.NodeActive })
	cli := newCLI(t, f)

	repo := nixtest.NewRepo(t)
	salt := fmt.Sprint(time.Now().UnixNano())
	repo.Commit("good", map[string]string{"ci.nix": ciNix("cli-" + salt)})
	repo.Git("checkout", "-q", "-b", "broken")
	repo.Commit("syntax error", map[string]string{"ci.nix": nixtest.Lib("cli-broken-"+salt) + "\n{ a = mk \"a\" [ ]; b = ; }\n"})
	repo.Git("checkout", "-q", "main")

	// A relative path is stored absolute.
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(wd, repo.Dir)
	if err != nil {
		t.Fatal(err)
	}
	var added project.Project
	cli.json(&added, "project", "add", "web", "--repo", rel, "--json")
	if added.Name != "web" || added.RepoURL != repo.Dir || added.Branch != "main" || added.Shares != 100 || !added.Enabled {
		t.Fatalf("project add web --repo %s: %+v, want repository %s, branch main, 100 shares, enabled", rel, added, repo.Dir)
	}

	other := filepath.Join(t.TempDir(), "other")
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"same name", []string{"project", "add", "web", "--repo", other}, []string{"already", "web"}},
		{"same repository", []string{"project", "add", "web2", "--repo", repo.Dir}, []string{"already", repo.Dir}},
		{"bad name", []string{"project", "add", "bad name", "--repo", other}, []string{`project name "bad name"`}},
		{"option as repository", []string{"project", "add", "x1", "--repo=-x"}, []string{`"-x"`, "must not start with '-'"}},
		{"remote helper", []string{"project", "add", "x2", "--repo", "ext::sh"}, []string{`"ext::sh"`, `remote helper transport "ext"`}},
		{"bad branch", []string{"project", "add", "x3", "--repo", other, "--branch", "a..b"}, []string{`branch "a..b"`, `".."`}},
		{"zero shares", []string{"project", "add", "x4", "--repo", other, "--shares", "0"}, nil}, // 0 means the default
		{"negative shares", []string{"project", "add", "x5", "--repo", other, "--shares", "-3"}, []string{"shares must be at least 1"}},
		{"missing repository", []string{"project", "add", "x6"}, []string{`"repo"`}},
		{"set unknown project", []string{"project", "set", "ghost", "--shares", "3"}, []string{`"ghost"`, "no such project"}},
		{"set nothing", []string{"project", "set", "web"}, []string{"nothing to change"}},
		{"set zero shares", []string{"project", "set", "web", "--shares", "0"}, []string{"shares must be at least 1"}},
	} {
		if tc.want == nil {
			out := cli.ok(tc.args...)
			t.Logf("%s: %s", tc.name, strings.TrimSpace(out))
			continue
		}
		t.Logf("%s: %s", tc.name, strings.TrimSpace(cli.fails(tc.args, tc.want...)))
	}

	var listed []project.Project
	cli.json(&listed, "project", "list", "--json")
	names := func(ps []project.Project) []string {
		var ns []string
		for _, p := range ps {
			ns = append(ns, p.Name)
		}
		return ns
	}
	if !slices.Equal(names(listed), []string{"web", "x4"}) || listed[0] != added {
		t.Fatalf("project list --json: %+v, want web as added and x4 (refused adds leave nothing)", listed)
	}
	if listed[1].Shares != 100 {
		t.Errorf("project x4 added with --shares 0 has %d shares, want the default 100", listed[1].Shares)
	}
	cli.ok("project", "set", "web", "--shares", "7")
	cli.json(&listed, "project", "list", "--json")
	if listed[0].Name != "web" || listed[0].Shares != 7 || listed[0].Branch != "main" || !listed[0].Enabled {
		t.Fatalf("after project set web --shares 7: %+v", listed[0])
	}
	if !listed[0].PromotePROutputs {
		t.Fatalf("project web does not promote pull requests' outputs by default: %+v", listed[0])
	}
	cli.ok("project", "set", "web", "--promote-pr-outputs=false")
	cli.json(&listed, "project", "list", "--json")
	if listed[0].PromotePROutputs || listed[0].Shares != 7 {
		t.Fatalf("after project set web --promote-pr-outputs=false: %+v", listed[0])
	}

	// An evaluation, followed to its end.
	var done evalJSON
	cli.json(&done, "eval", "web", "--wait", "--json")
	head := repo.Git("rev-parse", "main")
	if done.Status != status.EvalSucceeded || done.Project != "web" || done.Branch != "main" || done.Commit != head ||
		done.Attempt != 1 || done.ClaimedBy != "evaluator-1" || done.FinishedAt == nil {
		t.Fatalf("eval web --wait --json: %+v, want succeeded at %s by evaluator-1", done.Evaluation, head)
	}
	wantAttrs(t, "eval web --wait --json", done.Attrs)

	// The same commit and branch again is the same evaluation.
	out := cli.ok("eval", "web")
	if !strings.Contains(out, fmt.Sprintf("already requested: evaluation %d of web at %s on main", done.ID, head[:12])) {
		t.Fatalf("eval web a second time does not report evaluation %d as already requested:\n%s", done.ID, out)
	}
	var again evalJSON
	cli.json(&again, "eval", "web", "--commit", head[:10], "--json")
	if again.ID != done.ID || again.Status != status.EvalSucceeded {
		t.Fatalf("eval web --commit %s: evaluation %d (%s), want %d", head[:10], again.ID, again.Status, done.ID)
	}
	var shown evalJSON
	cli.json(&shown, "eval", "show", strconv.FormatInt(done.ID, 10), "--json")
	if shown.ID != done.ID || shown.Status != status.EvalSucceeded || len(shown.Attrs) != len(done.Attrs) {
		t.Fatalf("eval show %d --json: %+v", done.ID, shown)
	}

	// Refusals, each naming what is wrong.
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"eval", "cancel", strconv.FormatInt(done.ID, 10)}, []string{fmt.Sprintf("evaluation %d", done.ID), "already finished"}},
		{[]string{"eval", "cancel", "999999"}, []string{"evaluation 999999", "no such evaluation"}},
		{[]string{"eval", "cancel", "abc"}, []string{`"abc"`}},
		{[]string{"eval", "show", "999999"}, []string{"evaluation 999999", "no such evaluation"}},
		{[]string{"eval", "unknown-project"}, []string{`"unknown-project"`, "no such project"}},
		{[]string{"eval", "web", "--branch", "nope"}, []string{`branch "nope" not found`}},
		{[]string{"eval", "web", "--branch", "a..b"}, []string{`branch "a..b"`}},
		{[]string{"eval", "web", "--commit", "deadbeefdeadbeef"}, []string{"deadbeefdeadbeef", "not found"}},
		{[]string{"eval", "web", "--commit", "HEAD~1"}, []string{`"HEAD~1"`}},
	} {
		cli.fails(tc.args, tc.want...)
	}
	// Nothing above queued anything or touched the finished evaluation.
	var list []evaluation.Evaluation
	cli.json(&list, "eval", "list", "--json")
	if len(list) != 1 || list[0].ID != done.ID || list[0].Status != status.EvalSucceeded {
		t.Fatalf("eval list --json after the refusals: %+v, want only evaluation %d, succeeded", list, done.ID)
	}

	// A syntax error in ci.nix fails the evaluation: --wait exits non-zero, and the error is
	// recorded for eval show.
	out = cli.fails([]string{"eval", "web", "--branch", "broken", "--wait"}, "failed", "error:")
	brokenID := evalID(t, out)
	cli.json(&shown, "eval", "show", strconv.FormatInt(brokenID, 10), "--json")
	if shown.Status != status.EvalFailed || shown.Branch != "broken" || !strings.Contains(shown.Error, "syntax error") || len(shown.Attrs) != 0 {
		t.Fatalf("eval show %d --json of the broken commit: status %s, error %q, attrs %v; want failed with the syntax error",
			brokenID, shown.Status, shown.Error, shown.Attrs)
	}
	if !strings.Contains(out, shown.Error[:min(len(shown.Error), 40)]) {
		t.Errorf("eval --wait of the broken commit does not print the error %q:\n%s", shown.Error, out)
	}
	cli.json(&list, "eval", "list", "web", "--json")
	if len(list) != 2 || list[0].ID != brokenID || list[1].ID != done.ID {
		t.Fatalf("eval list web --json: %+v, want evaluations %d and %d, newest first", list, brokenID, done.ID)
	}
}
