package webui

import (
	"cmp"
	"context"
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// browseFixture is a test UI on a fresh database, with helpers that insert rows directly.
type browseFixture struct {
	t    *testing.T
	ctx  context.Context
	pool *pgxpool.Pool
	u    *UI
	h    http.Handler
	drvs int
	// base is the fixtures' reference time: rows are inserted relative to it.
	base time.Time
}

func newBrowseFixture(t *testing.T) *browseFixture {
	t.Helper()
	u, pool := newTestUI(t)
	return &browseFixture{t: t, ctx: t.Context(), pool: pool, u: u, h: testMux(u),
		base: time.Now().Add(-time.Hour).Truncate(time.Second)}
}

func (fx *browseFixture) exec(sql string, args ...any) {
	fx.t.Helper()
	if _, err := fx.pool.Exec(fx.ctx, sql, args...); err != nil {
		fx.t.Fatalf("%s: %v", sql, err)
	}
}

func (fx *browseFixture) id(sql string, args ...any) int64 {
	fx.t.Helper()
	var id int64
	if err := fx.pool.QueryRow(fx.ctx, sql, args...).Scan(&id); err != nil {
		fx.t.Fatalf("%s: %v", sql, err)
	}
	return id
}

// project inserts a project on forge ("gitea" or "git") with the repository fullName.
func (fx *browseFixture) project(name, forgeName, fullName string) int64 {
	fx.t.Helper()
	owner, repo, _ := strings.Cut(fullName, "/")
	repoID := fx.id(`INSERT INTO repositories (forge, owner, name, full_name, clone_url) VALUES ($1, $2, $3, $4, $5)
RETURNING id`, forgeName, owner, repo, fullName, testForgeURL+"/"+fullName+".git")
	return fx.id(`INSERT INTO projects (repo_id, name) VALUES ($1, $2) RETURNING id`, repoID, name)
}

// eval inserts an evaluation of sha on branch; pr > 0 makes it a pull request's.
func (fx *browseFixture) eval(project int64, branch, sha string, st status.EvalStatus, pr int, author string) int64 {
	fx.t.Helper()
	var prNumber, prAuthor any
	if pr > 0 {
		prNumber, prAuthor = pr, author
	}
	return fx.id(`INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status, pr_number, pr_author)
VALUES ($1, 'git+https://x/o/r.git', $2, $3, $4, $5, $6) RETURNING id`, project, sha, branch, st, prNumber, prAuthor)
}

// drv inserts a derivation named name for system, requiring features.
func (fx *browseFixture) drv(name, system string, features ...string) string {
	fx.t.Helper()
	fx.drvs++
	hash := fmt.Sprintf("%032d", fx.drvs)
	path := "/nix/store/" + hash + "-d" + strconv.Itoa(fx.drvs) + ".drv"
	fx.exec(`INSERT INTO derivations (drv_path, hash_part, name, system, required_features, nar_hash, nar_size)
VALUES ($1, $2, $3, $4, $5, 'sha256:0', 0)`, path, hash, name, system, append([]string{}, features...))
	return path
}

// input records that referrer needs input's outputs.
func (fx *browseFixture) input(referrer, input string) {
	fx.t.Helper()
	fx.exec(`INSERT INTO derivation_inputs (referrer, input_drv, outputs) VALUES ($1, $2, '{out}')`, referrer, input)
}

// job inserts a pending job of drv for project (0: none) at priority, created at created.
func (fx *browseFixture) job(drv string, project int64, priority int, created time.Time) int64 {
	fx.t.Helper()
	var p any
	if project != 0 {
		p = project
	}
	return fx.id(`INSERT INTO build_jobs (drv_path, project_id, system, required_features, priority, created_at)
SELECT drv_path, $2, system, required_features, $3, $4 FROM derivations WHERE drv_path = $1 RETURNING id`,
		drv, p, priority, created)
}

// node inserts a node row.
func (fx *browseFixture) node(id string, st status.NodeStatus, draining bool, systems, features []string, lastSeen time.Time) {
	fx.t.Helper()
	features = append([]string{}, features...)
	fx.exec(`INSERT INTO nodes (id, roles, endpoint, hostname, systems, features, max_jobs, current_jobs, speed_factor,
    status, draining, incarnation, last_seen)
VALUES ($1, '{builder}', 'http://'||$1||':8080', $1||'.host', $2, $3, 4, 2, 1.5, $4, $5, gen_random_uuid(), $6)`,
		id, systems, features, st, draining, lastSeen)
}

// getOK GETs path and fails the test unless it answers 200.
func (fx *browseFixture) getOK(path string) string {
	fx.t.Helper()
	code, body := get(fx.t, fx.h, path)
	if code != http.StatusOK {
		fx.t.Fatalf("GET %s: %d, want 200\n%s", path, code, body)
	}
	return body
}

// element is the element of body whose id attribute is id, up to the end of the tag that
// closes it (the first </tag> after it: tables and rows hold no nested tables or rows here).
func element(t *testing.T, body, tag, id string) string {
	t.Helper()
	start := strings.Index(body, `<`+tag+` id="`+id+`"`)
	if start < 0 {
		t.Fatalf("no <%s id=%q> in the page:\n%s", tag, id, body)
	}
	end := strings.Index(body[start:], "</"+tag+">")
	if end < 0 {
		t.Fatalf("<%s id=%q> is not closed", tag, id)
	}
	return body[start : start+end]
}

var evalLink = regexp.MustCompile(`href="/ci/[^/"]+/eval/(\d+)"`)

// evalIDs lists the evaluations linked from s, in order.
func evalIDs(s string) []int64 {
	var ids []int64
	for _, m := range evalLink.FindAllStringSubmatch(s, -1) {
		id, _ := strconv.ParseInt(m[1], 10, 64)
		ids = append(ids, id)
	}
	return ids
}

var jobRow = regexp.MustCompile(`<tr id="job-(\d+)">`)

// jobIDs lists the job rows of s, in order.
func jobIDs(s string) []int64 {
	var ids []int64
	for _, m := range jobRow.FindAllStringSubmatch(s, -1) {
		id, _ := strconv.ParseInt(m[1], 10, 64)
		ids = append(ids, id)
	}
	return ids
}

var moreLink = regexp.MustCompile(`<a class="more" href="([^"]+)"`)

// moreURL is the "Load more" link inside s, or "".
func moreURL(s string) string {
	m := moreLink.FindStringSubmatch(s)
	if m == nil {
		return ""
	}
	return html.UnescapeString(m[1])
}

func sha(n int) string { return fmt.Sprintf("%040x", n) }

func TestProjectPage(t *testing.T) {
	t.Parallel()
	fx := newBrowseFixture(t)
	web := fx.project("web", "gitea", "o/web")
	other := fx.project("other", "gitea", "o/other")
	fx.eval(other, "main", sha(999), status.EvalSucceeded, 0, "")

	oldMain := fx.eval(web, "main", sha(1), status.EvalFailed, 0, "")
	dev := fx.eval(web, "dev", sha(2), status.EvalFailed, 0, "")
	pr7old := fx.eval(web, "pull/7", sha(3), status.EvalFailed, 7, "alice")
	pr9 := fx.eval(web, "pull/9", sha(4), status.EvalRunning, 9, "bob")
	pr7 := fx.eval(web, "pull/7", sha(5), status.EvalQueued, 7, "alice")
	var all []int64 // newest first
	for i := 0; i < 30; i++ {
		all = append(all, fx.eval(web, "main", sha(100+i), status.EvalSucceeded, 0, ""))
	}
	latestMain := all[len(all)-1]
	all = append(all, pr7, pr9, pr7old, dev, oldMain)
	slices.Reverse(all[:30])
	slices.SortFunc(all, func(a, b int64) int { return cmp.Compare(b, a) })

	body := fx.getOK("/ci/web/")
	if !strings.Contains(body, `href="https://gitea.test/o/web"`) {
		t.Errorf("the page does not link the repository")
	}

	t.Run("branches", func(t *testing.T) {
		branches := element(t, body, "table", "branches")
		if got, want := evalIDs(branches), []int64{latestMain, dev}; !slices.Equal(got, want) {
			t.Errorf("branch evaluations = %v, want %v (the default branch first, then each branch's latest)", got, want)
		}
		if want := `href="https://gitea.test/o/web/commit/` + sha(129) + `"`; !strings.Contains(branches, want) {
			t.Errorf("the latest main commit is not linked to the forge (%s)", want)
		}
		if strings.Contains(branches, "pull/") {
			t.Errorf("pull requests listed among branches:\n%s", branches)
		}
	})
	t.Run("pull requests", func(t *testing.T) {
		pulls := element(t, body, "table", "pulls")
		if got, want := evalIDs(pulls), []int64{pr7, pr9}; !slices.Equal(got, want) {
			t.Errorf("pull request evaluations = %v, want %v (each one's latest, newest first)", got, want)
		}
		for _, s := range []string{"#7", "by alice", "#9", "by bob"} {
			if !strings.Contains(pulls, s) {
				t.Errorf("pull requests lack %q:\n%s", s, pulls)
			}
		}
	})
	t.Run("load more", func(t *testing.T) {
		first := element(t, body, "table", "evals")
		if got, want := evalIDs(first), all[:PageSize]; !slices.Equal(got, want) {
			t.Fatalf("first page = %v, want %v", got, want)
		}
		more := moreURL(element(t, body, "div", "eval-more"))
		if want := fmt.Sprintf("?before=%d", all[PageSize-1]); more != want {
			t.Fatalf("Load more = %q, want %q", more, want)
		}
		next := fx.getOK("/ci/web/" + more)
		if got, want := evalIDs(element(t, next, "table", "evals")), all[PageSize:]; !slices.Equal(got, want) {
			t.Errorf("second page = %v, want %v", got, want)
		}
		if m := moreURL(element(t, next, "div", "eval-more")); m != "" {
			t.Errorf("the last page offers Load more: %q", m)
		}
		if strings.Contains(next, `id="branches"`) {
			t.Errorf("a later page repeats the branches")
		}
	})
}

func TestProjectPageErrors(t *testing.T) {
	t.Parallel()
	fx := newBrowseFixture(t)
	fx.project("web", "gitea", "o/web")
	for _, c := range []struct {
		path string
		code int
		want string
	}{
		{"/ci/nope/", http.StatusNotFound, "no project &#34;nope&#34;"},
		{"/ci/web/?before=abc", http.StatusBadRequest, "before must be an evaluation id"},
		{"/ci/web/?before=-3", http.StatusBadRequest, "before must be an evaluation id"},
		{"/ci/web/?before=1", http.StatusOK, "No evaluations before #1."},
	} {
		code, body := get(t, fx.h, c.path)
		if code != c.code || !strings.Contains(body, c.want) {
			t.Errorf("GET %s: %d, want %d with %q\n%s", c.path, code, c.code, c.want, body)
		}
	}
}

func TestNodesPage(t *testing.T) {
	t.Parallel()
	fx := newBrowseFixture(t)
	now := time.Now()
	fx.node("b1", status.NodeActive, false, []string{"x86_64-linux", "i686-linux"}, []string{"kvm", "big-parallel"}, now)
	fx.node("b2", status.NodeDraining, true, []string{"x86_64-linux"}, nil, now)
	fx.node("b3", status.NodeDead, false, []string{"aarch64-linux"}, nil, now.Add(-3*time.Hour))
	fx.exec(`UPDATE nodes SET nix_version = '2.26.3', nix_protocol = '1.38' WHERE id = 'b1'`)
	fx.exec(`UPDATE nodes SET nix_version = '2.8.0', nix_protocol = '1.34' WHERE id = 'b2'`)
	fx.exec(`INSERT INTO leaders (role, node_id, incarnation, epoch, acquired_at, lease_until)
VALUES ('maintainer', 'b1', gen_random_uuid(), 3, now() - interval '10 minutes', now() + interval '1 minute'),
       ('poller', 'b3', gen_random_uuid(), 7, now() - interval '4 hours', now() - interval '3 hours')`)

	// Where nodes are and what they run is shown to the admin token (and logged-in users),
	// not to anonymous visitors (as GET /api/cluster).
	fx.u.auth.admin, fx.u.auth.hasAdmin = httpapi.HashToken("nodes-token"), true
	req := httptest.NewRequestWithContext(t.Context(), http.MethodGet, "/ci/nodes", nil)
	req.Header.Set("Authorization", "Bearer nodes-token")
	rec := httptest.NewRecorder()
	fx.h.ServeHTTP(rec, req)
	body := rec.Body.String()
	if anon := fx.getOK("/ci/nodes"); strings.Contains(anon, "2.26.3") || strings.Contains(anon, "b1.host") || !strings.Contains(anon, "node-b1") {
		t.Errorf("the nodes page shows versions or hostnames to anonymous visitors:\n%s", anon)
	}
	for _, c := range []struct {
		node    string
		want    []string
		notWant []string
	}{
		{"b1", []string{`<span class="badge ok">online</span>`, `<span class="badge leader" title="leader of maintainer">leader: maintainer</span>`,
			"x86_64-linux, i686-linux", "kvm, big-parallel", "2 / 4", "1.50", "2.26.3", "protocol 1.38", "b1.host"}, []string{"draining", "offline"}},
		{"b2", []string{`<span class="badge draining"`, ">draining</span>", "2.8.0", "protocol 1.34"}, []string{"badge ok", "offline", "leader", "2.26"}},
		{"b3", []string{`<span class="badge off">offline</span>`, "offline since", "3 h ago"},
			[]string{"badge ok", "draining", "leader:", "protocol"}},
	} {
		row := element(t, body, "tr", "node-"+c.node)
		for _, s := range c.want {
			if !strings.Contains(row, s) {
				t.Errorf("node %s lacks %q:\n%s", c.node, s, row)
			}
		}
		for _, s := range c.notWant {
			if strings.Contains(row, s) {
				t.Errorf("node %s shows %q:\n%s", c.node, s, row)
			}
		}
	}
	leaders := element(t, body, "table", "leaders")
	for _, s := range []string{"<td>maintainer</td>", `<td class="mono">b1</td>`, `<td class="num">3</td>`, "10 min ago",
		"<td>poller</td>", `<td class="num">7</td>`, "expired"} {
		if !strings.Contains(leaders, s) {
			t.Errorf("leaders lack %q:\n%s", s, leaders)
		}
	}
}

func TestQueuePage(t *testing.T) {
	t.Parallel()
	fx := newBrowseFixture(t)
	fx.node("b1", status.NodeActive, false, []string{"x86_64-linux"}, []string{"kvm"}, time.Now())
	// A draining node has the feature big-parallel: it claims nothing, so it does not count.
	fx.node("b2", status.NodeDraining, true, []string{"x86_64-linux"}, []string{"big-parallel"}, time.Now())
	heavy := fx.project("heavy", "gitea", "o/heavy") // has used much of its share
	light := fx.project("light", "gitea", "o/light")
	fx.exec(`UPDATE projects SET consumed_seconds = 5000 WHERE id = $1`, heavy)

	t0 := fx.base
	heavyOld := fx.job(fx.drv("heavy-old", "x86_64-linux"), heavy, 0, t0)
	lightNew := fx.job(fx.drv("light-new", "x86_64-linux"), light, 0, t0.Add(time.Minute))
	none := fx.job(fx.drv("no-project", "x86_64-linux"), 0, 0, t0.Add(2*time.Minute))
	riscv := fx.job(fx.drv("riscv-thing", "riscv64-linux"), light, 0, t0.Add(3*time.Minute))
	parallel := fx.job(fx.drv("needs-big-parallel", "x86_64-linux", "big-parallel"), light, 0, t0.Add(4*time.Minute))
	urgent := fx.job(fx.drv("urgent", "x86_64-linux"), heavy, 100, t0.Add(5*time.Minute))
	in1, in2 := fx.drv("in1", "x86_64-linux"), fx.drv("in2", "x86_64-linux")
	top := fx.drv("top", "x86_64-linux")
	fx.input(top, in1)
	fx.input(top, in2)
	blockedIn1 := fx.job(in1, light, 0, t0.Add(6*time.Minute))
	blockedIn2 := fx.job(in2, light, 0, t0.Add(6*time.Minute))
	blocked := fx.job(top, light, 0, t0.Add(7*time.Minute))

	body := fx.getOK("/ci/queue")
	ready := element(t, body, "table", "ready")
	// Claim order: priority first, then the fair share (light and no project at ratio 0 before
	// heavy), then age.
	want := []int64{urgent, lightNew, none, riscv, parallel, blockedIn1, blockedIn2, heavyOld}
	if got := jobIDs(ready); !slices.Equal(got, want) {
		t.Errorf("ready jobs = %v, want %v", got, want)
	}
	waiting := element(t, body, "table", "waiting")
	if got := jobIDs(waiting); !slices.Equal(got, []int64{blocked}) {
		t.Errorf("waiting jobs = %v, want [%d]", got, blocked)
	}
	for _, c := range []struct {
		job     int64
		in      string
		want    []string
		notWant []string
	}{
		{urgent, ready, []string{">urgent</a>", `<td class="num">100</td>`, "x86_64-linux", "heavy", "a free slot"}, []string{"no capable builder", "blocked"}},
		{none, ready, []string{"no-project", `<span class="muted">none</span>`}, []string{"no capable builder"}},
		{riscv, ready, []string{"riscv64-linux", "no capable builder"}, []string{"blocked", "a free slot"}},
		{parallel, ready, []string{"no capable builder"}, []string{"blocked"}},
		{blocked, waiting, []string{"blocked on 2 inputs"}, []string{"no capable builder"}},
	} {
		row := element(t, c.in, "tr", fmt.Sprintf("job-%d", c.job))
		for _, s := range c.want {
			if !strings.Contains(row, s) {
				t.Errorf("job %d lacks %q:\n%s", c.job, s, row)
			}
		}
		for _, s := range c.notWant {
			if strings.Contains(row, s) {
				t.Errorf("job %d shows %q:\n%s", c.job, s, row)
			}
		}
	}
	if !strings.Contains(body, "<b>8</b><span>ready</span>") || !strings.Contains(body, "<b>1</b><span>waiting for inputs</span>") {
		t.Errorf("the counts are wrong:\n%s", element(t, body, "section", "queue-counts"))
	}

	// One input succeeds: the job now waits for one.
	fx.exec(`UPDATE build_jobs SET status = 'succeeded', finished_at = now() WHERE id = $1`, blockedIn1)
	row := element(t, fx.getOK("/ci/queue"), "tr", fmt.Sprintf("job-%d", blocked))
	if !strings.Contains(row, "blocked on 1 input<") {
		t.Errorf("after one input succeeded:\n%s", row)
	}
}

// TestQueuePagination walks every "Load more" of both lists and checks the pages add up to the
// order the claim takes the jobs in.
func TestQueuePagination(t *testing.T) {
	t.Parallel()
	fx := newBrowseFixture(t)
	var projects []int64
	for i, used := range []int{0, 300, 300, 1200} {
		p := fx.project(fmt.Sprintf("p%d", i), "gitea", fmt.Sprintf("o/p%d", i))
		fx.exec(`UPDATE projects SET consumed_seconds = $2, scheduling_shares = $3 WHERE id = $1`, p, used, 100+50*i)
		projects = append(projects, p)
	}
	systems := []string{"x86_64-linux", "aarch64-linux"}
	var readyIDs []int64
	for i := 0; i < 70; i++ {
		project := int64(0)
		if i%5 != 0 {
			project = projects[i%len(projects)]
		}
		// Many jobs share a creation time (one enqueue) and a priority: the id breaks ties.
		created := fx.base.Add(time.Duration(i/9) * time.Minute)
		priority := []int{0, 0, 0, 5, 100, -1}[i%6]
		readyIDs = append(readyIDs, fx.job(fx.drv(fmt.Sprintf("r%d", i), systems[i%2]), project, priority, created))
	}
	dep := fx.drv("dep", "x86_64-linux")
	readyIDs = append(readyIDs, fx.job(dep, projects[0], 0, fx.base))
	// Chains of dependents (critical-path order) split equal priorities and ratios, across
	// and within the pages.
	fx.exec(`UPDATE build_jobs SET dependent_chain = (id * 7) % 4 WHERE id = ANY($1)`, readyIDs)
	var waitIDs []int64
	for i := 0; i < 30; i++ {
		d := fx.drv(fmt.Sprintf("w%d", i), "x86_64-linux")
		fx.input(d, dep)
		waitIDs = append(waitIDs, fx.job(d, projects[i%len(projects)], []int{0, 7}[i%2], fx.base.Add(time.Duration(i/4)*time.Second)))
	}

	// walk follows a list's Load more links from the first page and returns the job rows.
	walk := func(table, more string) (ids []int64, pages int) {
		path := "/ci/queue"
		for path != "" {
			pages++
			if pages > 10 {
				t.Fatalf("more than 10 pages of %s", table)
			}
			body := fx.getOK(path)
			ids = append(ids, jobIDs(element(t, body, "tbody", table+"-rows"))...)
			path = moreURL(element(t, body, "div", more))
		}
		return ids, pages
	}

	gotReady, pages := walk("ready", "ready-more")
	if pages != 3 {
		t.Errorf("%d ready jobs in %d pages, want 3", len(readyIDs), pages)
	}
	// The order the claim takes them in: one job at a time by a builder of every system.
	var claimed []int64
	for range readyIDs {
		jobs, err := queue.ClaimJobs(fx.ctx, fx.pool, queue.Claimer{NodeID: "all", Systems: systems}, 1)
		if err != nil || len(jobs) != 1 {
			t.Fatalf("claim: %v, %d jobs", err, len(jobs))
		}
		claimed = append(claimed, jobs[0].ID)
	}
	if !slices.Equal(gotReady, claimed) {
		t.Errorf("ready jobs over the pages:\n%v\nthe claim takes them in this order:\n%v", gotReady, claimed)
	}

	gotWait, pages := walk("waiting", "waiting-more")
	if pages != 2 {
		t.Errorf("%d waiting jobs in %d pages, want 2", len(waitIDs), pages)
	}
	if len(gotWait) != 30 {
		t.Errorf("%d waiting jobs over the pages, want 30: %v", len(gotWait), gotWait)
	}
	var want []int64
	if err := fx.pool.QueryRow(fx.ctx, `SELECT array_agg(id ORDER BY priority DESC, created_at, id) FROM build_jobs
WHERE status = 'pending' AND blocked_inputs > 0`).Scan(&want); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(gotWait, want) {
		t.Errorf("waiting jobs over the pages:\n%v\nwant\n%v", gotWait, want)
	}

	for _, bad := range []string{"?after=1_2_3", "?after=x_0_0_0_0", "?after=1_0_-1_0_0", "?after=1_0_0_0", "?wafter=1_2", "?wafter=1_2_y"} {
		if code, _ := get(t, fx.h, "/ci/queue"+bad); code != http.StatusBadRequest {
			t.Errorf("GET /ci/queue%s: %d, want 400", bad, code)
		}
	}
}

// TestHostileNames checks that names from forges, pull requests, derivations and nodes are
// escaped on every page.
func TestHostileNames(t *testing.T) {
	t.Parallel()
	fx := newBrowseFixture(t)
	const evil = `<script>alert(1)</script>`
	p := fx.project(evil, "gitea", `o/<img src=x onerror=alert(2)>`)
	fx.eval(p, `"><b onmouseover=alert(3)>`, sha(1), status.EvalSucceeded, 0, "")
	fx.eval(p, "pull/1", sha(2), status.EvalFailed, 1, `"><svg onload=alert(4)>`)
	fx.job(fx.drv(`<iframe src=javascript:alert(5)>`, "x86_64-linux"), p, 0, fx.base)
	fx.exec(`INSERT INTO nodes (id, roles, endpoint, hostname, version, incarnation)
VALUES ('n1', '{"<u>role</u>"}', 'http://n1', '<marquee>host</marquee>', '"><i>v</i>', gen_random_uuid())`)

	for _, path := range []string{"/ci/", "/ci/" + "%3Cscript%3Ealert%281%29%3C%2Fscript%3E/", "/ci/queue", "/ci/nodes"} {
		body := fx.getOK(path)
		for _, raw := range []string{"<script>alert", "<img src=x", "<b onmouseover", "<svg onload", "<iframe",
			"<u>role", "<marquee>", "<i>v</i>"} {
			if strings.Contains(body, raw) {
				t.Errorf("GET %s: %q unescaped", path, raw)
			}
		}
	}
	body := fx.getOK("/ci/%3Cscript%3Ealert%281%29%3C%2Fscript%3E/")
	if !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Errorf("the project name is not shown escaped")
	}
	if !strings.Contains(body, `href="/ci/%3Cscript%3Ealert%281%29%3C%2Fscript%3E/eval/`) {
		t.Errorf("the evaluation links do not escape the project name")
	}
}

