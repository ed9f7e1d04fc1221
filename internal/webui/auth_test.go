package webui

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/githubtest"
	"github.com/harmonia-ci/harmonia-ci/internal/session"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

const (
	authTestSecret = "0123456789abcdef0123456789abcdef"
	authTestToken  = "s3cret-admin-token"
	authTestCommit = "89abcdef0123456789abcdef0123456789abcdef"
)

// authFixture is a UI with login through a stand-in GitHub ("github"), served over HTTP on
// loopback, with the admin token authTestToken and the admin github:boss. On the stand-in,
// installation 7 holds octo/app (public; "writer" may push, "reader" reads) and octo/secret
// (private; "friend" reads).
type authFixture struct {
	t    *testing.T
	ctx  context.Context
	u    *UI
	pool *pgxpool.Pool
	gh   *githubtest.Server
	srv  *httptest.Server
	drvs int
}

func newAuthFixture(t *testing.T, opts ...func(*Config)) *authFixture {
	t.Helper()
	pool := dbtest.NewPool(t)
	gh := githubtest.New(t)
	gh.AddInstallation(7, githubtest.Repo{FullName: "octo/app"}, githubtest.Repo{FullName: "octo/secret", Private: true})
	gh.AddCollaborator("octo/app", "writer")
	gh.SetPermission("octo/app", "reader", "read")
	gh.SetPermission("octo/secret", "friend", "read")
	ghf, err := forge.NewGitHub(forge.GitHubConfig{Name: "github", APIURL: gh.URL, AppID: gh.AppID,
		PrivateKey: gh.PrivateKeyPEM, WebhookSecret: gh.WebhookSecret})
	if err != nil {
		t.Fatal(err)
	}
	o, err := forge.NewOAuth(forge.OAuthConfig{Type: forge.TypeGitHub, WebURL: gh.URL, APIURL: gh.URL,
		ClientID: gh.OAuthClientID, ClientSecret: gh.OAuthClientSecret})
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg := Config{Pool: pool, Forges: forge.Set{"github": ghf}, Logger: logger,
		Secret: []byte(authTestSecret), Admins: []string{"github:boss"}, AdminToken: authTestToken,
		OAuth: map[string]forge.OAuth{"github": o}}
	for _, o := range opts {
		o(&cfg)
	}
	u, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(testMux(u))
	t.Cleanup(srv.Close)
	return &authFixture{t: t, ctx: t.Context(), u: u, pool: pool, gh: gh, srv: srv}
}

func (fx *authFixture) id(sql string, args ...any) int64 {
	fx.t.Helper()
	var id int64
	if err := fx.pool.QueryRow(fx.ctx, sql, args...).Scan(&id); err != nil {
		fx.t.Fatalf("%s: %v", sql, err)
	}
	return id
}

func (fx *authFixture) str(sql string, args ...any) string {
	fx.t.Helper()
	var s string
	if err := fx.pool.QueryRow(fx.ctx, sql, args...).Scan(&s); err != nil {
		fx.t.Fatalf("%s: %v", sql, err)
	}
	return s
}

// project inserts a repository and its project; forge "git" is a project added by URL.
func (fx *authFixture) project(name, forgeName, fullName string, private bool) int64 {
	fx.t.Helper()
	owner, repo, _ := strings.Cut(fullName, "/")
	r := fx.id(`INSERT INTO repositories (forge, owner, name, full_name, clone_url, is_private, installation_id)
VALUES ($1, $2, $3, $4, $5, $6, CASE WHEN $1 = 'github' THEN 7 END) RETURNING id`,
		forgeName, owner, repo, fullName, "https://x/"+fullName+".git", private)
	return fx.id(`INSERT INTO projects (repo_id, name) VALUES ($1, $2) RETURNING id`, r, name)
}

// eval inserts an evaluation; pr 0 is a branch evaluation. A pull request's author is
// recorded with the id the stand-in GitHub gives the login now, as a webhook would.
func (fx *authFixture) eval(project int64, st status.EvalStatus, pr int, author string) int64 {
	fx.t.Helper()
	var authorID int64
	if author != "" {
		authorID = fx.gh.UserID(author)
	}
	return fx.id(`INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status, pr_number, pr_author,
    pr_author_id, started_at, finished_at)
VALUES ($1, 'git+https://x/app.git', $2, $3, $4, NULLIF($5, 0), NULLIF($6, ''), NULLIF($7::bigint, 0), now(),
        CASE WHEN $4 IN ('succeeded', 'failed', 'cancelled') THEN now() END) RETURNING id`,
		project, authTestCommit, fmt.Sprintf("branch-%d-%d", pr, fx.drvs), st, pr, author, authorID)
}

