package webui

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

const evalTestCommit = "0123456789abcdef0123456789abcdef01234567"

// evalFixture is a test UI serving the evaluation and build pages, on a database with the
// project "proj" (Gitea repository o/r), and helpers inserting the rows the pages read.
type evalFixture struct {
	t       *testing.T
	ctx     context.Context
	u       *UI
	h       http.Handler
	pool    *pgxpool.Pool
	project int64
	drvs    int
}

func newEvalFixture(t *testing.T) *evalFixture {
	t.Helper()
	u, pool := newTestUI(t)
	mux := http.NewServeMux()
	rt := access.NewRoutes(mux, nil)
	rt.Use(u.rule, u.Caller)
	u.registerEvalPages(rt)
	fx := &evalFixture{t: t, ctx: t.Context(), u: u, h: mux, pool: pool}
	fx.project = fx.newProject("proj", "gitea", "o/r")
	return fx
}

func (fx *evalFixture) exec(sql string, args ...any) {
	fx.t.Helper()
	if _, err := fx.pool.Exec(fx.ctx, sql, args...); err != nil {
		fx.t.Fatalf("%s: %v", sql, err)
	}
}

func (fx *evalFixture) id(sql string, args ...any) int64 {
	fx.t.Helper()
	var id int64
	if err := fx.pool.QueryRow(fx.ctx, sql, args...).Scan(&id); err != nil {
		fx.t.Fatalf("%s: %v", sql, err)
	}
	return id
}

func (fx *evalFixture) newProject(name, forgeName, fullName string) int64 {
	fx.t.Helper()
	owner, repo, _ := strings.Cut(fullName, "/")
	r := fx.id(`INSERT INTO repositories (forge, owner, name, full_name, clone_url) VALUES ($1, $2, $3, $4, $5)
RETURNING id`, forgeName, owner, repo, fullName, "https://x/"+fullName+".git")
	return fx.id(`INSERT INTO projects (repo_id, name) VALUES ($1, $2) RETURNING id`, r, name)
}

// newEval inserts a running evaluation of evalTestCommit on branch main.
func (fx *evalFixture) newEval(project int64) int64 {
	fx.t.Helper()
	return fx.id(`INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status, started_at)
VALUES ($1, 'git+https://x/o/r.git', $2, 'main', 'running', now()) RETURNING id`, project, evalTestCommit)
}

// drv inserts a derivation named name.
func (fx *evalFixture) drv(name string) string {
	fx.t.Helper()
	fx.drvs++
	hash := fmt.Sprintf("%032d", fx.drvs)
	path := "/nix/store/" + hash + "-" + name + ".drv"
	fx.exec(`INSERT INTO derivations (drv_path, hash_part, name, system, nar_hash, nar_size)
VALUES ($1, $2, $3, 'x86_64-linux', 'sha256:0', 0)`, path, hash, name)
	return path
}

// dep makes input an input of referrer.
func (fx *evalFixture) dep(referrer, input string) {
	fx.t.Helper()
	fx.exec(`INSERT INTO derivation_inputs (referrer, input_drv, outputs) VALUES ($1, $2, '{out}')`, referrer, input)
}

// attr inserts an attribute of evaluation id and returns its row id; drv "" is an attribute
// that failed to evaluate.
func (fx *evalFixture) attr(id int64, name, drv string) int64 {
	fx.t.Helper()
	if drv == "" {
		return fx.id(`INSERT INTO eval_attrs (eval_id, attr, error) VALUES ($1, $2, 'error: boom') RETURNING id`, id, name)
	}
	return fx.id(`INSERT INTO eval_attrs (eval_id, attr, drv_path) VALUES ($1, $2, $3) RETURNING id`, id, name, drv)
}

// jobSpec is a build job to insert: a status and, for one that ran, its run.
type jobSpec struct {
	status         status.JobStatus
	node           string
	claimed, ended time.Duration // after jobEpoch; ended 0: not finished
	attempt        int
	exitCode       *int
	errorMessage   string
	logURL         string
}

