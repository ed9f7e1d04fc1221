package apiv1_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/klauspost/compress/zstd"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/apiv1"
	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

const adminToken = "api-admin-token"

// fixture is a server with the API's routes on a fresh database and a local blob store, a
// public project "open" and a private one "hush".
//
// open's evaluation eval has the attributes a-ok (built), b-fail (failed, its log archived),
// c-dep (dep-failed on b-fail's derivation), d-evalerr (did not evaluate), e-cached (no build)
// and f-running (building, a live tail); a pull request's evaluation prEval is newer. hush
// has an evaluation hushEval with a failed build hushJob and a pending job in the queue.
type fixture struct {
	t     *testing.T
	pool  *pgxpool.Pool
	store *blob.Local
	srv   *httptest.Server
	api   *apiv1.API
	rt    *access.Routes

	open, hush                       int64
	eval, prEval, hushEval           int64
	okJob, failJob, depJob, runJob   int64
	hushJob, hushPending, openQueued int64
	n                                int
}

// failLog is b-fail's archived log: 10 KiB of lines, then its last line.
var failLog = strings.Repeat("compiling something rather long\n", 320) + "error: b-fail's LAST LINE\n"

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool := dbtest.NewPool(t)
	store, err := blob.NewLocal(t.TempDir(), "", []byte("0123456789abcdef0123"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	fx := &fixture{t: t, pool: pool, store: store}
	adminHash := httpapi.HashToken(adminToken)
	fx.rt = access.NewRoutes(http.NewServeMux(), nil)
	fx.rt.Use(&access.Rule{DB: pool}, func(r *http.Request) access.Caller {
		if tok, ok := httpapi.BearerToken(r); ok && adminHash.Matches(tok) {
			return access.Caller{Kind: access.AdminToken, Admin: true}
		}
		return access.Caller{}
	})
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	fx.api = apiv1.New(apiv1.Config{Pool: pool, Tail: apiv1.StoreTail(pool, store), Logger: logger})
	fx.api.Register(fx.rt)
	fx.srv = httptest.NewServer(fx.rt)
	t.Cleanup(fx.srv.Close)
	fx.seed()
	return fx
}

func (fx *fixture) id(sql string, args ...any) int64 {
	fx.t.Helper()
	var id int64
	if err := fx.pool.QueryRow(fx.t.Context(), sql, args...).Scan(&id); err != nil {
		fx.t.Fatalf("%s: %v", sql, err)
	}
	return id
}

func (fx *fixture) project(name string, private bool) int64 {
	r := fx.id(`INSERT INTO repositories (forge, owner, name, full_name, clone_url, is_private, default_branch)
VALUES ('gitea', 'o', $1, 'o/' || $1, 'https://x/o/' || $1 || '.git', $2, 'main') RETURNING id`, name, private)
	return fx.id(`INSERT INTO projects (repo_id, name) VALUES ($1, $2) RETURNING id`, r, name)
}

// evalOf records an evaluation of project p (a pull request's when pr > 0).
func (fx *fixture) evalOf(p int64, branch string, pr int, status string) int64 {
	fx.n++
	return fx.id(`INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status, pr_number, pr_author,
    started_at, finished_at)
VALUES ($1, 'x', lpad($2::int::text, 40, '0'), $3, $4, NULLIF($5, 0), CASE WHEN $5 > 0 THEN 'ann' END, now(),
    CASE WHEN $4 IN ('succeeded', 'failed') THEN now() END) RETURNING id`, p, fx.n, branch, status, pr)
}

// drv records a derivation named name and returns its path.
func (fx *fixture) drv(name string) string {
	fx.n++
	hash := fmt.Sprintf("%032d", fx.n)
	path := "/nix/store/" + hash + "-" + name + ".drv"
	fx.id(`INSERT INTO derivations (drv_path, hash_part, name, system, nar_hash, nar_size)
VALUES ($1, $2, $3, 'x86_64-linux', 'sha256:0', 0) RETURNING 1`, path, hash, name)
	return path
}

// job records a build job of drv for project p.
func (fx *fixture) job(drv string, p int64, status string) int64 {
	return fx.id(`INSERT INTO build_jobs (drv_path, project_id, system, status, claimed_by, attempt, started_at,
    finished_at, exit_code, error_message)
VALUES ($1, $2, 'x86_64-linux', $3, CASE WHEN $3 <> 'pending' THEN 'builder-1' END,
    CASE WHEN $3 <> 'pending' THEN 1 ELSE 0 END, CASE WHEN $3 <> 'pending' THEN now() - interval '90 seconds' END,
    CASE WHEN $3 IN ('succeeded', 'failed', 'dep-failed') THEN now() END,
    CASE WHEN $3 = 'failed' THEN 1 END, CASE WHEN $3 = 'failed' THEN 'builder failed with exit code 1' END)
RETURNING id`, drv, p, status)
}

func (fx *fixture) attr(eval int64, name, drv, evalErr string) {
	fx.id(`INSERT INTO eval_attrs (eval_id, attr, drv_path, error) VALUES ($1, $2, NULLIF($3, ''), NULLIF($4, '')) RETURNING id`,
		eval, name, drv, evalErr)
}

// archive stores text as drv's log, zstd-compressed as builders upload it, and records it.
func (fx *fixture) archive(job int64, drv, text string) {
	fx.t.Helper()
	var buf bytes.Buffer
	enc, err := zstd.NewWriter(&buf)
	if err != nil {
		fx.t.Fatal(err)
	}
	_, _ = enc.Write([]byte(text))
	if err := enc.Close(); err != nil {
		fx.t.Fatal(err)
	}
	key := "log/" + strings.TrimPrefix(drv, "/nix/store/")
	if err := fx.store.Put(fx.t.Context(), key, &buf, int64(buf.Len()), blob.PutOptions{}); err != nil {
		fx.t.Fatal(err)
	}
	fx.id(`UPDATE build_jobs SET log_url = $2 WHERE id = $1 RETURNING 1`, job, key)
}

func (fx *fixture) seed() {
	fx.open = fx.project("open", false)
	fx.hush = fx.project("hush", true)
	fx.evalOf(fx.open, "main", 0, "succeeded")
	fx.evalOf(fx.open, "dev", 0, "succeeded")
	fx.eval = fx.evalOf(fx.open, "main", 0, "succeeded")
	fx.prEval = fx.evalOf(fx.open, "pull/7", 7, "running")

	ok, fail, dep, cached, running := fx.drv("a-ok"), fx.drv("b-fail"), fx.drv("c-dep"), fx.drv("e-cached"), fx.drv("f-running")
	fx.id(`INSERT INTO derivation_inputs (referrer, input_drv, outputs) VALUES ($1, $2, '{out}') RETURNING 1`, dep, fail)
	fx.okJob = fx.job(ok, fx.open, "succeeded")
	fx.failJob = fx.job(fail, fx.open, "failed")
	fx.depJob = fx.job(dep, fx.open, "dep-failed")
	fx.runJob = fx.job(running, fx.open, "building")
	fx.archive(fx.failJob, fail, failLog)
	fx.id(`INSERT INTO build_log_tails (build_job_id, log_tail, log_seq) VALUES ($1, 'still going', 1) RETURNING 1`, fx.runJob)
	for name, drv := range map[string]string{"a-ok": ok, "b-fail": fail, "c-dep": dep, "e-cached": cached, "f-running": running} {
		fx.attr(fx.eval, name, drv, "")
	}
	fx.attr(fx.eval, "d-evalerr", "", "error: attribute 'x' missing")
	fx.openQueued = fx.job(fx.drv("g-queued"), fx.open, "pending")

	fx.hushEval = fx.evalOf(fx.hush, "main", 0, "succeeded")
	hushDrv := fx.drv("hush-secret")
	fx.hushJob = fx.job(hushDrv, fx.hush, "failed")
	fx.archive(fx.hushJob, hushDrv, "hush-secret log\n")
	fx.attr(fx.hushEval, "hush-secret", hushDrv, "")
	fx.hushPending = fx.job(fx.drv("hush-pending"), fx.hush, "pending")

	fx.id(`INSERT INTO nodes (id, roles, endpoint, hostname, version, incarnation, systems)
VALUES ('n1', '{builder}', 'http://n1:7777', 'n1.internal', '1.2.3', gen_random_uuid(), '{x86_64-linux}') RETURNING 1`)
}

// get asks path (anonymously, or with the admin token) and returns the status and body.
func (fx *fixture) get(path string, admin bool) (int, string) {
	fx.t.Helper()
	req, err := http.NewRequestWithContext(fx.t.Context(), http.MethodGet, fx.srv.URL+path, nil)
	if err != nil {
		fx.t.Fatal(err)
	}
	if admin {
		req.Header.Set("Authorization", "Bearer "+adminToken)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fx.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// getJSON asks path and decodes a 200's body into v.
func (fx *fixture) getJSON(path string, admin bool, v any) {
	fx.t.Helper()
	code, body := fx.get(path, admin)
	if code != http.StatusOK {
		fx.t.Fatalf("GET %s: %d %s", path, code, body)
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		fx.t.Fatalf("GET %s: %v in %s", path, err, body)
	}
}

var rfc3339UTC = regexp.MustCompile(`"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"`)

// timesUTC reports the first time in body that is not RFC 3339 in UTC ("" if none).
func timesUTC(body string) string {
	for _, m := range regexp.MustCompile(`"\d{4}-\d\d-\d\dT[^"]*"`).FindAllString(body, -1) {
		if !rfc3339UTC.MatchString(m) {
			return m
		}
	}
	return ""
}

// TestRoutesJSON reads every route for the public project and holds its fields.
func TestRoutesJSON(t *testing.T) {
	t.Parallel()
	fx := newFixture(t)
	type obj = map[string]any
	field := func(t *testing.T, v obj, path string) any {
		t.Helper()
		var cur any = v
		for _, k := range strings.Split(path, ".") {
			m, ok := cur.(obj)
			if !ok {
				t.Fatalf("%s: %v is not an object", path, cur)
			}
			if cur, ok = m[k]; !ok {
				t.Fatalf("no field %s in %v", path, m)
			}
		}
		return cur
	}
	num := func(id int64) float64 { return float64(id) }
	for _, tc := range []struct {
		path  string
		check func(t *testing.T, v obj)
	}{
		{"/api/v1/projects", func(t *testing.T, v obj) {
			ps := field(t, v, "projects").([]any)
			if len(ps) != 1 || field(t, ps[0].(obj), "name") != "open" || field(t, ps[0].(obj), "latest_evaluation_id") != num(fx.prEval) ||
				field(t, ps[0].(obj), "repository") != "o/open" || field(t, ps[0].(obj), "private") != false {
				t.Errorf("projects: %v", ps)
			}
		}},
		{"/api/v1/projects/open", func(t *testing.T, v obj) {
			br := field(t, v, "branches").([]any)
			if len(br) != 2 || field(t, br[0].(obj), "id") != num(fx.eval) || field(t, br[1].(obj), "branch") != "dev" {
				t.Errorf("branches: %v", br)
			}
			prs := field(t, v, "pull_requests").([]any)
			if len(prs) != 1 || field(t, prs[0].(obj), "pr_number") != 7.0 || field(t, prs[0].(obj), "pr_author") != "ann" {
				t.Errorf("pull requests: %v", prs)
			}
			if field(t, v, "default_branch") != "main" || field(t, v, "clone_url") != "https://x/o/open.git" {
				t.Errorf("project: %v", v)
			}
		}},
		{"/api/v1/projects/open/evaluations", func(t *testing.T, v obj) {
			es := field(t, v, "evaluations").([]any)
			if len(es) != 4 || field(t, es[0].(obj), "id") != num(fx.prEval) || field(t, v, "next") != nil {
				t.Errorf("evaluations: %v", v)
			}
			if e := es[1].(obj); field(t, e, "status") != "succeeded" || field(t, e, "pr_number") != nil ||
				len(field(t, e, "commit").(string)) != 40 || field(t, e, "project") != "open" {
				t.Errorf("evaluation: %v", e)
			}
		}},
		{fmt.Sprintf("/api/v1/evaluations/%d/diff", fx.eval), func(t *testing.T, v obj) {
			for _, k := range []string{"newly_failing", "newly_fixed", "still_failing", "added", "added_failing", "removed"} {
				if _, ok := field(t, v, k).([]any); !ok {
					t.Errorf("diff: %s is %v, want a list", k, v[k])
				}
			}
		}},
		{fmt.Sprintf("/api/v1/evaluations/%d", fx.eval), func(t *testing.T, v obj) {
			if field(t, v, "id") != num(fx.eval) || field(t, v, "builds.failed") != 1.0 || field(t, v, "builds.dep-failed") != 1.0 {
				t.Errorf("evaluation: %v", v)
			}
			want := map[string]string{"a-ok": "succeeded", "b-fail": "failed", "c-dep": "dep-failed", "d-evalerr": "eval-error",
				"e-cached": "cached", "f-running": "building"}
			as := field(t, v, "attributes").([]any)
			var names []string
			for _, a := range as {
				a := a.(obj)
				name := field(t, a, "name").(string)
				names = append(names, name)
				if field(t, a, "status") != want[name] {
					t.Errorf("attribute %s: status %v, want %s", name, a["status"], want[name])
				}
				switch name {
				case "b-fail":
					if field(t, a, "build_id") != num(fx.failJob) || field(t, a, "exit_code") != 1.0 || field(t, a, "builder") != "builder-1" {
						t.Errorf("b-fail: %v", a)
					}
				case "c-dep":
					if field(t, a, "cause_build_id") != num(fx.failJob) {
						t.Errorf("c-dep: %v", a)
					}
				case "d-evalerr":
					if field(t, a, "eval_error") != "error: attribute 'x' missing" || field(t, a, "build_id") != nil {
						t.Errorf("d-evalerr: %v", a)
					}
				}
			}
			if !slices.IsSorted(names) || len(names) != 6 {
				t.Errorf("attributes %v, want 6 by name", names)
			}
		}},
		{fmt.Sprintf("/api/v1/builds/%d", fx.failJob), func(t *testing.T, v obj) {
			if field(t, v, "status") != "failed" || field(t, v, "name") != "b-fail" || field(t, v, "attempt") != 1.0 ||
				field(t, v, "retry_count") != 0.0 || field(t, v, "builder") != "builder-1" || field(t, v, "exit_code") != 1.0 ||
				field(t, v, "error") != "builder failed with exit code 1" || field(t, v, "project") != "open" ||
				!strings.HasPrefix(field(t, v, "log_url").(string), "/log/") || field(t, v, "live_log_url") != "" {
				t.Errorf("build: %v", v)
			}
			if d := field(t, v, "duration_seconds").(float64); d < 89 || d > 91 {
				t.Errorf("duration %v, want 90 s", d)
			}
		}},
		{fmt.Sprintf("/api/v1/builds/%d", fx.runJob), func(t *testing.T, v obj) {
			if field(t, v, "live_log_url") != fmt.Sprintf("/api/builds/%d/log", fx.runJob) || field(t, v, "finished_at") != nil {
				t.Errorf("running build: %v", v)
			}
		}},
		{"/api/v1/nodes", func(t *testing.T, v obj) {
			ns := field(t, v, "nodes").([]any)
			if len(ns) != 1 || field(t, ns[0].(obj), "id") != "n1" || field(t, ns[0].(obj), "hostname") != "" ||
				field(t, ns[0].(obj), "endpoint") != "" || field(t, ns[0].(obj), "version") != "" {
				t.Errorf("nodes anonymously: %v", ns)
			}
		}},
		{"/api/v1/queue", func(t *testing.T, v obj) {
			if field(t, v, "ready") != 2.0 || field(t, v, "building") != 1.0 {
				t.Errorf("queue counts: %v", v)
			}
			js := field(t, v, "jobs").([]any)
			if len(js) != 3 || field(t, js[1].(obj), "name") != "g-queued" || field(t, js[2].(obj), "hidden") != true {
				t.Errorf("queue jobs: %v", js)
			}
		}},
	} {
		t.Run(strings.ReplaceAll(tc.path, "/", "_"), func(t *testing.T) {
			code, body := fx.get(tc.path, false)
			if code != http.StatusOK || !strings.HasPrefix(body, "{") {
				t.Fatalf("GET %s: %d %s", tc.path, code, body)
			}
			if bad := timesUTC(body); bad != "" {
				t.Errorf("GET %s: time %s is not RFC 3339 in UTC", tc.path, bad)
			}
			if strings.Contains(body, "hush") {
				t.Errorf("GET %s anonymously names the private project:\n%s", tc.path, body)
			}
			var v obj
			if err := json.Unmarshal([]byte(body), &v); err != nil {
				t.Fatal(err)
			}
			tc.check(t, v)
		})
	}
	// The admin sees where nodes are.
	var ns apiv1.NodeList
	fx.getJSON("/api/v1/nodes", true, &ns)
	if len(ns.Nodes) != 1 || ns.Nodes[0].Hostname != "n1.internal" || ns.Nodes[0].Endpoint != "http://n1:7777" {
		t.Errorf("nodes for the admin: %+v", ns)
	}
}

// TestPrivateProject: a private project's objects are the 404 of what does not exist to an
// anonymous caller, left out of lists, and the admin's to read.
func TestPrivateProject(t *testing.T) {
	t.Parallel()
	fx := newFixture(t)
	for _, tc := range []struct{ hidden, missing string }{
		{"/api/v1/projects/hush", "/api/v1/projects/nope"},
		{"/api/v1/projects/hush/evaluations", "/api/v1/projects/nope/evaluations"},
		{fmt.Sprintf("/api/v1/evaluations/%d", fx.hushEval), "/api/v1/evaluations/999999"},
		{fmt.Sprintf("/api/v1/evaluations/%d/failures", fx.hushEval), "/api/v1/evaluations/999999/failures"},
		{fmt.Sprintf("/api/v1/evaluations/%d/diff", fx.hushEval), "/api/v1/evaluations/999999/diff"},
		{fmt.Sprintf("/api/v1/builds/%d", fx.hushJob), "/api/v1/builds/999999"},
	} {
		code, body := fx.get(tc.hidden, false)
		mcode, missing := fx.get(tc.missing, false)
		mbody := strings.NewReplacer("nope", "hush", "999999", lastNumber(tc.hidden)).Replace(missing)
		if code != http.StatusNotFound || mcode != http.StatusNotFound || body != mbody {
			t.Errorf("GET %s anonymously: %d %s; want the 404 of %s: %d %s", tc.hidden, code, body, tc.missing, mcode, mbody)
		}
		// The admin gets it, and what does not exist is the same 404 to them.
		if code, body := fx.get(tc.hidden, true); code != http.StatusOK || !strings.Contains(body, "hush") {
			t.Errorf("GET %s as the admin: %d %s", tc.hidden, code, body)
		}
		if code, body := fx.get(tc.missing, true); code != http.StatusNotFound || body != missing {
			t.Errorf("GET %s as the admin: %d %s, want %s", tc.missing, code, body, missing)
		}
	}
	for _, path := range []string{"/api/v1/projects", "/api/v1/queue"} {
		if _, body := fx.get(path, false); strings.Contains(body, "hush") {
			t.Errorf("GET %s anonymously lists the private project:\n%s", path, body)
		}
		if _, body := fx.get(path, true); !strings.Contains(body, "hush") {
			t.Errorf("GET %s as the admin leaves the private project out:\n%s", path, body)
		}
	}
}

// TestKeysetPaging pages through evaluations, attributes and the queue with every page size:
// each row comes once, in order.
func TestKeysetPaging(t *testing.T) {
	t.Parallel()
	fx := newFixture(t)
	for range 5 {
		fx.evalOf(fx.open, "main", 0, "succeeded")
	}
	type page struct {
		Evaluations []apiv1.Evaluation
		Attributes  []apiv1.Attribute
		Jobs        []apiv1.QueueJob
		Next        *string
	}
	for _, tc := range []struct {
		name, path string
		key        func(p page) []string
		want       int
		less       func(a, b string) bool
	}{
		{"evaluations", "/api/v1/projects/open/evaluations", func(p page) []string {
			var out []string
			for _, e := range p.Evaluations {
				out = append(out, fmt.Sprintf("%09d", e.ID))
			}
			return out
		}, 9, func(a, b string) bool { return a > b }},
		{"attributes", fmt.Sprintf("/api/v1/evaluations/%d", fx.eval), func(p page) []string {
			var out []string
			for _, a := range p.Attributes {
				out = append(out, a.Name)
			}
			return out
		}, 6, func(a, b string) bool { return a < b }},
		{"queue", "/api/v1/queue", func(p page) []string {
			var out []string
			for _, j := range p.Jobs {
				out = append(out, fmt.Sprintf("%09d", j.ID))
			}
			return out
		}, 3, func(a, b string) bool { return a < b }},
	} {
		for limit := 1; limit <= tc.want+1; limit++ {
			var all []string
			sep := "?"
			if strings.Contains(tc.path, "?") {
				sep = "&"
			}
			next := ""
			for pages := 0; ; pages++ {
				if pages > tc.want+1 {
					t.Fatalf("%s, limit %d: more pages than rows", tc.name, limit)
				}
				path := fmt.Sprintf("%s%slimit=%d", tc.path, sep, limit)
				if next != "" {
					path += "&after=" + url.QueryEscape(next)
				}
				var p page
				fx.getJSON(path, true, &p)
				all = append(all, tc.key(p)...)
				if p.Next == nil {
					break
				}
				next = *p.Next
			}
			inOrder := true
			for i := 1; i < len(all); i++ {
				inOrder = inOrder && tc.less(all[i-1], all[i])
			}
			if len(all) != tc.want || !inOrder {
				t.Errorf("%s, limit %d: %v, want %d rows in order, each once", tc.name, limit, all, tc.want)
			}
		}
	}
}

// TestFailures lists an evaluation's failed attributes with the end of each failed build's
// log: a dep-failed one carries its cause's.
func TestFailures(t *testing.T) {
	t.Parallel()
	fx := newFixture(t)
	var fl apiv1.FailureList
	fx.getJSON(fmt.Sprintf("/api/v1/evaluations/%d/failures", fx.eval), false, &fl)
	byName := map[string]apiv1.Failure{}
	for _, f := range fl.Failures {
		byName[f.Name] = f
	}
	if len(fl.Failures) != 3 || fl.EvaluationID != fx.eval {
		t.Fatalf("failures: %+v, want b-fail, c-dep and d-evalerr", fl)
	}
	for _, name := range []string{"b-fail", "c-dep"} {
		f := byName[name]
		if f.LogBuildID == nil || *f.LogBuildID != fx.failJob || !strings.HasSuffix(f.LogTail, "error: b-fail's LAST LINE\n") {
			t.Errorf("%s: log of %v, tail %q", name, f.LogBuildID, f.LogTail)
		}
		if len(f.LogTail) > apiv1.TailBytes || len(f.LogTail) < apiv1.TailBytes-100 || !strings.HasPrefix(f.LogTail, "compiling") {
			t.Errorf("%s: a tail of %d bytes starting %.20q, want about %d from a whole line", name, len(f.LogTail), f.LogTail, apiv1.TailBytes)
		}
	}
	if f := byName["d-evalerr"]; f.EvalError == "" || f.LogTail != "" || f.BuildID != nil {
		t.Errorf("d-evalerr: %+v", f)
	}
	if f := byName["b-fail"]; f.BuildError != "builder failed with exit code 1" || f.ExitCode == nil || *f.ExitCode != 1 {
		t.Errorf("b-fail: %+v", f)
	}
}

// TestBadParameters: a malformed id or cursor is a 400 naming the parameter.
func TestBadParameters(t *testing.T) {
	t.Parallel()
	fx := newFixture(t)
	for _, tc := range []struct{ path, want string }{
		{"/api/v1/evaluations/x1", "invalid evaluation id"},
		{"/api/v1/evaluations/0/failures", "invalid evaluation id"},
		{"/api/v1/builds/-3", "invalid build id"},
		{"/api/v1/projects/open/evaluations?after=abc", "invalid after"},
		{"/api/v1/projects/open/evaluations?limit=0", "invalid limit"},
		{"/api/v1/queue?limit=201", "invalid limit"},
		{"/api/v1/queue?after=1.5", "invalid after"},
		{fmt.Sprintf("/api/v1/evaluations/%d?after=", fx.eval), "invalid after"},
	} {
		code, body := fx.get(tc.path, false)
		var e struct{ Error string }
		if code != http.StatusBadRequest || json.Unmarshal([]byte(body), &e) != nil || !strings.HasPrefix(e.Error, tc.want) {
			t.Errorf("GET %s: %d %s, want 400 %q", tc.path, code, body, tc.want)
		}
	}
}

// TestOpenAPIMatchesRoutes: the document served lists exactly the registered routes under
// /api/v1/, each with its path values as parameters and a response schema.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	t.Parallel()
	fx := newFixture(t)
	var doc struct {
		OpenAPI string `json:"openapi"`
		Paths   map[string]struct {
			Get struct {
				Parameters []struct{ Name, In string }
				Responses  map[string]struct {
					Content map[string]struct {
						Schema map[string]any
					}
				}
			}
		}
	}
	fx.getJSON("/api/v1/openapi.json", false, &doc)
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Errorf("openapi %q, want 3.x", doc.OpenAPI)
	}
	var routes []string
	for _, r := range fx.rt.List() {
		method, path, _ := strings.Cut(r.Pattern, " ")
		if !strings.HasPrefix(path, apiv1.Prefix) {
			continue
		}
		routes = append(routes, path)
		op, ok := doc.Paths[path]
		if method != http.MethodGet || !ok {
			t.Errorf("route %s is not in the OpenAPI document", r.Pattern)
			continue
		}
		for _, pv := range regexp.MustCompile(`\{(\w+)\}`).FindAllStringSubmatch(path, -1) {
			if !slices.ContainsFunc(op.Get.Parameters, func(p struct{ Name, In string }) bool { return p.Name == pv[1] && p.In == "path" }) {
				t.Errorf("%s: path value %s is not a parameter", path, pv[1])
			}
		}
		if op.Get.Responses["200"].Content["application/json"].Schema == nil {
			t.Errorf("%s: no response schema", path)
		}
	}
	for path := range doc.Paths {
		if !slices.Contains(routes, path) {
			t.Errorf("the OpenAPI document names %s, which is not a route", path)
		}
	}
	// The fields of a response are its JSON's.
	props := doc.Paths["/api/v1/builds/{id}"].Get.Responses["200"].Content["application/json"].Schema["properties"].(map[string]any)
	for _, f := range []string{"id", "status", "attempt", "retry_count", "builder", "started_at", "finished_at", "exit_code", "error", "log_url"} {
		if _, ok := props[f]; !ok {
			t.Errorf("the build's schema lacks %s: %v", f, props)
		}
	}
}

// lastNumber is the last number in path: the id it asks for.
func lastNumber(path string) string {
	all := regexp.MustCompile(`\d+`).FindAllString(path, -1)
	return all[len(all)-1]
}