// job inserts a derivation, its build job in status (for project) and, if evalID is not 0, an
// attribute of that evaluation; inputs become the derivation's inputs. It returns the job id
// and the derivation.
func (fx *authFixture) job(project, evalID int64, st status.JobStatus, inputs ...string) (int64, string) {
	fx.t.Helper()
	fx.drvs++
	hash := fmt.Sprintf("%032d", fx.drvs)
	name := fmt.Sprintf("pkg%d", fx.drvs)
	drv := "/nix/store/" + hash + "-" + name + ".drv"
	fx.id(`INSERT INTO derivations (drv_path, hash_part, name, system, nar_hash, nar_size)
VALUES ($1, $2, $3, 'x86_64-linux', 'sha256:0', 0) RETURNING 1`, drv, hash, name)
	for _, in := range inputs {
		fx.id(`INSERT INTO derivation_inputs (referrer, input_drv, outputs) VALUES ($1, $2, '{out}') RETURNING 1`, drv, in)
	}
	id := fx.id(`INSERT INTO build_jobs (drv_path, project_id, system, status, finished_at, claimed_by)
VALUES ($1, $2, 'x86_64-linux', $3, CASE WHEN $3 IN ('failed', 'dep-failed', 'cancelled', 'succeeded') THEN now() END,
        CASE WHEN $3 IN ('building', 'uploading') THEN 'node1' END) RETURNING id`, drv, project, st)
	if evalID != 0 {
		fx.id(`INSERT INTO eval_attrs (eval_id, attr, drv_path) VALUES ($1, $2, $3) RETURNING id`, evalID, name, drv)
	}
	return id, drv
}

func (fx *authFixture) evalStatus(id int64) status.EvalStatus {
	fx.t.Helper()
	return status.EvalStatus(fx.str(`SELECT status FROM evaluations WHERE id = $1`, id))
}

func (fx *authFixture) jobStatus(id int64) status.JobStatus {
	fx.t.Helper()
	return status.JobStatus(fx.str(`SELECT status FROM build_jobs WHERE id = $1`, id))
}

// browser is a test browser: a cookie jar, not following redirects.
type browser struct {
	fx     *authFixture
	client *http.Client
}