// jobEpoch is when the test builds start.
var jobEpoch = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// job inserts drv's build job and returns its id.
func (fx *evalFixture) job(drv string, s jobSpec) int64 {
	fx.t.Helper()
	var claimedBy *string
	var claimedAt, finishedAt *time.Time
	if s.node != "" {
		claimedBy = &s.node
		c := jobEpoch.Add(s.claimed)
		claimedAt = &c
	}
	if s.ended != 0 {
		f := jobEpoch.Add(s.ended)
		finishedAt = &f
	}
	return fx.id(`INSERT INTO build_jobs (drv_path, project_id, system, status, claimed_by, claimed_at, started_at,
    finished_at, attempt, exit_code, error_message, log_url)
VALUES ($1, $2, 'x86_64-linux', $3, $4, $5, $5, $6, $7, $8, NULLIF($9, ''), NULLIF($10, '')) RETURNING id`,
		drv, fx.project, s.status, claimedBy, claimedAt, finishedAt, s.attempt, s.exitCode, s.errorMessage, s.logURL)
}

// get GETs path and fails unless the answer is want.
func (fx *evalFixture) get(path string, want int) string {
	fx.t.Helper()
	code, body := get(fx.t, fx.h, path)
	if code != want {
		fx.t.Fatalf("GET %s: %d, want %d; body:\n%s", path, code, want, body)
	}
	return body
}

// rowAttrs are the attribute names of an evaluation page's rows, in order.
var rowAttrRe = regexp.MustCompile(`(?s)<tr id="attr-\d+">\s*<td class="attr"><span class="mono">([^<]*)</span>`)

func rowAttrs(body string) []string {
	var names []string
	for _, m := range rowAttrRe.FindAllStringSubmatch(body, -1) {
		names = append(names, m[1])
	}
	return names
}

// rowOf is the <tr> of attribute row id.
func rowOf(t *testing.T, body string, id int64) string {
	t.Helper()
	start := strings.Index(body, fmt.Sprintf(`<tr id="attr-%d">`, id))
	if start < 0 {
		t.Fatalf("no row attr-%d in:\n%s", id, body)
	}
	end := strings.Index(body[start:], "</tr>")
	return body[start : start+end]
}

// evalScenario is an evaluation with an attribute of each kind.
type evalScenario struct {
	eval   int64
	rows   map[string]int64 // attr name → eval_attrs id
	jobs   map[string]int64 // derivation name → job id
	nodeOf map[int64]string // job id → builder, for the claimed ones
}

// newScenario inserts evaluation "eval" of proj:
//
//	ok      succeeded on node-a
//	cached  no job
//	broken  failed to evaluate
//	busy    building on node-b
//	waiting pending
//	bad     failed on node-a (exit 1)
//	top     dep-failed, because of lib (failed on node-b), through mid (dep-failed)
//
// lib is no attribute: it is in top's closure only.
func (fx *evalFixture) newScenario() evalScenario {
	fx.t.Helper()
	s := evalScenario{rows: map[string]int64{}, jobs: map[string]int64{}, nodeOf: map[int64]string{}}
	s.eval = fx.newEval(fx.project)
	one := 1
	specs := []struct {
		attr string
		spec *jobSpec // nil: no job
	}{
		{"ok", &jobSpec{status: status.JobSucceeded, node: "node-a", claimed: 0, ended: 2 * time.Minute, attempt: 1}},
		{"cached", nil},
		{"busy", &jobSpec{status: status.JobBuilding, node: "node-b", claimed: 3 * time.Minute, attempt: 1}},
		{"waiting", &jobSpec{status: status.JobPending}},
		{"bad", &jobSpec{status: status.JobFailed, node: "node-a", claimed: time.Minute, ended: 4 * time.Minute, attempt: 1,
			exitCode: &one, errorMessage: "builder failed with exit code 1"}},
	}
	for _, sp := range specs {
		d := fx.drv(sp.attr)
		s.rows[sp.attr] = fx.attr(s.eval, sp.attr, d)
		if sp.spec != nil {
			id := fx.job(d, *sp.spec)
			s.jobs[sp.attr] = id
			if sp.spec.node != "" {
				s.nodeOf[id] = sp.spec.node
			}
		}
	}
	s.rows["broken"] = fx.attr(s.eval, "broken", "")

	lib, mid, top := fx.drv("lib"), fx.drv("mid"), fx.drv("top")
	fx.dep(top, mid)
	fx.dep(mid, lib)
	s.jobs["lib"] = fx.job(lib, jobSpec{status: status.JobFailed, node: "node-b", claimed: 30 * time.Second, ended: 90 * time.Second, attempt: 1})
	s.nodeOf[s.jobs["lib"]] = "node-b"
	s.jobs["mid"] = fx.job(mid, jobSpec{status: status.JobDepFailed})
	s.jobs["top"] = fx.job(top, jobSpec{status: status.JobDepFailed})
	s.rows["top"] = fx.attr(s.eval, "top", top)
	return s
}

