package webui

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// actionsFixture has a branch evaluation and a pull request evaluation (by "prauthor") of the
// public GitHub project "app" (octo/app), and an evaluation of a project added by URL,
// each with one failed attribute job.
type actionsFixture struct {
	*authFixture
	app, byURL           int64
	branchEval, prEval   int64
	gitEval              int64
	branchJob, prJob     int64
	gitJob               int64
	boss, writer, reader *browser
	prAuthor             *browser
}

func newActionsFixture(t *testing.T) *actionsFixture {
	t.Helper()
	fx := &actionsFixture{authFixture: newAuthFixture(t)}
	fx.app = fx.project("app", "github", "octo/app", false)
	fx.byURL = fx.project("byurl", "git", "https://git.example/x.git", false)
	fx.branchEval = fx.eval(fx.app, status.EvalFailed, 0, "")
	fx.prEval = fx.eval(fx.app, status.EvalFailed, 12, "prauthor")
	fx.gitEval = fx.eval(fx.byURL, status.EvalFailed, 0, "")
	fx.branchJob, _ = fx.job(fx.app, fx.branchEval, status.JobFailed)
	fx.prJob, _ = fx.job(fx.app, fx.prEval, status.JobFailed)
	fx.gitJob, _ = fx.job(fx.byURL, fx.gitEval, status.JobFailed)
	fx.boss = fx.browser().login("boss")
	fx.writer = fx.browser().login("writer")
	fx.reader = fx.browser().login("reader")
	fx.prAuthor = fx.browser().login("prauthor")
	return fx
}

// act POSTs an action as b (nil: logged out) with its CSRF token, as JSON client.
func (fx *actionsFixture) act(b *browser, path string) int {
	fx.t.Helper()
	if b == nil {
		b = fx.browser()
		resp, _ := b.post(path, nil, nil)
		return resp.StatusCode
	}
	resp, body := b.post(path, url.Values{"csrf": {b.csrf()}}, nil)
	if resp.StatusCode/100 == 5 {
		fx.t.Errorf("POST %s: %d %s", path, resp.StatusCode, body)
	}
	return resp.StatusCode
}

