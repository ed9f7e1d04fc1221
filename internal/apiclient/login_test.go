package apiclient_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/apiclient"
)

// The credentials file holds a token per server, private to its user: 0600 in a 0700
// directory, and refused once others may read it.
func TestCredentialsFile(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	path, err := apiclient.CredentialsPath(func(k string) string { return map[string]string{"HOME": home}[k] })
	if err != nil || path != filepath.Join(home, ".config", "harmonia-ci", "credentials.json") {
		t.Fatalf("default path %q, %v", path, err)
	}
	xdg, err := apiclient.CredentialsPath(func(k string) string { return map[string]string{"HOME": home, "XDG_CONFIG_HOME": "/x"}[k] })
	if err != nil || xdg != "/x/harmonia-ci/credentials.json" {
		t.Fatalf("XDG path %q, %v", xdg, err)
	}
	if tok, err := apiclient.StoredTokenFor(path, "https://ci.example.org"); err != nil || tok != "" {
		t.Fatalf("no file yet: %q, %v", tok, err)
	}
	for server, tok := range map[string]string{"https://ci.example.org/": "tok-a", "http://other:7777": "tok-b"} {
		if err := apiclient.StoreToken(path, server, apiclient.StoredToken{Token: tok, Name: "cli@test"}); err != nil {
			t.Fatal(err)
		}
	}
	for p, want := range map[string]os.FileMode{path: 0o600, filepath.Dir(path): 0o700} {
		st, err := os.Stat(p)
		if err != nil || st.Mode().Perm() != want {
			t.Errorf("%s: mode %v, %v; want %04o", p, st.Mode().Perm(), err, want)
		}
	}
	// One server, one key: with or without the trailing slash.
	if tok, err := apiclient.StoredTokenFor(path, "https://ci.example.org"); err != nil || tok != "tok-a" {
		t.Errorf("stored token of ci.example.org: %q, %v", tok, err)
	}
	if tok, err := apiclient.StoredTokenFor(path, "http://other:7777/"); err != nil || tok != "tok-b" {
		t.Errorf("stored token of other: %q, %v", tok, err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = apiclient.StoredTokenFor(path, "https://ci.example.org")
	if err == nil || !strings.Contains(err.Error(), "readable by others") || strings.Contains(err.Error(), "tok-a") {
		t.Fatalf("a file others may read: %v, want it refused without showing the token", err)
	}
	if err := apiclient.StoreToken(path, "https://ci.example.org", apiclient.StoredToken{Token: "tok-c"}); err == nil {
		t.Fatal("a token was added to a file others may read")
	}
}

// tokenPage stands in for the server's /ci/tokens/cli page, as the contract with the server
// has it: GET with callback, state and name; a logged-in user confirms; the browser then posts
// the form fields token and state to the callback.
type tokenPage struct {
	t    *testing.T
	srv  *httptest.Server
	seen url.Values
	// postState replaces the state the page posts back ("": the one it was given).
	postState string
	answer    chan int // the callback's status
}

func newTokenPage(t *testing.T) *tokenPage {
	p := &tokenPage{t: t, answer: make(chan int, 1)}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/ci/tokens/cli" {
			http.NotFound(w, r)
			return
		}
		p.seen = r.URL.Query()
		fmt.Fprint(w, "minted-token-123")
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// open is the browser: it loads the page and posts what the page hands over to the callback.
func (p *tokenPage) open(page string) error {
	resp, err := http.Get(page)
	if err != nil {
		return err
	}
	token, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	state := p.seen.Get("state")
	if p.postState != "" {
		state = p.postState
	}
	go func() {
		resp, err := http.PostForm(p.seen.Get("callback"), url.Values{"token": {string(token)}, "state": {state}})
		if err != nil {
			p.t.Errorf("post to the callback: %v", err)
			p.answer <- 0
			return
		}
		resp.Body.Close()
		p.answer <- resp.StatusCode
	}()
	return nil
}

func TestLogin(t *testing.T) {
	t.Parallel()
	t.Run("token handed over", func(t *testing.T) {
		t.Parallel()
		p := newTokenPage(t)
		var out strings.Builder
		token, err := apiclient.Login(t.Context(), apiclient.LoginOptions{Server: p.srv.URL, Name: "laptop", OpenFunc: p.open, Out: &out,
			Timeout: time.Minute})
		if err != nil || token != "minted-token-123" {
			t.Fatalf("Login: %q, %v", token, err)
		}
		if code := <-p.answer; code != http.StatusOK {
			t.Errorf("callback answered %d", code)
		}
		cb, err := url.Parse(p.seen.Get("callback"))
		if err != nil || cb.Scheme != "http" || cb.Hostname() != "127.0.0.1" || cb.Port() == "" || cb.Path != "/callback" {
			t.Errorf("callback %q: want http://127.0.0.1:PORT/callback", p.seen.Get("callback"))
		}
		if s := p.seen.Get("state"); len(s) != 32 || strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") != "" {
			t.Errorf("state %q: want 32 URL-safe characters", s)
		}
		if p.seen.Get("name") != "laptop" {
			t.Errorf("name %q", p.seen.Get("name"))
		}
		if strings.Contains(out.String(), token) {
			t.Errorf("the token was printed: %s", out.String())
		}
	})
	t.Run("state mismatch refused", func(t *testing.T) {
		t.Parallel()
		p := newTokenPage(t)
		p.postState = strings.Repeat("x", 32)
		token, err := apiclient.Login(t.Context(), apiclient.LoginOptions{Server: p.srv.URL, OpenFunc: p.open, Timeout: time.Minute})
		if err == nil || token != "" || !strings.Contains(err.Error(), "state does not match") {
			t.Fatalf("Login with a forged state: %q, %v", token, err)
		}
		if code := <-p.answer; code != http.StatusBadRequest {
			t.Errorf("callback answered %d, want 400", code)
		}
		if !strings.HasPrefix(p.seen.Get("name"), "cli@") {
			t.Errorf("default name %q, want cli@<hostname>", p.seen.Get("name"))
		}
	})
	t.Run("no browser: the URL is printed, the wait ends", func(t *testing.T) {
		t.Parallel()
		var out strings.Builder
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := apiclient.Login(ctx, apiclient.LoginOptions{Server: "https://ci.example.org", Out: &out,
			OpenFunc: func(string) error { return errors.New("no display") }})
		if !errors.Is(err, context.Canceled) || !strings.Contains(out.String(), "https://ci.example.org/ci/tokens/cli?callback=http%3A%2F%2F127.0.0.1%3A") {
			t.Fatalf("%v; printed %q", err, out.String())
		}
	})
}