func TestEvalPageShowsEveryAttribute(t *testing.T) {
	t.Parallel()
	fx := newEvalFixture(t)
	s := fx.newScenario()
	fx.exec(`UPDATE evaluations SET branch = 'pull/7', pr_number = 7, pr_author = 'alice', claimed_by = 'eval-1',
    nix_version = '2.26.3', workers = 4, worker_memory = 2147483648, worker_restarts = 3 WHERE id = $1`, s.eval)
	body := fx.get(fmt.Sprintf("/ci/proj/eval/%d", s.eval), http.StatusOK)
	if nix := element(t, body, "dd", "eval-nix"); !strings.Contains(nix, "Nix 2.26.3") || !strings.Contains(nix, "eval-1") {
		t.Errorf("the page does not say which Nix evaluated, on which node: %s", nix)
	}
	if w := element(t, body, "dd", "eval-workers"); !strings.Contains(w, "4 × 2048 MiB") || !strings.Contains(w, "8192 MiB") ||
		!strings.Contains(w, "3 restarted") {
		t.Errorf("the page does not show the walkers, their memory and restarts: %s", w)
	}

	if got, want := rowAttrs(body), []string{"bad", "broken", "busy", "cached", "ok", "top", "waiting"}; !slices.Equal(got, want) {
		t.Errorf("rows %q, want %q", got, want)
	}
	rows := []struct {
		attr, badge string
		builder     string
		job         string // the job whose build page the row links to; "" for none
	}{
		{"ok", `<span class="badge ok">succeeded</span>`, "node-a", "ok"},
		{"cached", `<span class="badge ok">cached</span>`, "", ""},
		{"broken", `<span class="badge bad">eval error</span>`, "", ""},
		{"busy", `<span class="badge busy">building</span>`, "node-b", "busy"},
		{"waiting", `<span class="badge wait">pending</span>`, "", "waiting"},
		{"bad", `<span class="badge bad">failed</span>`, "node-a", "bad"},
		{"top", `<span class="badge bad">dep-failed</span>`, "", "top"},
	}
	for _, r := range rows {
		row := rowOf(t, body, s.rows[r.attr])
		if !strings.Contains(row, r.badge) {
			t.Errorf("row %s: no %s in\n%s", r.attr, r.badge, row)
		}
		if r.builder != "" && !strings.Contains(row, "<td>"+r.builder+"</td>") {
			t.Errorf("row %s: builder %s missing in\n%s", r.attr, r.builder, row)
		}
		link := fmt.Sprintf(`/ci/proj/build/%d"`, s.jobs[r.job])
		if has := strings.Contains(row, `href="`+link); has != (r.job != "") {
			t.Errorf("row %s: link %s present %v, want %v:\n%s", r.attr, link, has, r.job != "", row)
		}
	}
	if row := rowOf(t, body, s.rows["ok"]); !strings.Contains(row, `<td class="num">2m00s</td>`) {
		t.Errorf("row ok: no duration 2m00s:\n%s", row)
	}
	if row := rowOf(t, body, s.rows["broken"]); !strings.Contains(row, "error: boom") {
		t.Errorf("row broken: no evaluation error:\n%s", row)
	}
	// The dep-failed attribute names the failure below it that caused it, not the dep-failed
	// job in between.
	cause := fmt.Sprintf(`because of <a href="/ci/proj/build/%d">lib</a>`, s.jobs["lib"])
	if row := rowOf(t, body, s.rows["top"]); !strings.Contains(row, cause) {
		t.Errorf("row top: no %s in\n%s", cause, row)
	}

	for _, want := range []string{
		"PR #7 by alice",
		`href="` + testForgeURL + "/o/r/commit/" + evalTestCommit + `"`,
		`<span class="badge busy">running</span>`, // the evaluation's status
		`sse-connect="/api/events/eval/` + fmt.Sprint(s.eval) + `?since=`,
		`hx-ext="sse"`,
		`<div class="actions">`,
		`<a href="?tab=failed">Failed <span class="count">3</span></a>`,
		`<a href="?" aria-current="page">All <span class="count">7</span></a>`,
		`<span class="badge bad">2 dep-failed</span>`, // the closure's jobs, mid included
	} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %s", want)
		}
	}
}