func TestActionPermissions(t *testing.T) {
	t.Parallel()
	fx := newActionsFixture(t)
	type who struct {
		name string
		b    *browser
	}
	loggedOut := who{"logged out", nil}
	boss, writer, reader, author := who{"boss", fx.boss}, who{"writer", fx.writer}, who{"reader", fx.reader}, who{"prauthor", fx.prAuthor}
	for _, c := range []struct {
		who  who
		job  int64
		want int
	}{
		{loggedOut, fx.branchJob, http.StatusUnauthorized},
		{reader, fx.branchJob, http.StatusForbidden},
		{reader, fx.prJob, http.StatusForbidden},
		{author, fx.branchJob, http.StatusForbidden}, // the PR's author has only read access
		{author, fx.prJob, http.StatusOK},
		{writer, fx.branchJob, http.StatusOK},
		{writer, fx.prJob, http.StatusOK}, // who may push may act on the repository's PRs too
		{writer, fx.gitJob, http.StatusForbidden},
		{author, fx.gitJob, http.StatusForbidden},
		{boss, fx.gitJob, http.StatusOK},
		{boss, fx.branchJob, http.StatusOK},
	} {
		if _, err := fx.pool.Exec(fx.ctx, `UPDATE build_jobs SET status = 'failed', priority = 0`); err != nil {
			t.Fatal(err)
		}
		got := fx.act(c.who.b, fmt.Sprintf("/api/builds/%d/rebuild", c.job))
		st := fx.jobStatus(c.job)
		wantStatus := status.JobFailed
		if c.want == http.StatusOK {
			wantStatus = status.JobPending
		}
		if got != c.want || st != wantStatus {
			t.Errorf("%s rebuilds job %d: %d, job %s; want %d, job %s", c.who.name, c.job, got, st, c.want, wantStatus)
		}
	}
	if p := fx.id(`SELECT priority FROM build_jobs WHERE id = $1`, fx.branchJob); p != 100 {
		t.Errorf("rebuilt job priority %d, want 100", p)
	}

	// Evaluations: cancel a running one, re-evaluate a finished one.
	running := fx.eval(fx.app, status.EvalRunning, 0, "")
	if got := fx.act(fx.reader, fmt.Sprintf("/api/evals/%d/cancel", running)); got != http.StatusForbidden {
		t.Errorf("reader cancels an evaluation: %d, want 403", got)
	}
	if s := fx.evalStatus(running); s != status.EvalRunning {
		t.Errorf("after a refused cancel the evaluation is %s", s)
	}
	if got := fx.act(fx.writer, fmt.Sprintf("/api/evals/%d/cancel", running)); got != http.StatusOK {
		t.Errorf("writer cancels an evaluation: %d, want 200", got)
	}
	if s := fx.evalStatus(running); s != status.EvalCancelled {
		t.Errorf("cancelled evaluation is %s", s)
	}
	if got := fx.act(fx.writer, fmt.Sprintf("/api/evals/%d/cancel", running)); got != http.StatusConflict {
		t.Errorf("cancelling a cancelled evaluation: %d, want 409", got)
	}
	if got := fx.act(fx.prAuthor, fmt.Sprintf("/api/evals/%d/re-evaluate", fx.prEval)); got != http.StatusOK {
		t.Errorf("the PR author re-evaluates the PR: %d, want 200", got)
	}
	if s := fx.evalStatus(fx.prEval); s != status.EvalQueued {
		t.Errorf("re-evaluated evaluation is %s, want queued", s)
	}
	if got := fx.act(fx.prAuthor, fmt.Sprintf("/api/evals/%d/re-evaluate", fx.branchEval)); got != http.StatusForbidden {
		t.Errorf("the PR author re-evaluates a branch: %d, want 403", got)
	}
	if got := fx.act(fx.boss, "/api/evals/999999/re-evaluate"); got != http.StatusNotFound {
		t.Errorf("re-evaluating no evaluation: %d, want 404", got)
	}
	if got := fx.act(fx.boss, "/api/builds/999999/cancel"); got != http.StatusNotFound {
		t.Errorf("cancelling no build: %d, want 404", got)
	}
}