func (fx *authFixture) browser() *browser {
	jar, err := cookiejar.New(nil)
	if err != nil {
		fx.t.Fatal(err)
	}
	return &browser{fx: fx, client: &http.Client{Jar: jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// do sends a request (a relative URL is on the UI) and returns the answer with its body read.
func (b *browser) do(method, rawURL string, body io.Reader, header map[string]string) (*http.Response, string) {
	b.fx.t.Helper()
	if strings.HasPrefix(rawURL, "/") {
		rawURL = b.fx.srv.URL + rawURL
	}
	req, err := http.NewRequestWithContext(b.fx.ctx, method, rawURL, body)
	if err != nil {
		b.fx.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := b.client.Do(req)
	if err != nil {
		b.fx.t.Fatalf("%s %s: %v", method, rawURL, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp, string(data)
}

func (b *browser) get(rawURL string) (*http.Response, string) { return b.do("GET", rawURL, nil, nil) }

// follow GETs rawURL and follows redirects, returning the last answer.
func (b *browser) follow(rawURL string) (*http.Response, string) {
	b.fx.t.Helper()
	for range 10 {
		resp, body := b.get(rawURL)
		if resp.StatusCode/100 != 3 {
			return resp, body
		}
		loc, err := resp.Location()
		if err != nil {
			b.fx.t.Fatal(err)
		}
		rawURL = loc.String()
	}
	b.fx.t.Fatalf("too many redirects from %s", rawURL)
	return nil, ""
}

// login logs the browser in as login through the stand-in GitHub's OAuth flow.
func (b *browser) login(login string) *browser {
	b.fx.t.Helper()
	b.fx.gh.OAuthAs(login)
	resp, body := b.follow("/ci/login/github")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, login+"@github") {
		b.fx.t.Fatalf("login as %s: %d, page without %s@github:\n%s", login, resp.StatusCode, login, body)
	}
	return b
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf is the CSRF token the dashboard's logout form carries.
func (b *browser) csrf() string {
	b.fx.t.Helper()
	_, body := b.get("/ci/")
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		b.fx.t.Fatalf("no CSRF field on the dashboard:\n%s", body)
	}
	return m[1]
}

// post POSTs form to path.
func (b *browser) post(path string, form url.Values, header map[string]string) (*http.Response, string) {
	return b.do("POST", path, strings.NewReader(form.Encode()), header)
}

func cookieNamed(resp *http.Response, name string) *http.Cookie {
	for _, c := range resp.Cookies() {
		if c.Name == name {
			return c
		}
	}
	return nil
}

func TestLoginFlow(t *testing.T) {
	t.Parallel()
	fx := newAuthFixture(t)
	b := fx.browser()

	// Logged out: the header offers to log in, coming back to the page.
	_, body := b.get("/ci/")
	if !strings.Contains(body, `href="/ci/login?next=%2Fci%2F"`) || strings.Contains(body, "Log out") {
		t.Fatalf("logged-out dashboard header:\n%s", body)
	}
	// One forge: /ci/login goes straight to it.
	resp, _ := b.get("/ci/login?next=/ci/app/")
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusFound || loc != "/ci/login/github?next=%2Fci%2Fapp%2F" {
		t.Fatalf("GET /ci/login: %d to %q", resp.StatusCode, loc)
	}

	fx.gh.OAuthAs("alice")
	resp, _ = b.get("/ci/login/github?next=/ci/app/")
	authURL, err := resp.Location()
	if err != nil || resp.StatusCode != http.StatusFound || !strings.HasPrefix(authURL.String(), fx.gh.URL+"/login/oauth/authorize?") {
		t.Fatalf("GET /ci/login/github: %d to %v", resp.StatusCode, authURL)
	}
	if st := cookieNamed(resp, stateCookie); st == nil || !st.HttpOnly || st.Path != "/ci/oauth/" || st.SameSite != http.SameSiteLaxMode {
		t.Errorf("state cookie %+v: want HttpOnly, Path /ci/oauth/, SameSite Lax", st)
	}
	if got := authURL.Query().Get("redirect_uri"); got != fx.srv.URL+"/ci/oauth/github/callback" {
		t.Errorf("redirect_uri %q", got)
	}
	resp, _ = b.get(authURL.String())
	callback, err := resp.Location()
	if err != nil || !strings.HasPrefix(callback.String(), fx.srv.URL+"/ci/oauth/github/callback?") {
		t.Fatalf("the forge sent the browser to %v", callback)
	}
	resp, body = b.get(callback.String())
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ci/app/" {
		t.Fatalf("callback: %d to %q:\n%s", resp.StatusCode, resp.Header.Get("Location"), body)
	}
	c := cookieNamed(resp, session.CookieName)
	if c == nil || !c.HttpOnly || c.Path != "/" || c.SameSite != http.SameSiteLaxMode || c.Secure {
		t.Fatalf("session cookie %+v: want HttpOnly, Path /, SameSite Lax, not Secure on loopback", c)
	}
	if fx.gh.UserTokens() != 1 {
		t.Errorf("%d user tokens issued, want 1", fx.gh.UserTokens())
	}

	// Logged in: the header shows who, and a logout form with the CSRF token.
	_, body = b.get("/ci/")
	if !strings.Contains(body, "alice@github") || !strings.Contains(body, `action="/ci/logout"`) || !csrfRE.MatchString(body) {
		t.Fatalf("logged-in header:\n%s", body)
	}
	// Logout needs the CSRF token.
	resp, _ = b.post("/ci/logout", nil, map[string]string{"Accept": "text/html"})
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("logout without the CSRF token: %d, want 403", resp.StatusCode)
	}
	if _, body = b.get("/ci/"); !strings.Contains(body, "alice@github") {
		t.Fatal("a refused logout logged out")
	}
	resp, _ = b.post("/ci/logout", url.Values{"csrf": {b.csrf()}}, map[string]string{"Accept": "text/html"})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ci/" {
		t.Errorf("logout: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if _, body = b.get("/ci/"); strings.Contains(body, "alice@github") || !strings.Contains(body, "Log in") {
		t.Errorf("after logout:\n%s", body)
	}
}

func TestLoginCallbackRefuses(t *testing.T) {
	t.Parallel()
	fx := newAuthFixture(t)
	fx.gh.OAuthAs("alice")

	// start begins a login in b and returns the callback URL the forge sends it to.
	start := func(b *browser) *url.URL {
		t.Helper()
		resp, _ := b.get("/ci/login/github")
		authURL, err := resp.Location()
		if err != nil {
			t.Fatal(err)
		}
		resp, _ = b.get(authURL.String())
		cb, err := resp.Location()
		if err != nil {
			t.Fatal(err)
		}
		return cb
	}
	loggedIn := func(b *browser) bool {
		_, body := b.get("/ci/")
		return strings.Contains(body, "alice@github")
	}

	// A state that is not the one of this browser's cookie.
	b := fx.browser()
	cb := start(b)
	q := cb.Query()
	q.Set("state", "forged")
	cb.RawQuery = q.Encode()
	if resp, _ := b.get(cb.String()); resp.StatusCode != http.StatusBadRequest || loggedIn(b) {
		t.Errorf("state mismatch: %d, want 400 and no login", resp.StatusCode)
	}

	// A callback in a browser that never started the login (no state cookie): a login CSRF.
	cb = start(fx.browser())
	victim := fx.browser()
	if resp, _ := victim.get(cb.String()); resp.StatusCode != http.StatusBadRequest || loggedIn(victim) {
		t.Errorf("callback without the state cookie: %d, want 400 and no login", resp.StatusCode)
	}

	// The same callback twice: the state cookie is single-use.
	b = fx.browser()
	cb = start(b)
	if resp, _ := b.get(cb.String()); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("first callback: %d", resp.StatusCode)
	}
	if resp, _ := b.get(cb.String()); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("replayed callback: %d, want 400", resp.StatusCode)
	}

	// The user denies the App on the forge.
	fx.gh.OAuthAs("")
	b = fx.browser()
	if resp, _ := b.get(start(b).String()); resp.StatusCode != http.StatusForbidden || loggedIn(b) {
		t.Errorf("denied login: %d, want 403", resp.StatusCode)
	}

	// A forge without login.
	if resp, _ := fx.browser().get("/ci/login/gitea"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("login with an unknown forge: %d, want 404", resp.StatusCode)
	}
}

func TestLoginNextIsLocal(t *testing.T) {
	t.Parallel()
	for next, want := range map[string]string{
		"/ci/":                  "/ci/",
		"/ci/app/eval/3?tab=x":  "/ci/app/eval/3?tab=x",
		"":                      "",
		"https://evil.example/": "",
		"//evil.example/ci/":    "",
		"/\\evil.example":       "",
		"/ci/\\evil.example":    "",
		"/ci/../api/x":          "",
		"/cix":                  "",
		"javascript:alert(1)":   "",
		"/ci/\r\nSet-Cookie:x":  "",
		"/api/builds/1/rebuild": "",
		"http:/ci/":             "",
	} {
		if got := localNext(next); got != want {
			t.Errorf("localNext(%q) = %q, want %q", next, got, want)
		}
	}

	// Through the whole flow: an outside next ends on the dashboard.
	fx := newAuthFixture(t)
	fx.gh.OAuthAs("alice")
	b := fx.browser()
	for _, next := range []string{"https://evil.example/", "//evil.example/", "/\\evil.example"} {
		resp, _ := b.get("/ci/login/github?next=" + url.QueryEscape(next))
		authURL, _ := resp.Location()
		resp, _ = b.get(authURL.String())
		cb, _ := resp.Location()
		resp, _ = b.get(cb.String())
		if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || loc != "/ci/" {
			t.Errorf("next=%q: %d to %q, want /ci/", next, resp.StatusCode, loc)
		}
	}
}

func TestTamperedSessionIsLoggedOut(t *testing.T) {
	t.Parallel()
	fx := newAuthFixture(t)
	b := fx.browser().login("alice")
	u, _ := url.Parse(fx.srv.URL)
	var value string
	for _, c := range b.client.Jar.Cookies(u) {
		if c.Name == session.CookieName {
			value = c.Value
		}
	}
	payload, mac, _ := strings.Cut(value, ".")
	other, err := session.New(session.Config{Secret: []byte("another secret, rotated 32 bytes"), DB: fx.pool})
	if err != nil {
		t.Fatal(err)
	}
	rotated, _ := other.Encode(session.Session{ID: "x", Forge: "github", UserID: fx.gh.UserID("boss"), Login: "boss", Expires: time.Now().Add(time.Hour)})
	for name, v := range map[string]string{
		"tampered payload": flipFirst(payload) + "." + mac,
		"tampered mac":     payload + "." + flipFirst(mac),
		"rotated secret":   rotated,
	} {
		req, _ := http.NewRequestWithContext(fx.ctx, "GET", fx.srv.URL+"/ci/", nil)
		req.AddCookie(&http.Cookie{Name: session.CookieName, Value: v})
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), "@github") || !strings.Contains(string(body), "Log in") {
			t.Errorf("%s: the cookie was accepted", name)
		}
	}
}

// flipFirst changes a base64url string's first character.
func flipFirst(s string) string {
	if s[0] == 'A' {
		return "B" + s[1:]
	}
	return "A" + s[1:]
}