// TestPrivateProjectHidden checks that a logged-out viewer learns nothing of a private project:
// its page is the 404 of an unknown project, and its queued jobs are anonymous.
func TestPrivateProjectHidden(t *testing.T) {
	t.Parallel()
	fx := newBrowseFixture(t)
	p := fx.project("secret", "gitea", "o/secret")
	fx.exec(`UPDATE repositories SET is_private = true WHERE id = (SELECT repo_id FROM projects WHERE id = $1)`, p)
	fx.eval(p, "main", sha(1), status.EvalSucceeded, 0, "")
	job := fx.job(fx.drv("secret-pkg", "x86_64-linux"), p, 0, fx.base)
	public := fx.job(fx.drv("public-pkg", "x86_64-linux"), fx.project("open", "gitea", "o/open"), 0, fx.base)

	if code, body := get(t, fx.h, "/ci/secret/"); code != http.StatusNotFound || !strings.Contains(body, "no project &#34;secret&#34;") {
		t.Errorf("GET /ci/secret/ logged out: %d, want the 404 of an unknown project\n%s", code, body)
	}
	body := fx.getOK("/ci/queue")
	if strings.Contains(body, "secret") {
		t.Errorf("the queue names the private project or its job:\n%s", element(t, body, "table", "ready"))
	}
	if row := element(t, body, "tr", fmt.Sprintf("job-%d", job)); !strings.Contains(row, "a job of a private project") {
		t.Errorf("the private job's row:\n%s", row)
	}
	if row := element(t, body, "tr", fmt.Sprintf("job-%d", public)); !strings.Contains(row, ">public-pkg</a>") {
		t.Errorf("the public job's row:\n%s", row)
	}
}
