package e2e

import (
	"context"
	"encoding/xml"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/harmonia-ci/harmonia-ci/internal/browsertest"
	"github.com/harmonia-ci/harmonia-ci/internal/giteatest"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// uiCluster is a forge cluster behind a known public URL (the OAuth redirect needs it before
// the frontend starts), with Gitea login configured and a second, private repository.
type uiCluster struct {
	*forgeCluster
	public  string // the frontend's public URL (a balancer in front of front-1)
	private giteatest.Repo
}

func newUICluster(t *testing.T) *uiCluster {
	t.Helper()
	browsertest.Need(t)
	// No client timeout: event streams last as long as their page; the browser ends them.
	lb, public := startRoundRobin(t, 0)
	u := &uiCluster{public: public}
	u.forgeCluster = newForgeCluster(t, forgeOptions{builders: 1, publicURL: public,
		prepare: func(g *giteatest.Server, owner giteatest.User) (string, []string) {
			ctx := context.Background()
			var err error
			if u.private, err = g.CreateRepo(ctx, owner, giteatest.UniqueName("secret"), true); err != nil {
				t.Fatal(err)
			}
			if _, err := g.Push(ctx, u.private, owner, "main", map[string]string{"README": "private\n"}, "init", false); err != nil {
				t.Fatal(err)
			}
			return oauthLines(giteaOAuthApp(t, g, owner.Token, public))
		}})
	lb.set(u.endpoint("front-1"))
	u.enable(nil)
	var privateID int64
	proctest.WaitFor(t, 30*time.Second, "the private repository discovered", func() bool {
		return u.pool.QueryRow(context.Background(), `SELECT id FROM repositories WHERE full_name = $1`, u.private.FullName()).Scan(&privateID) == nil
	})
	if code, out := u.admin("front-1", http.MethodPost, fmt.Sprintf("/api/projects/%d/enable", privateID), nil); code != http.StatusOK {
		t.Fatalf("enable the private repository: %d %s", code, out)
	}
	return u
}

// login signs user in to harmonia-ci through Gitea's login form and consent page. Gitea's
// pages run with JavaScript off: the Gitea built from the module proxy has no frontend bundle,
// and its pages' scripts then never let Chromium finish loading them. Its forms work without.
func (u *uiCluster) login(b *browsertest.Browser, user giteatest.User) {
	u.t.Helper()
	setScripts(u.t, b, false)
	b.Navigate(u.public + "/ci/login")
	b.SetValue("#user_name", user.Login)
	b.SetValue("#password", user.Password)
	b.Submit("#password")
	// Gitea asks to authorize the application (once per user).
	if !strings.HasPrefix(b.Location(), u.public) {
		b.Click("#authorize-app") // the button is the answer: a plain submit would deny
		proctest.WaitFor(u.t, 20*time.Second, "back from Gitea's consent page", func() bool {
			// Between pages there is no location to read: not there yet.
			loc, err := chromedp.Run(b.Ctx, chromedp.Location())
			return err == nil && strings.HasPrefix(loc, u.public)
		})
	}
	if !strings.HasPrefix(b.Location(), u.public) {
		u.t.Fatalf("login: the browser stays at %s:\n%s", b.Location(), b.Text("body"))
	}
	setScripts(u.t, b, true)
	b.Navigate(b.Location())
	b.WaitText("header .user", user.Login+"@gitea", 20*time.Second)
	if !strings.HasPrefix(b.Location(), u.public+"/ci/") {
		u.t.Fatalf("after login the browser is at %s, want %s/ci/…", b.Location(), u.public)
	}
}

// evalPage is an evaluation's page on the public URL.
func (u *uiCluster) evalPage(id int64) string {
	return fmt.Sprintf("%s/ci/%s/eval/%d", u.public, u.repo.Name, id)
}

// jobOf is the build job of an attribute of evaluation evalID.
func (u *uiCluster) jobOf(evalID int64, attr string) (id int64, st status.JobStatus, attempt int) {
	u.t.Helper()
	err := u.pool.QueryRow(context.Background(), `SELECT j.id, j.status, j.attempt FROM eval_attrs a
JOIN build_jobs j ON j.drv_path = a.drv_path WHERE a.eval_id = $1 AND a.attr = $2`, evalID, attr).Scan(&id, &st, &attempt)
	if err != nil {
		u.t.Fatalf("job of %s in evaluation %d: %v", attr, evalID, err)
	}
	return id, st, attempt
}

// The web UI against a real cluster, a real Gitea and a real Chromium: a visitor watches an
// evaluation fill in live and sees no buttons; the owner logs in through Gitea and rebuilds a
// failure with a click; a user without write access is refused and nothing changes; a private
// project stays hidden from those who cannot read it; pages without JavaScript show the same
// data; the timeline has one bar per build on the builder that ran it.
func TestWebUI(t *testing.T) {
	u := newUICluster(t)
	ctx := context.Background()
	salt := uniqueSalt(t)
	ci := shLib(salt) + ` {
  fast = sh "fast" [] "echo fast";
  slow = sh "slow" [] "/bin/sleep 10";
  broken = sh "broken" [] "echo failing on purpose >&2; exit 3";
}`
	sha := u.push(u.owner, u.repo, "main", map[string]string{"ci.nix": ci}, false)
	evalID, _ := u.evalOf(sha, "main")

	// A visitor: the public project is listed, the private one not; the evaluation page fills
	// in without a reload, and offers no action.
	visitor := browsertest.New(t, browsertest.WithTimeout(4*time.Minute))
	visitor.Navigate(u.public + "/ci/")
	visitor.WaitText("#projects", u.repo.Name, 10*time.Second)
	if strings.Contains(visitor.Text("#projects"), u.private.Name) {
		t.Errorf("a visitor sees the private project %s", u.private.Name)
	}
	proctest.WaitFor(t, time.Minute, "the evaluation's attributes", func() bool {
		var n int
		_ = u.pool.QueryRow(ctx, `SELECT count(*) FROM eval_attrs WHERE eval_id = $1`, evalID).Scan(&n)
		return n == 3
	})
	visitor.Navigate(u.evalPage(evalID))
	if _, err := chromedp.Run(visitor.Ctx, chromedp.Evaluate[string](`window.hciMarker = "same page"`)); err != nil {
		t.Fatal(err)
	}
	slowID, _, _ := u.jobOf(evalID, "slow")
	visitor.WaitText(fmt.Sprintf("#attrs tr td a[href$='/build/%d']", slowID), "", time.Second) // the row exists
	slowRow := fmt.Sprintf("#attrs tbody tr:has(a[href$='/build/%d'])", slowID)
	if strings.Contains(visitor.Text(slowRow), "succeeded") {
		t.Fatalf("the slow build had finished before its page loaded: nothing to see live")
	}
	visitor.WaitText(slowRow, "succeeded", 2*time.Minute)
	if marker, err := chromedp.Run(visitor.Ctx, chromedp.Evaluate[string](`window.hciMarker || ""`)); err != nil || marker != "same page" {
		t.Errorf("the row changed by reloading the page (marker %q, %v), not live", marker, err)
	}
	if n := visitor.Count(".actions button"); n != 0 {
		t.Errorf("a visitor sees %d action buttons", n)
	}
	u.waitStatuses(sha, "success", "failure", 2*time.Minute)
	visitor.Navigate(u.evalPage(evalID))
	visitor.Screenshot("evaluation")
	visitor.Navigate(u.public + "/ci/")
	visitor.Screenshot("dashboard")

	// The timeline: one bar per build, each in a lane of the builder that ran it.
	visitor.Navigate(u.evalPage(evalID))
	svg, err := chromedp.Run(visitor.Ctx, chromedp.OuterHTML("figure.timeline svg"))
	if err != nil {
		t.Fatal(err)
	}
	checkTimeline(t, svg, u.jobsOf(evalID))

	// An attribute's history, from its row's link, and the project's badge and latest link
	// (the default branch has one evaluation: the build broke, so the badge says failing).
	visitor.Click(slowRow + " a.history")
	visitor.WaitText("#history tbody", "succeeded", 10*time.Second)
	if n := visitor.Count("#history-chart rect"); n != 1 {
		t.Errorf("the history chart of slow has %d bars, want 1", n)
	}
	// The badge is an image a README shows, fetched as the forge's image proxy would.
	if code, svg := getStatus(t, fmt.Sprintf("%s/ci/%s/badge.svg", u.public, u.repo.Name)); code != http.StatusOK ||
		!strings.Contains(svg, "<title>harmonia-ci: failing</title>") {
		t.Errorf("the badge: %d %s; want it to say failing", code, svg)
	}
	visitor.Navigate(fmt.Sprintf("%s/ci/%s/latest/slow", u.public, u.repo.Name))
	if want := fmt.Sprintf("/ci/%s/build/%d", u.repo.Name, slowID); !strings.HasSuffix(visitor.Location(), want) {
		t.Errorf("the latest link of slow led to %s, want …%s", visitor.Location(), want)
	}

	// The owner logs in through Gitea and rebuilds the failure with one click.
	brokenID, st, attempt := u.jobOf(evalID, "broken")
	if st != status.JobFailed {
		t.Fatalf("broken: %s, want failed", st)
	}
	owner := browsertest.New(t, browsertest.WithTimeout(3*time.Minute))
	u.login(owner, u.owner)
	for _, c := range owner.Cookies() {
		if c.Name == "harmonia_session" {
			if !c.HTTPOnly || c.SameSite != "Lax" || c.Secure || c.Path != "/" {
				t.Errorf("session cookie %s: HttpOnly %v SameSite %s Secure %v Path %s", c.Name, c.HTTPOnly, c.SameSite, c.Secure, c.Path)
			}
		}
	}
	owner.Navigate(u.public + "/ci/")
	owner.WaitText("#projects", u.private.Name, 10*time.Second) // its owner sees the private project
	buildPage := fmt.Sprintf("%s/ci/%s/build/%d", u.public, u.repo.Name, brokenID)
	owner.Navigate(buildPage)
	owner.Screenshot("build")
	owner.Click(".actions form[action$='/rebuild'] button")
	proctest.WaitFor(t, time.Minute, "the failed build rebuilt", func() bool {
		var a int
		var s status.JobStatus
		_ = u.pool.QueryRow(ctx, `SELECT status, attempt FROM build_jobs WHERE id = $1`, brokenID).Scan(&s, &a)
		return a > attempt && s == status.JobFailed
	})

	// Another Gitea user, without write access: no buttons, and a forged action is refused
	// with 403 while nothing changes.
	carol, err := u.gitea.CreateUser(ctx, giteatest.UniqueName("carol"))
	if err != nil {
		t.Fatal(err)
	}
	stranger := browsertest.New(t, browsertest.WithTimeout(3*time.Minute))
	u.login(stranger, carol)
	stranger.Navigate(buildPage)
	if n := stranger.Count(".actions button"); n != 0 {
		t.Errorf("a user without write access sees %d action buttons", n)
	}
	_, _, before := u.jobOf(evalID, "broken")
	code, err := chromedp.Run(stranger.Ctx, chromedp.Evaluate[int](fmt.Sprintf(`(async () => {
  const csrf = document.querySelector("header form input[name=csrf]").value;
  const r = await fetch("/api/builds/%d/rebuild", {method: "POST", headers: {"X-CSRF-Token": csrf}});
  return r.status;
})()`, brokenID), chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatal(err)
	}
	if code != http.StatusForbidden {
		t.Errorf("a rebuild by a user without write access: %d, want 403", code)
	}
	if _, s, after := u.jobOf(evalID, "broken"); after != before || s != status.JobFailed {
		t.Errorf("a refused rebuild changed the job: %s, attempt %d → %d", s, before, after)
	}
	stranger.Navigate(u.public + "/ci/")
	if strings.Contains(stranger.Text("#projects"), u.private.Name) {
		t.Errorf("a user without access sees the private project")
	}
	if code, _ := getStatus(t, fmt.Sprintf("%s/ci/%s/", u.public, u.private.Name)); code != http.StatusNotFound {
		t.Errorf("the private project's page logged out: %d, want 404", code)
	}

	// Without JavaScript the pages show the same data.
	plain := browsertest.New(t, browsertest.WithoutJavaScript())
	plain.Navigate(u.evalPage(evalID))
	for _, attr := range []string{"fast", "slow", "broken"} {
		if !strings.Contains(plain.Text("#attrs"), attr) {
			t.Errorf("without JavaScript the evaluation page lacks %s", attr)
		}
	}
	if !strings.Contains(plain.Text("#attrs"), "succeeded") || !strings.Contains(plain.Text("#attrs"), "failed") {
		t.Errorf("without JavaScript the statuses are missing: %s", plain.Text("#attrs"))
	}
	plain.Navigate(u.public + "/ci/")
	if !strings.Contains(plain.Text("#projects"), u.repo.Name) {
		t.Errorf("without JavaScript the dashboard lacks the project")
	}
	for _, b := range []*browsertest.Browser{visitor, owner, stranger} {
		for _, e := range b.ConsoleErrors() {
			switch {
			case strings.Contains(e, u.gitea.URL): // Gitea's pages, whose bundles this Gitea lacks
			case strings.Contains(e, "403"): // the stranger's refused fetch
			case strings.HasPrefix(e, "console.error: Event (") && strings.Contains(e, "htmx"):
				// HTMX's SSE extension logs the end of its stream when the page is left.
			default:
				t.Errorf("browser console: %s", e)
			}
		}
	}
}

// jobsOf maps the build jobs of an evaluation's attributes and their inputs to their builder.
func (u *uiCluster) jobsOf(evalID int64) map[string]string {
	u.t.Helper()
	rows, err := u.pool.Query(context.Background(), `
WITH RECURSIVE closure AS (
    SELECT drv_path FROM eval_attrs WHERE eval_id = $1 AND drv_path IS NOT NULL
  UNION
    SELECT di.input_drv FROM derivation_inputs di JOIN closure c ON di.referrer = c.drv_path
)
SELECT j.id::text, j.claimed_by FROM closure JOIN build_jobs j USING (drv_path) WHERE j.claimed_by IS NOT NULL`, evalID)
	if err != nil {
		u.t.Fatal(err)
	}
	defer rows.Close()
	jobs := map[string]string{}
	for rows.Next() {
		var id, node string
		if err := rows.Scan(&id, &node); err != nil {
			u.t.Fatal(err)
		}
		jobs[id] = node
	}
	return jobs
}

// checkTimeline checks that svg has exactly one bar per job, in a lane of its builder.
func checkTimeline(t *testing.T, svg string, jobs map[string]string) {
	t.Helper()
	type rect struct {
		Job   string `xml:"data-job,attr"`
		Class string `xml:"class,attr"`
	}
	type lane struct {
		Node  string `xml:"data-node,attr"`
		Rects []rect `xml:"rect"`
		Links []struct {
			Rects []rect `xml:"rect"`
		} `xml:"a"`
	}
	var doc struct {
		Lanes []lane `xml:"g"`
	}
	if err := xml.Unmarshal([]byte(svg), &doc); err != nil {
		t.Fatalf("timeline SVG: %v\n%s", err, svg)
	}
	seen := map[string]string{}
	for _, l := range doc.Lanes {
		rs := l.Rects
		for _, a := range l.Links {
			rs = append(rs, a.Rects...)
		}
		for _, r := range rs {
			if r.Job == "" {
				continue
			}
			if _, dup := seen[r.Job]; dup {
				t.Errorf("timeline: build %s has two bars", r.Job)
			}
			seen[r.Job] = l.Node
		}
	}
	for id, node := range jobs {
		if seen[id] != node {
			t.Errorf("timeline: build %s in lane %q, want %q", id, seen[id], node)
		}
	}
	if len(seen) != len(jobs) {
		t.Errorf("timeline: %d bars for %d builds", len(seen), len(jobs))
	}
}

func getStatus(t *testing.T, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return sendRequest(t, req)
}

// setScripts turns the tab's JavaScript on or off.
func setScripts(t *testing.T, b *browsertest.Browser, on bool) {
	t.Helper()
	if _, err := chromedp.Call(b.Ctx, emulation.SetScriptExecutionDisabled,
		emulation.SetScriptExecutionDisabledParams{Value: !on}); err != nil {
		t.Fatal(err)
	}
}
