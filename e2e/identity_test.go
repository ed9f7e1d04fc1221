package e2e

import (
	"context"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/giteatest"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// identityFrontend is one harmonia-ci frontend with Gitea login behind a known public URL (the
// OAuth redirect needs it before the frontend starts), whose [auth] admins a test rewrites
// between restarts.
type identityFrontend struct {
	*fixture
	gitea  *giteatest.Server
	public string
	lb     *roundRobin
	files  string // the forge's and the UI's secrets, as configuration lines
}

func newIdentityFrontend(t *testing.T, g *giteatest.Server) *identityFrontend {
	t.Helper()
	lb, public := startRoundRobin(t, 0)
	appID, appSecret := giteaOAuthApp(t, g, g.AdminToken, public)
	files := fmt.Sprintf(`[frontend]
public_url = %q
[[forges]]
name = "gitea"
type = "gitea"
url = %q
token_file = %q
webhook_secret_file = %q
oauth_client_id = %q
oauth_client_secret_file = %q
[auth]
admin_token_file = %q
secret_file = %q
`, public, g.URL, proctest.WriteFile(t, "gitea-token", g.AdminToken), proctest.WriteFile(t, "gitea-hook-secret", giteaWebhookSecret),
		appID, proctest.WriteFile(t, "gitea-oauth-secret", appSecret),
		proctest.WriteFile(t, "admin-token", adminToken), proctest.WriteFile(t, "auth-secret", strings.Repeat("e2e-cookie-secret-", 3)))
	return &identityFrontend{fixture: newFixture(t, ""), gitea: g, public: public, lb: lb, files: files}
}

// restart (re)starts front-1 with admins as [auth] admins, and waits until it serves.
func (f *identityFrontend) restart(admins ...string) {
	f.t.Helper()
	if p, ok := f.procs["front-1"]; ok {
		p.Signal(f.t, syscall.SIGTERM)
		if code := p.Wait(f.t, 30*time.Second); code != 0 {
			f.t.Fatalf("front-1 exited %d after SIGTERM\n%s", code, p.Logs())
		}
	}
	quoted := make([]string, len(admins))
	for i, a := range admins {
		quoted[i] = fmt.Sprintf("%q", a)
	}
	f.cfgPath = proctest.WriteFile(f.t, giteatest.UniqueName("front")+".toml",
		proctest.FastConfig+f.files+"admins = ["+strings.Join(quoted, ", ")+"]\n")
	incarnation := ""
	if f.nodeStatus("front-1") != "" {
		incarnation = f.incarnation("front-1")
	}
	f.start("front-1", "--roles", "frontend")
	proctest.WaitFor(f.t, 30*time.Second, "front-1 active again", func() bool {
		return f.nodeStatus("front-1") == status.NodeActive && f.incarnation("front-1") != incarnation
	})
	f.lb.set(f.endpoint("front-1"))
}

var (
	hiddenInputRE = regexp.MustCompile(`<input[^>]*type="hidden"[^>]*>`)
	inputAttrRE   = regexp.MustCompile(`(name|value)="([^"]*)"`)
)

// hiddenFields returns the hidden inputs of an HTML page (the first value of each name).
func hiddenFields(page string) url.Values {
	v := url.Values{}
	for _, in := range hiddenInputRE.FindAllString(page, -1) {
		var name, value string
		for _, m := range inputAttrRE.FindAllStringSubmatch(in, -1) {
			if m[1] == "name" {
				name = html.UnescapeString(m[2])
			} else {
				value = html.UnescapeString(m[2])
			}
		}
		if name != "" && !v.Has(name) {
			v.Set(name, value)
		}
	}
	return v
}

// uiUser is a browser (a cookie jar, following no redirects) of a Gitea user.
type uiUser struct {
	f      *identityFrontend
	user   giteatest.User
	client *http.Client
}

func (u *uiUser) do(method, rawURL string, form url.Values) (*http.Response, string) {
	u.f.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, rawURL, body)
	if err != nil {
		u.f.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := u.client.Do(req)
	if err != nil {
		u.f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// login logs user in to harmonia-ci through Gitea's login form and consent page.
func (f *identityFrontend) login(user giteatest.User) *uiUser {
	f.t.Helper()
	jar, _ := cookiejar.New(nil)
	u := &uiUser{f: f, user: user, client: &http.Client{Jar: jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	_, page := u.do("GET", f.gitea.URL+"/user/login", nil)
	form := hiddenFields(page)
	form.Set("user_name", user.Login)
	form.Set("password", user.Password)
	if resp, body := u.do("POST", f.gitea.URL+"/user/login", form); resp.StatusCode/100 != 3 {
		f.t.Fatalf("log in to Gitea as %s: %d\n%.2000s", user.Login, resp.StatusCode, body)
	}
	resp, _ := u.do("GET", f.public+"/ci/login/gitea", nil)
	next := resp.Header.Get("Location")
	for range 5 {
		if strings.HasPrefix(next, f.public) {
			break
		}
		resp, page := u.do("GET", next, nil)
		if resp.StatusCode == http.StatusOK && strings.Contains(page, "/login/oauth/grant") {
			grant := hiddenFields(page)
			grant.Set("granted", "true")
			resp, _ = u.do("POST", f.gitea.URL+"/login/oauth/grant", grant)
		}
		next = resp.Header.Get("Location")
		if next != "" && strings.HasPrefix(next, "/") {
			next = f.gitea.URL + next
		}
	}
	if !strings.HasPrefix(next, f.public+"/ci/oauth/gitea/callback?") {
		f.t.Fatalf("login of %s: Gitea sent the browser to %q", user.Login, next)
	}
	if resp, body := u.do("GET", next, nil); resp.StatusCode != http.StatusSeeOther {
		f.t.Fatalf("login of %s: callback %d\n%.2000s", user.Login, resp.StatusCode, body)
	}
	return u
}

// settings is the status of the admins-only settings page: 200 for an admin.
func (u *uiUser) settings() int {
	u.f.t.Helper()
	resp, body := u.do("GET", u.f.public+"/ci/settings/projects", nil)
	if resp.StatusCode == http.StatusOK && !strings.Contains(body, "@gitea") {
		u.f.t.Fatalf("settings page of %s shows nobody logged in:\n%.2000s", u.user.Login, body)
	}
	return resp.StatusCode
}

// An admin named by login in the configuration, against a real Gitea and real harmonia-ci
// frontends: renamed, they are no longer admin until the configuration names the new login,
// and whoever takes the old login is not admin.
func TestRenamedAdminForReal(t *testing.T) {
	g := giteatest.Shared(t)
	ctx := context.Background()
	boss, err := g.CreateUser(ctx, giteatest.UniqueName("boss"))
	if err != nil {
		t.Fatal(err)
	}
	f := newIdentityFrontend(t, g)
	f.restart("gitea:" + boss.Login)
	b := f.login(boss)
	if got := b.settings(); got != http.StatusOK {
		t.Fatalf("the admin opens the settings: %d, want 200", got)
	}

	// Renamed: the configuration's login names nobody. The session (kept in the database
	// across the restart) is still the same user, no longer admin.
	renamed, err := g.RenameUser(ctx, boss, boss.Login+"-new")
	if err != nil {
		t.Fatal(err)
	}
	b.user = renamed
	f.restart("gitea:" + boss.Login)
	if got := b.settings(); got != http.StatusForbidden {
		t.Errorf("the renamed admin opens the settings: %d, want 403", got)
	}
	// Someone takes the old login: not admin either.
	squatter, err := g.CreateUser(ctx, boss.Login)
	if err != nil {
		t.Fatal(err)
	}
	if squatter.ID == boss.ID {
		t.Fatalf("Gitea gave the new account the old one's id %d", boss.ID)
	}
	s := f.login(squatter)
	if got := s.settings(); got != http.StatusForbidden {
		t.Errorf("the new holder of the admin's old login opens the settings: %d, want 403", got)
	}

	// The configuration names the new login: the renamed admin is admin again, the
	// squatter still is not.
	f.restart("gitea:" + renamed.Login)
	if got := b.settings(); got != http.StatusOK {
		t.Errorf("the renamed admin, named again: %d, want 200", got)
	}
	if got := s.settings(); got != http.StatusForbidden {
		t.Errorf("the squatter after the configuration changed: %d, want 403", got)
	}
}
