package cli

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Each way a remote command can fail has its exit code, and the message names what was wrong
// without the token.
func TestRemoteExitCodes(t *testing.T) {
	t.Parallel()
	const token = "secret-token-42"
	answer := func(code int, body string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(code)
			fmt.Fprint(w, body)
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	for _, tc := range []struct {
		name   string
		args   []string
		server string
		code   int
		words  string
	}{
		{"success", []string{"job", "show", "3"}, answer(200, `{"id": 3, "status": "succeeded"}`), exitOK, "succeeded"},
		{"401", []string{"job", "show", "3"}, answer(401, `{"error": "invalid token"}`), exitUnauthenticated, "refused the token"},
		{"403", []string{"job", "rebuild", "3"}, answer(403, `{"error": "you may not act on this build"}`), exitForbidden, "nothing was changed"},
		{"404", []string{"eval", "show", "3"}, answer(404, `{"error": "evaluation 3 not found"}`), exitNotFound, "evaluation 3 not found"},
		{"429", []string{"failures", "3"}, answer(429, `{"error": "slow down"}`), exitRateLimited, "rate limited"},
		{"500", []string{"eval", "list", "web"}, answer(500, `{"error": "internal error"}`), exitUnavailable, "500"},
		{"409", []string{"job", "cancel", "3"}, answer(409, `{"error": "build 3 has already finished"}`), exitFailed, "already finished"},
		{"unreachable", []string{"watch", "3"}, down.URL, exitUnavailable, "unreachable"},
		{"bad id", []string{"log", "x"}, down.URL, exitUsage, "job id"},
		{"bad server", []string{"job", "show", "3"}, "ftp://x", exitUsage, "http"},
		{"no server mode", []string{"status"}, down.URL, exitUsage, "no --server mode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, err := runCLI(t, append(tc.args, "--server", tc.server, "--token", token)...)
			if err != nil {
				out += err.Error()
			}
			if got := exitCode(err); got != tc.code || !strings.Contains(out, tc.words) {
				t.Errorf("exit %d, want %d; output %q, want it to say %q", got, tc.code, out, tc.words)
			}
			if strings.Contains(out, token) {
				t.Errorf("the token is in the output: %s", out)
			}
		})
	}
	if _, err := runCLI(t, "watch", "3"); exitCode(err) != exitUsage || !strings.Contains(err.Error(), "--server") {
		t.Errorf("watch without a server: %v, want a usage error asking for --server", err)
	}
}

// The token comes from --token, --token-file, HARMONIA_CI_TOKEN or the credentials file that
// login wrote, in that order; login stores it 0600.
func TestRemoteTokenSources(t *testing.T) {
	var mu sync.Mutex
	var got string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = r.Header.Get("Authorization")
		mu.Unlock()
		fmt.Fprint(w, `{"id": 1, "status": "pending"}`)
	}))
	t.Cleanup(srv.Close)
	config := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", config)
	t.Setenv(envToken, "")
	t.Setenv(envServer, "")
	auth := func(args ...string) string {
		t.Helper()
		if out, err := runCLI(t, append([]string{"job", "show", "1"}, args...)...); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
		mu.Lock()
		defer mu.Unlock()
		return got
	}
	if a := auth("--server", srv.URL); a != "" {
		t.Errorf("no token anywhere: sent %q, want an anonymous request", a)
	}

	// login: the browser is a stand-in that posts the token back with the page's state.
	browserOpener = func(page string) error {
		u, err := url.Parse(page)
		if err != nil {
			return err
		}
		q := u.Query()
		if u.Path != "/ci/tokens/cli" || q.Get("name") != "ci-laptop" {
			return fmt.Errorf("login opened %s", page)
		}
		go func() {
			resp, err := http.PostForm(q.Get("callback"), url.Values{"token": {"stored-token"}, "state": {q.Get("state")}})
			if err == nil {
				resp.Body.Close()
			}
		}()
		return nil
	}
	t.Cleanup(func() { browserOpener = openBrowser })
	out, err := runCLI(t, "login", "--server", srv.URL+"/", "--name", "ci-laptop")
	if err != nil || strings.Contains(out, "stored-token") {
		t.Fatalf("login: %v\n%s", err, out)
	}
	creds := filepath.Join(config, "harmonia-ci", "credentials.json")
	if st, err := os.Stat(creds); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("credentials file: %v, %v; want mode 0600", st, err)
	}

	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("file-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if a := auth("--server", srv.URL); a != "Bearer stored-token" {
		t.Errorf("stored: sent %q", a)
	}
	t.Setenv(envToken, "env-token")
	t.Setenv(envServer, srv.URL)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "Bearer env-token"},
		{[]string{"--token-file", tokenFile}, "Bearer file-token"},
		{[]string{"--token", "flag-token"}, "Bearer flag-token"},
	} {
		if a := auth(tc.args...); a != tc.want {
			t.Errorf("%v: sent %q, want %q", tc.args, a, tc.want)
		}
	}

	t.Setenv(envToken, "")
	if err := os.Chmod(creds, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := runCLI(t, "job", "show", "1"); err == nil || !strings.Contains(err.Error(), "readable by others") {
		t.Errorf("a credentials file others may read: %v, want it refused", err)
	}
}

// README's exit code table is the program's.
func TestExitCodesInReadme(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n#### Remote CLI\n")
	if !ok {
		t.Fatal("README has no #### Remote CLI section")
	}
	section, _, _ = strings.Cut(section, "\n#")
	var doc []string
	for _, m := range regexp.MustCompile("(?m)^\\| `(\\d+)` \\| (.+) \\|$").FindAllStringSubmatch(section, -1) {
		doc = append(doc, m[1]+" "+m[2])
	}
	var code []string
	for _, c := range exitCodes {
		code = append(code, strconv.Itoa(c.code)+" "+c.meaning)
	}
	if strings.Join(doc, "\n") != strings.Join(code, "\n") {
		t.Errorf("README's exit codes:\n%s\nwant, as exitCodes has them:\n%s", strings.Join(doc, "\n"), strings.Join(code, "\n"))
	}
}