func TestEvalPageTabs(t *testing.T) {
	t.Parallel()
	fx := newEvalFixture(t)
	s := fx.newScenario()
	for _, tc := range []struct {
		tab  string
		want []string
	}{
		{"", []string{"bad", "broken", "busy", "cached", "ok", "top", "waiting"}},
		{"all", []string{"bad", "broken", "busy", "cached", "ok", "top", "waiting"}},
		{"failed", []string{"bad", "broken", "top"}},
		{"building", []string{"busy"}},
		{"pending", []string{"waiting"}},
		{"succeeded", []string{"cached", "ok"}},
	} {
		t.Run(tc.tab, func(t *testing.T) {
			body := fx.get(fmt.Sprintf("/ci/proj/eval/%d?tab=%s", s.eval, tc.tab), http.StatusOK)
			if got := rowAttrs(body); !slices.Equal(got, tc.want) {
				t.Errorf("rows %q, want %q", got, tc.want)
			}
		})
	}
	fx.get(fmt.Sprintf("/ci/proj/eval/%d?tab=nope", s.eval), http.StatusBadRequest)
}

func TestEvalAndBuildPagesNotFound(t *testing.T) {
	t.Parallel()
	fx := newEvalFixture(t)
	s := fx.newScenario()
	fx.newProject("other", "git", "x/other")
	for _, path := range []string{
		"/ci/proj/eval/999999",
		fmt.Sprintf("/ci/other/eval/%d", s.eval), // an evaluation of another project
		fmt.Sprintf("/ci/nope/eval/%d", s.eval),
		"/ci/proj/eval/abc",
		"/ci/proj/eval/-1",
		"/ci/proj/build/999999",
		fmt.Sprintf("/ci/nope/build/%d", s.jobs["ok"]), // a project that does not exist
		"/ci/proj/build/1x",
		"/ci/proj/elsewhere/1",
		fmt.Sprintf("/ci/proj/eval/%d/more", s.eval),
	} {
		body := fx.get(path, http.StatusNotFound)
		if !strings.Contains(body, `<section class="error">`) {
			t.Errorf("GET %s: not the error page:\n%s", path, body)
		}
	}
	// The project of a build's URL is cosmetic, as long as it exists.
	fx.get(fmt.Sprintf("/ci/other/build/%d", s.jobs["ok"]), http.StatusOK)
}

