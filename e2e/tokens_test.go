package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/browsertest"
	"github.com/harmonia-ci/harmonia-ci/internal/giteatest"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

var apiTokenRE = regexp.MustCompile(`^hci_[A-Za-z0-9_-]{43}$`)

// mintAPITokenInBrowser mints a personal API token named name on public's /ci/tokens page in
// b, whose user is logged in, and returns it as the page shows it (once).
func mintAPITokenInBrowser(t *testing.T, b *browsertest.Browser, public, name string) string {
	t.Helper()
	b.Navigate(public + "/ci/tokens")
	b.SetValue("#api-token-name", name)
	b.Submit("#mint-api-token")
	b.WaitText("#minted-api", name, 20*time.Second)
	token := strings.TrimSpace(b.Text("#minted-api-token"))
	if !apiTokenRE.MatchString(token) {
		t.Fatalf("the tokens page shows %q as the minted API token", token)
	}
	return token
}

// withToken sends method url with token as its bearer token and returns the status and body.
func withToken(t *testing.T, method, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	return sendRequest(t, req)
}

// A user logs in through Gitea in Chromium, mints an API token on /ci/tokens and uses it from
// a script and from the command line on a machine without the database: it lists their private
// project, watch follows the evaluation to its end (exit 1: an attribute failed), failures
// prints the failed build's log tail, job rebuild rebuilds it (recorded and shown on the
// build's page), and another user's token is refused on it (403, exit 4, nothing changed).
// Revoked in the browser, the token is refused at its next request (401, exit 3). harmonia-ci
// login's page hands a new token to a loopback listener.
func TestAPITokenFromBrowser(t *testing.T) {
	u := newUICluster(t)
	ctx := context.Background()
	salt := uniqueSalt(t)
	sha := u.push(u.owner, u.repo, "main", map[string]string{"ci.nix": shLib(salt) + ` {
  broken = sh "broken" [] "echo failing on purpose >&2; exit 3";
}`}, false)
	evalID, _ := u.evalOf(sha, "main")
	var brokenID int64
	proctest.WaitFor(t, 3*time.Minute, "the broken build failed", func() bool {
		var s status.JobStatus
		err := u.pool.QueryRow(ctx, `SELECT j.id, j.status FROM eval_attrs a JOIN build_jobs j ON j.drv_path = a.drv_path
WHERE a.eval_id = $1 AND a.attr = 'broken'`, evalID).Scan(&brokenID, &s)
		return err == nil && s == status.JobFailed
	})

	owner := browsertest.New(t, browsertest.WithTimeout(3*time.Minute))
	u.login(owner, u.owner)
	token := mintAPITokenInBrowser(t, owner, u.public, "laptop")
	owner.Navigate(u.public + "/ci/tokens")
	if strings.Contains(owner.Text("body"), token) {
		t.Fatal("the tokens page shows the token again")
	}

	// Plain HTTP with the token: the private project is theirs to read.
	code, body := withToken(t, http.MethodGet, u.public+"/api/v1/projects", token)
	if code != http.StatusOK || !strings.Contains(body, `"`+u.private.Name+`"`) {
		t.Fatalf("/api/v1/projects with the owner's token: %d, without the private project %s: %s", code, u.private.Name, body)
	}
	if code, body := getStatus(t, u.public+"/api/v1/projects"); code != http.StatusOK || strings.Contains(body, `"`+u.private.Name+`"`) {
		t.Errorf("/api/v1/projects anonymously: %d, lists the private project: %s", code, body)
	}

	// Another user's token may read the public project's build, not act on it.
	carol, err := u.gitea.CreateUser(ctx, giteatest.UniqueName("carol"))
	if err != nil {
		t.Fatal(err)
	}
	stranger := browsertest.New(t, browsertest.WithTimeout(3*time.Minute))
	u.login(stranger, carol)
	carolToken := mintAPITokenInBrowser(t, stranger, u.public, "script")
	var attempt int
	if err := u.pool.QueryRow(ctx, `SELECT attempt FROM build_jobs WHERE id = $1`, brokenID).Scan(&attempt); err != nil {
		t.Fatal(err)
	}
	rebuild := fmt.Sprintf("%s/api/builds/%d/rebuild", u.public, brokenID)
	if code, body := withToken(t, http.MethodPost, rebuild, carolToken); code != http.StatusForbidden {
		t.Errorf("another user's token rebuilds the owner's build: %d %s, want 403", code, body)
	}
	carolCLI := &remoteCLI{t: t, server: u.public, token: carolToken, home: t.TempDir()}
	if code, _, stderr := carolCLI.run("job", "rebuild", strconv.FormatInt(brokenID, 10)); code != 4 || !strings.Contains(stderr, "forbidden (403") {
		t.Errorf("job rebuild with another user's token: exit %d, want 4 saying it is forbidden:\n%s", code, stderr)
	}
	var s status.JobStatus
	var after int
	if err := u.pool.QueryRow(ctx, `SELECT status, attempt FROM build_jobs WHERE id = $1`, brokenID).Scan(&s, &after); err != nil ||
		s != status.JobFailed || after != attempt {
		t.Errorf("a refused rebuild changed the build: %s, attempt %d → %d (%v)", s, attempt, after, err)
	}

	// The owner's command line, on a machine without the database, follows the evaluation to
	// its end (exit 1: an attribute failed), prints the failure's log tail and rebuilds it, no
	// CSRF token needed; the build page says who.
	cli := &remoteCLI{t: t, server: u.public, token: token, home: t.TempDir()}
	evalArg := strconv.FormatInt(evalID, 10)
	if code, _, stderr := cli.run("watch", evalArg); code != 1 || !strings.Contains(stderr, "broken (failed)") {
		t.Errorf("watch of the evaluation with a failed attribute: exit %d, want 1 naming it:\n%s", code, stderr)
	}
	if out := cli.expect(0, "failures", evalArg); !strings.Contains(out, "failing on purpose") {
		t.Errorf("failures lacks the failed build's log tail:\n%s", out)
	}
	cli.expect(0, "job", "rebuild", strconv.FormatInt(brokenID, 10))
	proctest.WaitFor(t, 2*time.Minute, "the rebuilt build failed again", func() bool {
		_ = u.pool.QueryRow(ctx, `SELECT status, attempt FROM build_jobs WHERE id = $1`, brokenID).Scan(&s, &after)
		return after > attempt && s == status.JobFailed
	})
	owner.Navigate(fmt.Sprintf("%s/ci/%s/build/%d", u.public, u.repo.Name, brokenID))
	owner.WaitText("#actions-log", fmt.Sprintf(`rebuilt by gitea:%s (token "laptop")`, u.owner.Login), 10*time.Second)

	// Revoked in the browser: refused at once.
	owner.Navigate(u.public + "/ci/tokens")
	owner.Submit("#api-tokens form[action$='/revoke'] button")
	owner.WaitText("body", "API token revoked", 10*time.Second)
	if code, body := withToken(t, http.MethodGet, u.public+"/api/v1/projects", token); code != http.StatusUnauthorized || !strings.Contains(body, `"error"`) {
		t.Errorf("a revoked token: %d %s, want a JSON 401", code, body)
	}
	if code, _, stderr := cli.run("eval", "show", evalArg); code != 3 || !strings.Contains(stderr, "refused the token") {
		t.Errorf("the command line with a revoked token: exit %d, want 3 saying the token was refused:\n%s", code, stderr)
	}

	// harmonia-ci login's page: confirmed in the browser, the token reaches the command line's
	// loopback listener in a form POST (submitted by the page's own script), with the state.
	got := make(chan url.Values, 1)
	listener := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.ParseForm() == nil {
			select {
			case got <- r.PostForm:
			default:
			}
		}
		fmt.Fprintln(w, "logged in")
	}))
	defer listener.Close()
	const state = "0123456789abcdef-state"
	owner.Navigate(u.public + "/ci/tokens/cli?" + url.Values{"callback": {listener.URL + "/callback"}, "state": {state},
		"name": {"cli on laptop"}}.Encode())
	owner.WaitText("#cli-confirm", `Create a token named “cli on laptop” for the command line?`, 10*time.Second)
	owner.Click("#cli-create")
	select {
	case form := <-got:
		if form.Get("state") != state || !apiTokenRE.MatchString(form.Get("token")) {
			t.Fatalf("the callback got state %q and token %q", form.Get("state"), form.Get("token"))
		}
		if code, _ := withToken(t, http.MethodGet, u.public+"/api/v1/projects", form.Get("token")); code != http.StatusOK {
			t.Errorf("the command line's token: %d", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the callback got no token; the browser is at %s:\n%s", owner.Location(), owner.Text("body"))
	}

	for _, b := range []*browsertest.Browser{owner, stranger} {
		for _, e := range b.ConsoleErrors() {
			if !strings.Contains(e, u.gitea.URL) && !(strings.HasPrefix(e, "console.error: Event (") && strings.Contains(e, "htmx")) {
				t.Errorf("browser console: %s", e)
			}
		}
	}
}
