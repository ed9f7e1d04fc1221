package forge

import (
	"context"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/giteatest"
)

var hiddenInputRE = regexp.MustCompile(`<input[^>]*type="hidden"[^>]*>`)
var attrRE = regexp.MustCompile(`(name|value)="([^"]*)"`)

// hiddenFields returns the hidden inputs of an HTML page (the first value of each name).
func hiddenFields(page string) url.Values {
	v := url.Values{}
	for _, in := range hiddenInputRE.FindAllString(page, -1) {
		var name, value string
		for _, m := range attrRE.FindAllStringSubmatch(in, -1) {
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

// A real Gitea: the permission a user has on a repository, and the whole OAuth2 login of a
// user through Gitea's login form and consent page.
func TestGiteaOAuthAndPermissionForReal(t *testing.T) {
	giteatest.Need(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, err := giteatest.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	users := map[string]giteatest.User{}
	for _, login := range []string{"alice", "bob", "carol"} {
		if users[login], err = srv.CreateUser(ctx, login); err != nil {
			t.Fatal(err)
		}
	}
	app, err := srv.CreateRepo(ctx, users["alice"], "app", false)
	if err != nil {
		t.Fatal(err)
	}
	secret, err := srv.CreateRepo(ctx, users["alice"], "secret", true)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.AddCollaborator(ctx, app, "bob", "write"); err != nil {
		t.Fatal(err)
	}

	// The CI account is the site administrator, as giteatest's forge tests set it up.
	g, err := NewGitea(GiteaConfig{Name: "gitea", URL: srv.URL, Token: srv.AdminToken, WebhookSecret: []byte("s")})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		repo  giteatest.Repo
		login string
		want  Permission
	}{
		{app, "alice", PermissionAdmin}, {app, "bob", PermissionWrite}, {app, "carol", PermissionRead},
		{app, "nobody", PermissionNone}, {secret, "carol", PermissionNone}, {secret, "bob", PermissionNone},
	} {
		got, err := g.Permission(ctx, Repo{Owner: c.repo.Owner, Name: c.repo.Name}, c.login)
		if err != nil || got != c.want {
			t.Errorf("Permission(%s, %s) = %q, %v; want %q", c.repo.FullName(), c.login, got, err, c.want)
		}
		// The trust check: write access, not being a collaborator of any kind.
		trusted, err := WriteAccess(ctx, g, Repo{Owner: c.repo.Owner, Name: c.repo.Name}, c.login)
		if err != nil || trusted != c.want.CanWrite() {
			t.Errorf("WriteAccess(%s, %s) = %v, %v; want %v", c.repo.FullName(), c.login, trusted, err, c.want.CanWrite())
		}
	}
	if err := srv.AddCollaborator(ctx, app, "carol", "read"); err != nil {
		t.Fatal(err)
	}
	if trusted, err := WriteAccess(ctx, g, Repo{Owner: app.Owner, Name: app.Name}, "carol"); err != nil || trusted {
		t.Errorf("WriteAccess of a read collaborator = %v, %v; want false", trusted, err)
	}

	// A pull request's commits, oldest first, with their committer dates.
	if _, err := srv.Push(ctx, app, users["alice"], "main", map[string]string{"README": "app\n"}, "init", false); err != nil {
		t.Fatal(err)
	}
	fork, err := srv.Fork(ctx, app, users["carol"])
	if err != nil {
		t.Fatal(err)
	}
	var pushed []string
	for i := range 3 {
		// On the fork's main, which has app's history: a pull request needs a merge base.
		sha, err := srv.Push(ctx, fork, users["carol"], "main", map[string]string{"f": strconv.Itoa(i)}, "change", false)
		if err != nil {
			t.Fatal(err)
		}
		pushed = append(pushed, sha)
	}
	n, err := srv.CreatePullRequest(ctx, users["carol"], app, "main", fork, "main", "a change")
	if err != nil {
		t.Fatal(err)
	}
	commits, err := g.PullRequestCommits(ctx, Repo{Owner: app.Owner, Name: app.Name}, n)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range commits {
		got = append(got, c.SHA)
		if c.Time.IsZero() || time.Since(c.Time) > time.Hour {
			t.Errorf("commit %s dated %v, want about now", c.SHA, c.Time)
		}
	}
	if !slices.Equal(got, pushed) {
		t.Errorf("PullRequestCommits = %v, want %v (oldest first)", got, pushed)
	}

	// An OAuth2 application, and bob logging in with it.
	const redirect = "http://127.0.0.1:1/ci/oauth/gitea/callback"
	var oapp struct {
		ClientID     string `json:"client_id"`
		ClientSecret string `json:"client_secret"`
	}
	if err := srv.Do(ctx, srv.AdminToken, http.MethodPost, "/user/applications/oauth2", map[string]any{
		"name": "harmonia-ci", "redirect_uris": []string{redirect}, "confidential_client": true,
	}, &oapp); err != nil {
		t.Fatal(err)
	}
	o, err := NewOAuth(OAuthConfig{Type: TypeGitea, WebURL: srv.URL, ClientID: oapp.ClientID, ClientSecret: oapp.ClientSecret})
	if err != nil {
		t.Fatal(err)
	}
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, rawURL string, form url.Values) (*http.Response, string) {
		t.Helper()
		if strings.HasPrefix(rawURL, "/") {
			rawURL = srv.URL + rawURL
		}
		var body io.Reader
		if form != nil {
			body = strings.NewReader(form.Encode())
		}
		req, err := http.NewRequestWithContext(ctx, method, rawURL, body)
		if err != nil {
			t.Fatal(err)
		}
		if form != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		resp, err := browser.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	_, page := do("GET", "/user/login", nil)
	form := hiddenFields(page)
	form.Set("user_name", "bob")
	form.Set("password", users["bob"].Password)
	if resp, body := do("POST", "/user/login", form); resp.StatusCode/100 != 3 {
		t.Fatalf("log in to Gitea: %d\n%.2000s", resp.StatusCode, body)
	}
	resp, page := do("GET", o.AuthorizeURL("st4te", redirect), nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(page, "/login/oauth/grant") {
		t.Fatalf("authorize: %d, not the consent page:\n%.3000s", resp.StatusCode, page)
	}
	grant := hiddenFields(page)
	grant.Set("granted", "true")
	resp, body := do("POST", "/login/oauth/grant", grant)
	loc, err := resp.Location()
	if err != nil || !strings.HasPrefix(loc.String(), redirect+"?") {
		t.Fatalf("grant: %d to %v\n%.2000s", resp.StatusCode, loc, body)
	}
	if loc.Query().Get("state") != "st4te" || loc.Query().Get("code") == "" {
		t.Fatalf("grant redirected to %s: want state and code", loc)
	}
	token, err := o.Exchange(ctx, loc.Query().Get("code"), redirect)
	if err != nil {
		t.Fatalf("Exchange: %v", err)
	}
	login, err := o.User(ctx, token)
	if err != nil || login != (User{ID: users["bob"].ID, Login: "bob"}) {
		t.Fatalf("User = %+v, %v; want bob, id %d", login, err, users["bob"].ID)
	}
	if _, err := o.Exchange(ctx, loc.Query().Get("code"), redirect); err == nil {
		t.Error("Gitea exchanged a code twice")
	}
}