func TestEvalPageLoadMore(t *testing.T) {
	t.Parallel()
	fx := newEvalFixture(t)
	e := fx.newEval(fx.project)
	const n = attrPageSize + 5
	// One statement: 205 attributes (a.000 … a.204), every third with a failed job.
	fx.exec(`
WITH d AS (
    INSERT INTO derivations (drv_path, hash_part, name, system, nar_hash, nar_size)
    SELECT '/nix/store/' || lpad(i::text, 32, '0') || '-p' || i || '.drv', lpad(i::text, 32, '0'), 'p' || i,
           'x86_64-linux', 'sha256:0', 0
    FROM generate_series(0, $2 - 1) i
    RETURNING drv_path, name
), a AS (
    INSERT INTO eval_attrs (eval_id, attr, drv_path)
    SELECT $1, 'a.' || lpad(substr(name, 2), 3, '0'), drv_path FROM d
)
INSERT INTO build_jobs (drv_path, system, status, finished_at)
SELECT drv_path, 'x86_64-linux', 'failed', now() FROM d WHERE substr(name, 2)::int % 3 = 0`, e, n)

	first := fx.get(fmt.Sprintf("/ci/proj/eval/%d", e), http.StatusOK)
	rows := rowAttrs(first)
	if len(rows) != attrPageSize || rows[0] != "a.000" || rows[len(rows)-1] != "a.199" {
		t.Fatalf("first page: %d rows %q … %q, want %d from a.000 to a.199", len(rows), rows[0], rows[len(rows)-1], attrPageSize)
	}
	more := regexp.MustCompile(`<a class="more" href="([^"]*)">Load more</a>`).FindStringSubmatch(first)
	if more == nil || more[1] != "?after=a.199" {
		t.Fatalf("Load more link %q, want ?after=a.199", more)
	}
	second := fx.get(fmt.Sprintf("/ci/proj/eval/%d%s", e, more[1]), http.StatusOK)
	if got, want := rowAttrs(second), []string{"a.200", "a.201", "a.202", "a.203", "a.204"}; !slices.Equal(got, want) {
		t.Errorf("second page %q, want %q", got, want)
	}
	if strings.Contains(second, "Load more") {
		t.Error("the last page links to more")
	}
	// A tab filters every page: 35 failed attributes come after a.100.
	failed := fx.get(fmt.Sprintf("/ci/proj/eval/%d?tab=failed&after=a.100", e), http.StatusOK)
	if got := rowAttrs(failed); len(got) != 35 || got[0] != "a.102" || strings.Contains(failed, "Load more") {
		t.Errorf("failed after a.100: %d rows %q, want 35 from a.102 and no more", len(got), got)
	}
}

func TestEvalPageEscapesAttributeNames(t *testing.T) {
	t.Parallel()
	fx := newEvalFixture(t)
	e := fx.newEval(fx.project)
	hostile := `<script>alert("x")</script>`
	fx.attr(e, hostile, fx.drv("p"))
	body := fx.get(fmt.Sprintf("/ci/proj/eval/%d", e), http.StatusOK)
	if strings.Contains(body, hostile) || strings.Contains(body, "<script>alert") {
		t.Fatalf("the attribute name reached the page unescaped:\n%s", body)
	}
	if !strings.Contains(body, `&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;`) {
		t.Errorf("the escaped attribute name is missing:\n%s", body)
	}
}

