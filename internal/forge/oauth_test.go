package forge

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/githubtest"
)

func oauthCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// noRedirects is a client that shows redirects instead of following them, as a test browser.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// authorize follows an authorize URL one step, as a browser would, and returns the query of
// the redirect back.
func authorize(t *testing.T, authURL string) url.Values {
	t.Helper()
	resp, err := noRedirects.Get(authURL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound {
		t.Fatalf("authorize: %d, want 302", resp.StatusCode)
	}
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(loc.String(), "http://ci.example/ci/oauth/github/callback?") {
		t.Fatalf("authorize redirected to %s", loc)
	}
	return loc.Query()
}

func TestGitHubOAuthFlow(t *testing.T) {
	t.Parallel()
	ctx := oauthCtx(t)
	srv := githubtest.New(t)
	o, err := NewOAuth(OAuthConfig{Type: TypeGitHub, WebURL: srv.URL, APIURL: srv.URL, ClientID: srv.OAuthClientID, ClientSecret: srv.OAuthClientSecret})
	if err != nil {
		t.Fatal(err)
	}
	const redirect = "http://ci.example/ci/oauth/github/callback"
	authURL := o.AuthorizeURL("st4te", redirect)
	if !strings.HasPrefix(authURL, srv.URL+"/login/oauth/authorize?") || !strings.Contains(authURL, "client_id="+url.QueryEscape(srv.OAuthClientID)) {
		t.Fatalf("AuthorizeURL = %s", authURL)
	}

	srv.OAuthAs("octocat")
	q := authorize(t, authURL)
	if q.Get("state") != "st4te" || q.Get("code") == "" {
		t.Fatalf("callback query %v: want state and code", q)
	}
	tok, err := o.Exchange(ctx, q.Get("code"), redirect)
	if err != nil {
		t.Fatalf("Exchange: %v", err)
	}
	login, err := o.User(ctx, tok)
	if err != nil || login.Login != "octocat" || login.ID <= 0 {
		t.Fatalf("User = %+v, %v; want octocat", login, err)
	}
	// A code is good once.
	if _, err := o.Exchange(ctx, q.Get("code"), redirect); err == nil || !strings.Contains(err.Error(), "bad_verification_code") {
		t.Errorf("second Exchange of a code: %v, want bad_verification_code", err)
	}
	// Another redirect_uri than the authorization's.
	q = authorize(t, authURL)
	if _, err := o.Exchange(ctx, q.Get("code"), "http://evil.example/cb"); err == nil || !strings.Contains(err.Error(), "redirect_uri_mismatch") {
		t.Errorf("Exchange with another redirect_uri: %v, want redirect_uri_mismatch", err)
	}
	// A wrong client secret.
	bad, _ := NewOAuth(OAuthConfig{Type: TypeGitHub, WebURL: srv.URL, APIURL: srv.URL, ClientID: srv.OAuthClientID, ClientSecret: "wrong"})
	q = authorize(t, authURL)
	if _, err := bad.Exchange(ctx, q.Get("code"), redirect); err == nil || !strings.Contains(err.Error(), "incorrect_client_credentials") {
		t.Errorf("Exchange with a wrong secret: %v, want incorrect_client_credentials", err)
	}
	if _, err := o.User(ctx, "ghu_forged"); err == nil {
		t.Error("User accepted a token GitHub never issued")
	}
	// The user denies the App.
	srv.OAuthAs("")
	if q = authorize(t, authURL); q.Get("error") != "access_denied" || q.Get("code") != "" {
		t.Errorf("denied authorization came back with %v", q)
	}
}

func TestGiteaOAuthWireFormat(t *testing.T) {
	t.Parallel()
	ctx := oauthCtx(t)
	var tokenForm url.Values
	mux := http.NewServeMux()
	mux.HandleFunc("POST /login/oauth/access_token", func(w http.ResponseWriter, r *http.Request) {
		r.ParseForm()
		tokenForm = r.PostForm
		w.Header().Set("Content-Type", "application/json")
		if r.PostForm.Get("code") != "good" {
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(map[string]string{"error": "invalid_grant", "error_description": "client is not authorized"})
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"access_token": "gta_x", "token_type": "bearer", "expires_in": 3600, "refresh_token": "r"})
	})
	mux.HandleFunc("GET /api/v1/user", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer gta_x" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"id": 3, "login": "alice", "full_name": "Alice"})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	o, err := NewOAuth(OAuthConfig{Type: TypeGitea, WebURL: srv.URL + "/", ClientID: "cid", ClientSecret: "csecret"})
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(o.AuthorizeURL("s", "http://ci/cb"))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	if u.Path != "/login/oauth/authorize" || q.Get("client_id") != "cid" || q.Get("redirect_uri") != "http://ci/cb" ||
		q.Get("state") != "s" || q.Get("response_type") != "code" {
		t.Errorf("AuthorizeURL = %s", u)
	}
	tok, err := o.Exchange(ctx, "good", "http://ci/cb")
	if err != nil || tok != "gta_x" {
		t.Fatalf("Exchange = %q, %v", tok, err)
	}
	for k, want := range map[string]string{"client_id": "cid", "client_secret": "csecret", "code": "good",
		"grant_type": "authorization_code", "redirect_uri": "http://ci/cb"} {
		if got := tokenForm.Get(k); got != want {
			t.Errorf("token request %s = %q, want %q", k, got, want)
		}
	}
	if _, err := o.Exchange(ctx, "bad", "http://ci/cb"); err == nil || !strings.Contains(err.Error(), "invalid_grant") {
		t.Errorf("Exchange of a bad code: %v, want invalid_grant", err)
	}
	if login, err := o.User(ctx, tok); err != nil || login != (User{ID: 3, Login: "alice"}) {
		t.Errorf("User = %+v, %v", login, err)
	}
}

func TestOAuthFromConfig(t *testing.T) {
	t.Parallel()
	got, err := OAuthFromConfig([]config.ForgeConfig{
		{Name: "gitea", Type: "gitea", URL: "https://gitea.example", OAuthClientID: "id", OAuthClientSecret: "s"},
		{Name: "plain", Type: "gitea", URL: "https://other.example"},
		{Name: "github", Type: "github", OAuthClientID: "Iv1.x", OAuthClientSecret: "s"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["gitea"] == nil || got["github"] == nil {
		t.Fatalf("OAuthFromConfig = %v, want gitea and github", got)
	}
	if u := got["github"].AuthorizeURL("s", "https://ci/cb"); !strings.HasPrefix(u, "https://github.com/login/oauth/authorize?") {
		t.Errorf("github.com AuthorizeURL = %s", u)
	}
	if _, err := OAuthFromConfig([]config.ForgeConfig{{Name: "g", Type: "gitea", URL: "x", OAuthClientID: "id"}}); err == nil {
		t.Error("an OAuth forge without a client secret was accepted")
	}
}

func TestGitHubPermission(t *testing.T) {
	t.Parallel()
	ctx := oauthCtx(t)
	b := setupGitHub(t)
	b.srv.AddInstallation(7, githubtest.Repo{FullName: "octo/secret", Private: true})
	b.srv.AddCollaborator("octo/one", "writer")
	b.srv.SetPermission("octo/one", "maint", "maintain")
	b.srv.SetPermission("octo/one", "triager", "triage")
	one, secret := Repo{Owner: "octo", Name: "one", InstallationID: 7}, Repo{Owner: "octo", Name: "secret", InstallationID: 7}
	for _, c := range []struct {
		repo  Repo
		login string
		want  Permission
	}{
		{one, "octo", PermissionAdmin}, {one, "writer", PermissionWrite}, {one, "maint", PermissionWrite},
		{one, "triager", PermissionRead}, {one, "stranger", PermissionRead}, {secret, "stranger", PermissionNone},
	} {
		got, err := b.gh.Permission(ctx, c.repo, c.login)
		if err != nil || got != c.want {
			t.Errorf("Permission(%s, %s) = %q, %v; want %q", c.repo.FullName(), c.login, got, err, c.want)
		}
	}
	if _, err := b.gh.Permission(ctx, one, "../x"); err == nil {
		t.Error("Permission accepted a login that is not one")
	}
}

func TestGiteaPermission(t *testing.T) {
	t.Parallel()
	ctx := oauthCtx(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "token tok" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		perm := map[string]string{
			"/api/v1/repos/o/r/collaborators/owner/permission":  "owner",
			"/api/v1/repos/o/r/collaborators/writer/permission": "write",
			"/api/v1/repos/o/r/collaborators/reader/permission": "read",
		}[r.URL.Path]
		if perm == "" {
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"message":"user does not exist"}`))
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"permission": perm, "role_name": perm})
	}))
	t.Cleanup(srv.Close)
	g, err := NewGitea(GiteaConfig{Name: "gitea", URL: srv.URL, Token: "tok", WebhookSecret: []byte("s")})
	if err != nil {
		t.Fatal(err)
	}
	for login, want := range map[string]Permission{"owner": PermissionAdmin, "writer": PermissionWrite, "reader": PermissionRead, "ghost": PermissionNone} {
		got, err := g.Permission(ctx, Repo{Owner: "o", Name: "r"}, login)
		if err != nil || got != want {
			t.Errorf("Permission(%s) = %q, %v; want %q", login, got, err, want)
		}
	}
}

func TestPermissionWords(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		p           Permission
		read, write bool
	}{{PermissionNone, false, false}, {PermissionRead, true, false}, {PermissionWrite, true, true}, {PermissionAdmin, true, true}} {
		if c.p.CanRead() != c.read || c.p.CanWrite() != c.write {
			t.Errorf("%s: CanRead %v CanWrite %v", c.p, c.p.CanRead(), c.p.CanWrite())
		}
	}
}