func TestActionAdminToken(t *testing.T) {
	t.Parallel()
	fx := newActionsFixture(t)
	post := func(path, token string) (int, string) {
		req := httptest.NewRequestWithContext(fx.ctx, "POST", path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		testMux(fx.u).ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	code, body := post(fmt.Sprintf("/api/builds/%d/rebuild", fx.gitJob), authTestToken)
	var answer struct {
		Message string `json:"message"`
		Build   int64  `json:"build"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &answer) != nil || answer.Build != fx.gitJob {
		t.Fatalf("admin token rebuild: %d %s", code, body)
	}
	if s := fx.jobStatus(fx.gitJob); s != status.JobPending {
		t.Errorf("job after the admin token's rebuild: %s", s)
	}
	if code, _ := post(fmt.Sprintf("/api/builds/%d/rebuild", fx.gitJob), authTestToken); code != http.StatusConflict {
		t.Errorf("rebuilding a pending job: %d, want 409", code)
	}
	if code, _ := post(fmt.Sprintf("/api/builds/%d/cancel", fx.gitJob), "wrong"); code != http.StatusUnauthorized {
		t.Errorf("a wrong admin token: %d, want 401", code)
	}
	if s := fx.jobStatus(fx.gitJob); s != status.JobPending {
		t.Errorf("a wrong token changed the job to %s", s)
	}
	if code, _ := post(fmt.Sprintf("/api/builds/%d/cancel", fx.gitJob), authTestToken); code != http.StatusOK || fx.jobStatus(fx.gitJob) != status.JobCancelled {
		t.Errorf("admin token cancel: %d, job %s", code, fx.jobStatus(fx.gitJob))
	}
	if code, _ := post("/api/builds/abc/cancel", authTestToken); code != http.StatusNotFound {
		t.Errorf("a build id that is not one: %d, want 404", code)
	}
}

func TestActionCSRF(t *testing.T) {
	t.Parallel()
	fx := newActionsFixture(t)
	path := fmt.Sprintf("/api/builds/%d/rebuild", fx.branchJob)
	token := fx.writer.csrf()
	for _, c := range []struct {
		name   string
		form   url.Values
		header map[string]string
	}{
		{"no token", nil, nil},
		{"wrong token", url.Values{"csrf": {"AAAA"}}, nil},
		{"another user's token", url.Values{"csrf": {fx.reader.csrf()}}, nil},
		{"cross-origin", url.Values{"csrf": {token}}, map[string]string{"Origin": "https://evil.example"}},
		{"cross-site fetch", url.Values{"csrf": {token}}, map[string]string{"Sec-Fetch-Site": "cross-site"}},
	} {
		resp, _ := fx.writer.post(path, c.form, c.header)
		if resp.StatusCode != http.StatusForbidden || fx.jobStatus(fx.branchJob) != status.JobFailed {
			t.Errorf("%s: %d, job %s; want 403 and the job unchanged", c.name, resp.StatusCode, fx.jobStatus(fx.branchJob))
		}
	}
	// The token in the header, same-origin: accepted.
	resp, body := fx.writer.post(path, nil, map[string]string{"X-CSRF-Token": token, "Origin": fx.srv.URL, "Sec-Fetch-Site": "same-origin"})
	if resp.StatusCode != http.StatusOK || fx.jobStatus(fx.branchJob) != status.JobPending {
		t.Errorf("header token: %d %s, job %s", resp.StatusCode, body, fx.jobStatus(fx.branchJob))
	}
}

func TestActionAnswers(t *testing.T) {
	t.Parallel()
	fx := newActionsFixture(t)
	reset := func() {
		if _, err := fx.pool.Exec(fx.ctx, `UPDATE build_jobs SET status = 'failed'`); err != nil {
			t.Fatal(err)
		}
	}
	path := fmt.Sprintf("/api/builds/%d/rebuild", fx.branchJob)
	page := fmt.Sprintf("/ci/app/build/%d", fx.branchJob)
	html := map[string]string{"Accept": "text/html,application/xhtml+xml"}

	// A form post goes back to the page it came from.
	resp, _ := fx.writer.post(path, url.Values{"csrf": {fx.writer.csrf()}},
		map[string]string{"Accept": html["Accept"], "Referer": fx.srv.URL + "/ci/app/eval/1?tab=failed"})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ci/app/eval/1?tab=failed" {
		t.Errorf("form post: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	// ... but not to another site: then to the build's page.
	reset()
	resp, _ = fx.writer.post(path, url.Values{"csrf": {fx.writer.csrf()}},
		map[string]string{"Accept": html["Accept"], "Referer": "https://evil.example/ci/x"})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != page {
		t.Errorf("form post from elsewhere: %d to %q, want %s", resp.StatusCode, resp.Header.Get("Location"), page)
	}
	// HTMX gets a fragment.
	reset()
	resp, body := fx.writer.post(path, url.Values{"csrf": {fx.writer.csrf()}}, map[string]string{"HX-Request": "true"})
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") || !strings.Contains(body, "queued again") {
		t.Errorf("HTMX: %d %s %q", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	// A logged-out form post goes to the login, and comes back to the page.
	reset()
	resp, _ = fx.browser().post(path, nil, map[string]string{"Accept": html["Accept"], "Referer": fx.srv.URL + page})
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || loc != "/ci/login?next="+url.QueryEscape(page) {
		t.Errorf("logged-out form post: %d to %q", resp.StatusCode, loc)
	}
	// A refused form post is an HTML error page that does not say more than it should.
	resp, body = fx.reader.post(path, url.Values{"csrf": {fx.reader.csrf()}}, html)
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "<html") || !strings.Contains(body, "write access") {
		t.Errorf("refused form post: %d\n%s", resp.StatusCode, body)
	}
	if s := fx.jobStatus(fx.branchJob); s != status.JobFailed {
		t.Errorf("refused and logged-out posts left the job %s", s)
	}
}

func TestRebuildFailed(t *testing.T) {
	t.Parallel()
	fx := newActionsFixture(t)
	// app's branch evaluation: attribute top (dep-failed) needs mid (dep-failed) needs root
	// (failed); attribute other failed on its own; attribute fine succeeded; a cancelled
	// dependency of nothing failed stays.
	e := fx.eval(fx.app, status.EvalSucceeded, 0, "")
	rootJob, root := fx.job(fx.app, 0, status.JobFailed)
	midJob, mid := fx.job(fx.app, 0, status.JobDepFailed, root)
	topJob, _ := fx.job(fx.app, e, status.JobDepFailed, mid)
	otherJob, _ := fx.job(fx.app, e, status.JobFailed)
	fineJob, _ := fx.job(fx.app, e, status.JobSucceeded)
	strayJob, stray := fx.job(fx.app, 0, status.JobCancelled)
	fx.job(fx.app, e, status.JobSucceeded, stray)

	if got := fx.act(fx.reader, fmt.Sprintf("/api/evals/%d/rebuild-failed", e)); got != http.StatusForbidden {
		t.Errorf("reader: %d, want 403", got)
	}
	if s := fx.jobStatus(rootJob); s != status.JobFailed {
		t.Fatalf("a refused rebuild-failed left root %s", s)
	}
	if got := fx.act(fx.writer, fmt.Sprintf("/api/evals/%d/rebuild-failed", e)); got != http.StatusOK {
		t.Fatalf("writer: %d, want 200", got)
	}
	for name, c := range map[string]struct {
		id       int64
		status   status.JobStatus
		priority int64
	}{
		// A writer's rebuild is at the normal priority: a boost is an admin's.
		"root": {rootJob, status.JobPending, 0}, "mid": {midJob, status.JobPending, 0}, "top": {topJob, status.JobPending, 0},
		"other": {otherJob, status.JobPending, 0}, "fine": {fineJob, status.JobSucceeded, 0}, "stray": {strayJob, status.JobCancelled, 0},
	} {
		s, p := fx.jobStatus(c.id), fx.id(`SELECT priority FROM build_jobs WHERE id = $1`, c.id)
		if s != c.status || p != c.priority {
			t.Errorf("%s: %s at priority %d, want %s at %d", name, s, p, c.status, c.priority)
		}
	}
	if got := fx.act(fx.writer, fmt.Sprintf("/api/evals/%d/rebuild-failed", e)); got != http.StatusConflict {
		t.Errorf("nothing left to rebuild: %d, want 409", got)
	}
}

func TestBuildBelongsToEveryEvaluationNeedingIt(t *testing.T) {
	t.Parallel()
	fx := newActionsFixture(t)
	// A dependency queued for the project added by URL, needed by app's PR evaluation through
	// an attribute: the PR's author may rebuild it.
	depJob, dep := fx.job(fx.byURL, 0, status.JobFailed)
	fx.job(fx.app, fx.prEval, status.JobDepFailed, dep)
	if got := fx.act(fx.prAuthor, fmt.Sprintf("/api/builds/%d/rebuild", depJob)); got != http.StatusOK {
		t.Errorf("the PR author rebuilds a dependency of the PR: %d, want 200", got)
	}
	// A job only the project added by URL needs: admins only.
	loneJob, _ := fx.job(fx.byURL, 0, status.JobFailed)
	if got := fx.act(fx.writer, fmt.Sprintf("/api/builds/%d/rebuild", loneJob)); got != http.StatusForbidden {
		t.Errorf("writer rebuilds a job of a project added by URL: %d, want 403", got)
	}
}

func TestPermissionCache(t *testing.T) {
	t.Parallel()
	fx := newActionsFixture(t)
	now := time.Now()
	fx.u.auth.perms.now = func() time.Time { return now }
	asks := func() int {
		n := 0
		for _, r := range fx.gh.Requests() {
			if r == "GET /repos/octo/app/collaborators/writer/permission" {
				n++
			}
		}
		return n
	}
	path := fmt.Sprintf("/api/builds/%d/cancel", fx.branchJob)
	fx.pool.Exec(fx.ctx, `UPDATE build_jobs SET status = 'pending'`)
	if got := fx.act(fx.writer, path); got != http.StatusOK || asks() != 1 {
		t.Fatalf("first action: %d, %d permission requests; want 200, 1", got, asks())
	}
	fx.pool.Exec(fx.ctx, `UPDATE build_jobs SET status = 'pending'`)
	now = now.Add(4 * time.Minute)
	if got := fx.act(fx.writer, path); got != http.StatusOK || asks() != 1 {
		t.Errorf("within 5 min: %d, %d permission requests; want 200, still 1", got, asks())
	}
	// Past the TTL the forge is asked again: a revoked permission takes effect.
	fx.gh.SetPermission("octo/app", "writer", "read")
	fx.pool.Exec(fx.ctx, `UPDATE build_jobs SET status = 'pending'`)
	now = now.Add(2 * time.Minute)
	if got := fx.act(fx.writer, path); got != http.StatusForbidden || asks() != 2 {
		t.Errorf("after 6 min: %d, %d permission requests; want 403, 2", got, asks())
	}
}

func TestCanSee(t *testing.T) {
	t.Parallel()
	fx := newActionsFixture(t)
	friend, stranger := fx.browser().login("friend"), fx.browser().login("stranger")
	// request is a request carrying b's cookies (nil: none).
	request := func(b *browser) *http.Request {
		r := httptest.NewRequestWithContext(fx.ctx, "GET", "/ci/", nil)
		if b != nil {
			u, _ := url.Parse(fx.srv.URL)
			for _, c := range b.client.Jar.Cookies(u) {
				r.AddCookie(c)
			}
		}
		return r
	}
	for _, c := range []struct {
		name    string
		b       *browser
		private bool
		want    bool
	}{
		{"logged out, public", nil, false, true},
		{"logged out, private", nil, true, false},
		{"stranger, private", stranger, true, false},
		{"friend (read), private", friend, true, true},
		{"admin, private", fx.boss, true, true},
	} {
		full := "octo/app"
		if c.private {
			full = "octo/secret"
		}
		got, err := fx.u.canSee(request(c.b), c.private, "github", full)
		if err != nil || got != c.want {
			t.Errorf("%s: canSee = %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	// Another forge's login says nothing about a repository.
	if got, _ := fx.u.canSee(request(friend), true, "gitea", "octo/secret"); got {
		t.Error("a GitHub login may see a private Gitea repository of the same name")
	}
}

var actionRE = regexp.MustCompile(`<form method="post" action="/api/(?:evals|builds)/\d+/([a-z-]+)">`)

func TestActionButtons(t *testing.T) {
	t.Parallel()
	fx := newActionsFixture(t)
	evalPage := fmt.Sprintf("/ci/app/eval/%d", fx.branchEval)
	buildPage := fmt.Sprintf("/ci/app/build/%d", fx.branchJob)
	forms := func(b *browser, page string) string {
		t.Helper()
		if b == nil {
			b = fx.browser()
		}
		resp, body := b.get(page)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d\n%s", page, resp.StatusCode, body)
		}
		var got []string
		for _, m := range actionRE.FindAllStringSubmatch(body, -1) {
			got = append(got, m[1])
		}
		return strings.Join(got, ",")
	}
	for _, c := range []struct {
		name       string
		b          *browser
		eval, load string
	}{
		{"logged out", nil, "", ""},
		{"reader", fx.reader, "", ""},
		{"writer", fx.writer, "re-evaluate,rebuild-failed", "rebuild"},
		{"admin", fx.boss, "re-evaluate,rebuild-failed", "rebuild"},
	} {
		if got := forms(c.b, evalPage); got != c.eval {
			t.Errorf("%s: evaluation page buttons %q, want %q", c.name, got, c.eval)
		}
		if got := forms(c.b, buildPage); got != c.load {
			t.Errorf("%s: build page buttons %q, want %q", c.name, got, c.load)
		}
	}
	// The buttons carry the viewer's CSRF token.
	_, body := fx.writer.get(evalPage)
	if !strings.Contains(body, `value="`+fx.writer.csrf()+`"`) {
		t.Error("the evaluation page's forms lack the CSRF token")
	}
}