func TestAttrRowsOfDerivations(t *testing.T) {
	t.Parallel()
	fx := newEvalFixture(t)
	s := fx.newScenario()
	var busy string
	if err := fx.pool.QueryRow(fx.ctx, `SELECT drv_path FROM build_jobs WHERE id = $1`, s.jobs["busy"]).Scan(&busy); err != nil {
		t.Fatal(err)
	}
	all, err := fx.u.attrRows(fx.ctx, s.eval, nil)
	if err != nil || len(all) != 7 {
		t.Fatalf("attrRows(nil) = %d rows, %v; want 7", len(all), err)
	}
	rows, err := fx.u.attrRows(fx.ctx, s.eval, []string{busy, "/nix/store/00000000000000000000000000000000-none.drv"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].ID != s.rows["busy"] || rows[0].Status != string(status.JobBuilding) || rows[0].ClaimedBy != "node-b" ||
		rows[0].Project != "proj" || rows[0].JobID != s.jobs["busy"] {
		t.Fatalf("attrRows(busy) = %+v", rows)
	}
	if rows, err := fx.u.attrRows(fx.ctx, s.eval, []string{}); err != nil || len(rows) != 0 {
		t.Errorf("attrRows(none) = %+v, %v; want nothing", rows, err)
	}
	// The live updates render a row alone with the template "attr-row" of any page.
	var b bytes.Buffer
	if err := fx.u.pages["eval"].ExecuteTemplate(&b, "attr-row", rows[0]); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(b.String()); !strings.HasPrefix(got, fmt.Sprintf(`<tr id="attr-%d">`, s.rows["busy"])) ||
		!strings.Contains(got, `<span class="badge busy">building</span>`) {
		t.Errorf("attr-row rendered\n%s", got)
	}
}

// TestEvalPagesRegister checks the pages' routes live with the rest of the UI's on one mux.
func TestEvalPagesRegister(t *testing.T) {
	t.Parallel()
	u, _ := newTestUI(t)
	mux := testMux(u)
	if code, _ := get(t, mux, "/ci/static/style.css"); code != http.StatusOK {
		t.Errorf("GET /ci/static/style.css: %d", code)
	}
	if code, _ := get(t, mux, "/ci/proj/eval/1"); code != http.StatusNotFound {
		t.Errorf("GET /ci/proj/eval/1 of no project: %d, want 404", code)
	}
}

// A pull request's evaluation says what it evaluated: the merge into its base, the conflict,
// or the head alone.
func TestEvalPageShowsMerge(t *testing.T) {
	t.Parallel()
	base, merge := strings.Repeat("b", 40), strings.Repeat("c", 40)
	for _, tt := range []struct {
		name, base, merge, want string
	}{
		{"merged", base, merge, "merged into main at <span class=\"mono\" title=\"" + base + "\">bbbbbbbbbbbb</span>"},
		{"conflict", base, "", "not: it conflicts with main"},
		{"head", "", "", "the head alone"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fx := newEvalFixture(t)
			e := fx.newEval(fx.project)
			fx.exec(`UPDATE evaluations SET pr_number = 4, pr_base = 'main', base_commit = $2, merge_commit = $3 WHERE id = $1`, e, tt.base, tt.merge)
			body := fx.get(fmt.Sprintf("/ci/proj/eval/%d", e), http.StatusOK)
			if !strings.Contains(body, tt.want) {
				t.Errorf("the page does not say %q:\n%s", tt.want, body)
			}
			if tt.merge != "" && !strings.Contains(body, "cccccccccccc") {
				t.Error("the page does not name the merge")
			}
		})
	}
}

// The evaluation page says what changed against the evaluation before it, and names the
// attributes.
func TestEvalPageShowsDiff(t *testing.T) {
	fx := newEvalFixture(t)
	first := fx.id(`INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status)
VALUES ($1, 'x', repeat('1', 40), 'main', 'succeeded') RETURNING id`, fx.project)
	second := fx.id(`INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status)
VALUES ($1, 'x', repeat('2', 40), 'main', 'succeeded') RETURNING id`, fx.project)
	for e, spec := range map[int64]jobSpec{first: {status: status.JobSucceeded, node: "b1", ended: 1},
		second: {status: status.JobFailed, node: "b1", ended: 1}} {
		d := fx.drv(fmt.Sprint("hello-", e))
		fx.attr(e, "hello", d)
		fx.job(d, spec)
	}
	fx.attr(first, "gone", "")

	body := fx.get(fmt.Sprintf("/ci/proj/eval/%d", second), http.StatusOK)
	diff := regexp.MustCompile(`(?s)<dd id="eval-diff">(.*?)</dd>`).FindStringSubmatch(body)
	if diff == nil {
		t.Fatalf("no diff on the second evaluation's page:\n%s", body)
	}
	for _, want := range []string{fmt.Sprintf(`/ci/proj/eval/%d">evaluation #%d</a>: 1 newly failing, 1 removed`, first, first),
		`newly failing</span> <span class="mono">hello</span>`, `removed</span> <span class="mono">gone</span>`} {
		if !strings.Contains(diff[1], want) {
			t.Errorf("diff %q lacks %q", diff[1], want)
		}
	}
	if body := fx.get(fmt.Sprintf("/ci/proj/eval/%d", first), http.StatusOK); strings.Contains(body, `id="eval-diff"`) {
		t.Error("the first evaluation has a diff")
	}
}
