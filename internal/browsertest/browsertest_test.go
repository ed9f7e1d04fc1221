package browsertest

import (
	"bytes"
	"fmt"
	"html"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

const indexHTML = `<!doctype html>
<html><head><meta charset="utf-8"><title>browsertest</title>
<style>body { font-family: sans-serif; } .big { height: 1500px; background: linear-gradient(#fff, #acf); }</style>
</head><body>
<h1 id="greeting">Hello, browser</h1>
<form id="form" method="post" action="/submit">
  <input id="name" name="name" required>
  <button id="send" type="submit">Send</button>
</form>
<form id="jsform" method="post" action="/submit">
  <input name="name" value="script">
</form>
<p id="jsresult">not handled</p>
<button id="change" type="button">Change</button>
<p id="target">before</p>
<p id="live">waiting</p>
<a id="link" href="/submit" data-kind="nav">link</a>
<div class="big"></div>
<script>
document.getElementById('change').addEventListener('click', () => {
  document.getElementById('target').textContent = 'after';
});
document.getElementById('jsform').addEventListener('submit', (e) => {
  e.preventDefault();
  document.getElementById('jsresult').textContent = 'handled by script';
});
const es = new EventSource('/events');
es.onmessage = (e) => {
  document.getElementById('live').textContent = e.data;
  es.close();
};
</script>
</body></html>`

const brokenHTML = `<!doctype html>
<html><head><meta charset="utf-8"><title>broken</title></head><body>
<p id="p">broken page</p>
<img src="/missing.png" alt="">
<script>console.error('bad thing', 42);</script>
<script>throw new Error('boom');</script>
</body></html>`

const cspHTML = `<!doctype html>
<html><head><meta charset="utf-8"><title>csp</title></head><body>
<p id="p">csp page</p>
<script>document.getElementById('p').textContent = 'inline script ran';</script>
</body></html>`

// profiles are the profile directories of the browsers the tests started, for TestMain to check
// that no process of theirs is left.
var (
	profilesMu sync.Mutex
	profiles   []string
)

func TestMain(m *testing.M) {
	code := m.Run()
	// Every browser's cleanup has run: none of their processes may be left.
	profilesMu.Lock()
	defer profilesMu.Unlock()
	for pid, cmd := range chromiumProcesses() {
		for _, p := range profiles {
			if strings.Contains(cmd, "--user-data-dir="+p) {
				fmt.Fprintf(os.Stderr, "browsertest: chromium process %d outlived the tests: %s\n", pid, cmd)
				code = 1
			}
		}
	}
	if len(profiles) > 0 && code == 0 {
		fmt.Fprintf(os.Stderr, "browsertest: no process left of the %d browsers started\n", len(profiles))
	}
	os.Exit(code)
}

// start is New, recording the browser's profile directory for TestMain.
func start(t *testing.T, opts ...Option) *Browser {
	t.Helper()
	b := New(t, opts...)
	p := profileOf(t, b)
	profilesMu.Lock()
	profiles = append(profiles, p)
	profilesMu.Unlock()
	return b
}

// profileOf returns the --user-data-dir of b's main process.
func profileOf(t *testing.T, b *Browser) string {
	t.Helper()
	pid := chromedp.FromContext(b.Ctx).Browser.Process().Pid
	cmd := chromiumProcesses()[pid]
	for _, arg := range strings.Fields(cmd) {
		if p, ok := strings.CutPrefix(arg, "--user-data-dir="); ok {
			return p
		}
	}
	t.Fatalf("no --user-data-dir in the command line of chromium (pid %d): %q", pid, cmd)
	return ""
}

// testServer serves the pages above. Its /events endpoint sends the strings written to send, as
// server-sent events, after signalling on connected.
type testServer struct {
	*httptest.Server
	connected chan struct{}
	send      chan string
}

func newServer(t *testing.T) *testServer {
	t.Helper()
	s := &testServer{connected: make(chan struct{}, 1), send: make(chan string)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "session", Value: "s3cr3t", Path: "/", HttpOnly: true, SameSite: http.SameSiteLaxMode})
		http.SetCookie(w, &http.Cookie{Name: "theme", Value: "dark", Path: "/", SameSite: http.SameSiteStrictMode})
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, indexHTML)
	})
	mux.HandleFunc("GET /events", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		fmt.Fprint(w, ": connected\n\n")
		w.(http.Flusher).Flush()
		select {
		case s.connected <- struct{}{}:
		default:
		}
		for {
			select {
			case <-r.Context().Done():
				return
			case msg := <-s.send:
				fmt.Fprintf(w, "data: %s\n\n", msg)
				w.(http.Flusher).Flush()
			}
		}
	})
	mux.HandleFunc("POST /submit", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><html><head><meta charset="utf-8"><title>thanks</title></head><body><p id="thanks">Thanks, %s</p></body></html>`,
			html.EscapeString(r.FormValue("name")))
	})
	mux.HandleFunc("GET /broken", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, brokenHTML)
	})
	mux.HandleFunc("GET /csp", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'self'")
		fmt.Fprint(w, cspHTML)
	})
	s.Server = httptest.NewServer(mux)
	t.Cleanup(s.Close) // before New, so it runs after the browser has closed
	return s
}

// pushEvent waits for the page's EventSource to connect, then sends msg on it.
func (s *testServer) pushEvent(t *testing.T, msg string) {
	t.Helper()
	select {
	case <-s.connected:
	case <-time.After(10 * time.Second):
		t.Fatal("the page did not connect to /events within 10s")
	}
	select {
	case s.send <- msg:
	case <-time.After(10 * time.Second):
		t.Fatal("/events did not take the event within 10s")
	}
}

func TestTextClickAndLiveUpdate(t *testing.T) {
	srv := newServer(t)
	b := start(t)
	b.Navigate(srv.URL + "/")

	if got := b.Text("#greeting"); got != "Hello, browser" {
		t.Errorf("Text(#greeting) = %q", got)
	}
	if got := b.Location(); got != srv.URL+"/" {
		t.Errorf("Location() = %q, want %q", got, srv.URL+"/")
	}
	if got := b.Count("form"); got != 2 {
		t.Errorf("Count(form) = %d, want 2", got)
	}
	if got := b.Count(".nothing"); got != 0 {
		t.Errorf("Count(.nothing) = %d, want 0", got)
	}
	if v, ok := b.Attr("#link", "data-kind"); !ok || v != "nav" {
		t.Errorf("Attr(#link, data-kind) = %q, %v", v, ok)
	}
	if v, ok := b.Attr("#link", "title"); ok {
		t.Errorf("Attr(#link, title) = %q, true; want no attribute", v)
	}

	if got := b.Text("#target"); got != "before" {
		t.Fatalf("Text(#target) = %q before the click", got)
	}
	b.Click("#change")
	b.WaitText("#target", "after", 5*time.Second)

	// The live element changes only when the server sends, after the page connected.
	if got := b.Text("#live"); got != "waiting" {
		t.Fatalf("Text(#live) = %q before the event", got)
	}
	srv.pushEvent(t, "live update 1")
	b.WaitText("#live", "live update 1", 5*time.Second)

	if errs := b.ConsoleErrors(); len(errs) > 0 {
		t.Errorf("console errors on a good page: %q", errs)
	}
}

func TestSubmit(t *testing.T) {
	srv := newServer(t)
	b := start(t)
	b.Navigate(srv.URL + "/")

	// A form a script handles: Submit returns without waiting for a page.
	b.Submit("#jsform")
	if got := b.Text("#jsresult"); got != "handled by script" {
		t.Errorf("after submitting #jsform, #jsresult = %q", got)
	}

	// A plain form: Submit waits for the page it posts to.
	b.SetValue("#name", "Ada <Lovelace>")
	b.Submit("#name") // the form of the input
	if got := b.Text("#thanks"); got != "Thanks, Ada <Lovelace>" {
		t.Errorf("after the submission, #thanks = %q", got)
	}
	if got := b.Location(); got != srv.URL+"/submit" {
		t.Errorf("after the submission, Location() = %q", got)
	}
}

func TestWithoutJavaScript(t *testing.T) {
	srv := newServer(t)
	b := start(t, WithoutJavaScript())
	b.Navigate(srv.URL + "/")

	if got := b.Text("#greeting"); got != "Hello, browser" {
		t.Errorf("Text(#greeting) = %q", got)
	}
	b.Click("#change")
	// No script runs, so nothing can change the text later: reading it after the click's
	// round trip is enough.
	if got := b.Text("#target"); got != "before" {
		t.Errorf("with JavaScript off, the click changed #target to %q", got)
	}
	if got := b.Count("form"); got != 2 {
		t.Errorf("Count(form) = %d, want 2", got)
	}
	select {
	case <-srv.connected:
		t.Error("with JavaScript off, the page opened its EventSource")
	default:
	}

	// The form the script would handle posts instead.
	b.Submit("#jsform")
	if got := b.Text("#thanks"); got != "Thanks, script" {
		t.Errorf("with JavaScript off, submitting #jsform gave #thanks = %q", got)
	}
	if errs := b.ConsoleErrors(); len(errs) > 0 {
		t.Errorf("console errors: %q", errs)
	}
}

func TestScreenshot(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(ArtifactsEnv, dir)
	srv := newServer(t)
	b := start(t)
	b.Navigate(srv.URL + "/")
	path := b.Screenshot("index page")

	if want := filepath.Join(dir, "TestScreenshot-index_page.png"); path != want {
		t.Errorf("Screenshot wrote %s, want %s", path, want)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("the screenshot is not a PNG: %v", err)
	}
	// Full page: the 1500px-high div takes it beyond the 800px window.
	if size := img.Bounds().Size(); size.X < 1000 || size.Y < 1500 {
		t.Errorf("the screenshot is %v, want at least 1000×1500 (the whole page)", size)
	}
}

func TestArtifactsDirDefault(t *testing.T) {
	t.Setenv(ArtifactsEnv, "")
	dir, err := ArtifactsDir()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(filepath.Dir(dir))
	if filepath.Base(filepath.Dir(dir)) != ".artifacts" || filepath.Base(dir) != "screenshots" {
		t.Errorf("ArtifactsDir() = %s, want <repo>/.artifacts/screenshots", dir)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Errorf("ArtifactsDir() = %s, not in the repository root: %v", dir, err)
	}
}

func TestCookies(t *testing.T) {
	srv := newServer(t)
	b := start(t)
	b.Navigate(srv.URL + "/")
	cookies := b.Cookies()
	find := func(name string) *network.Cookie {
		for _, c := range cookies {
			if c.Name == name {
				return c
			}
		}
		t.Fatalf("no cookie %s in %v", name, cookies)
		return nil
	}
	if c := find("session"); c.Value != "s3cr3t" || !c.HTTPOnly || c.SameSite != network.CookieSameSiteLax || c.Path != "/" {
		t.Errorf("session cookie: value %q, HttpOnly %v, SameSite %q, Path %q; want s3cr3t, true, Lax, /",
			c.Value, c.HTTPOnly, c.SameSite, c.Path)
	}
	if c := find("theme"); c.HTTPOnly || c.SameSite != network.CookieSameSiteStrict {
		t.Errorf("theme cookie: HttpOnly %v, SameSite %q; want false, Strict", c.HTTPOnly, c.SameSite)
	}
	// The page's scripts see only the cookie without HttpOnly.
	got, err := chromedp.Run(b.Ctx, chromedp.Evaluate[string](`document.cookie`))
	if err != nil {
		t.Fatal(err)
	}
	if got != "theme=dark" {
		t.Errorf("document.cookie = %q, want theme=dark", got)
	}
}

func TestConsoleErrors(t *testing.T) {
	srv := newServer(t)
	b := start(t)
	b.Navigate(srv.URL + "/")
	if errs := b.ConsoleErrors(); len(errs) > 0 {
		t.Fatalf("console errors on a good page: %q", errs)
	}

	b.Navigate(srv.URL + "/broken")
	// The image's 404 can be reported after the load event: wait for it, with a deadline.
	deadline := time.Now().Add(5 * time.Second)
	var errs []string
	for {
		errs = b.ConsoleErrors()
		if slices.ContainsFunc(errs, func(s string) bool { return strings.Contains(s, "missing.png") }) || time.Now().After(deadline) {
			break
		}
		b.WaitText("#p", "broken", time.Second) // a round trip to the page, instead of a sleep
	}
	for _, want := range []string{"Error: boom", "bad thing 42", "404", "missing.png"} {
		if !slices.ContainsFunc(errs, func(s string) bool { return strings.Contains(s, want) }) {
			t.Errorf("console errors %q do not mention %q", errs, want)
		}
	}
	t.Logf("console errors of /broken: %q", errs)

	// A Content Security Policy violation shows up too.
	before := len(b.ConsoleErrors())
	b.Navigate(srv.URL + "/csp")
	if got := b.Text("#p"); got != "csp page" {
		t.Errorf("the policy did not block the inline script: #p = %q", got)
	}
	errs = b.ConsoleErrors()[before:]
	if !slices.ContainsFunc(errs, func(s string) bool { return strings.Contains(s, "Content Security Policy") }) {
		t.Errorf("console errors %q do not report the CSP violation", errs)
	}
	t.Logf("console errors of /csp: %q", errs)
}

// chromiumProcesses returns the command lines of the running Chromium processes, by pid.
func chromiumProcesses() map[int]string {
	entries, _ := os.ReadDir("/proc")
	procs := map[int]string{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(cmdline) == 0 {
			continue // gone, or a zombie
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if base := filepath.Base(args[0]); strings.HasPrefix(base, "chromium") || strings.HasPrefix(base, "chrome") {
			procs[pid] = strings.Join(args, " ")
		}
	}
	return procs
}

func TestNoProcessesLeft(t *testing.T) {
	Need(t)
	if _, err := os.Stat("/proc/self/cmdline"); err != nil {
		t.Skipf("no /proc: %v", err)
	}
	before := chromiumProcesses()
	var profile string
	var ours []int
	t.Run("browse", func(t *testing.T) {
		srv := newServer(t)
		b := start(t)
		b.Navigate(srv.URL + "/") // starts a renderer too
		profile = profileOf(t, b)
		during := chromiumProcesses()
		for p, cmd := range during {
			if strings.Contains(cmd, "--user-data-dir="+profile) {
				ours = append(ours, p)
			}
		}
		t.Logf("chromium processes: %d before, %d during (%d of this browser)", len(before), len(during), len(ours))
		if len(ours) < 2 {
			t.Errorf("expected the browser and at least one child, found pids %v", ours)
		}
	})
	// The subtest's cleanup closed the browser: none of its processes, nor its profile, remain.
	// (Processes of other test binaries' browsers may come and go meanwhile: only ours count.)
	after := chromiumProcesses()
	t.Logf("chromium processes: %d before, %d after", len(before), len(after))
	for p, cmd := range after {
		if slices.Contains(ours, p) || strings.Contains(cmd, "--user-data-dir="+profile) {
			t.Errorf("chromium process %d outlived its test: %s", p, cmd)
		}
	}
	if _, err := os.Stat(profile); !os.IsNotExist(err) {
		t.Errorf("the profile directory %s remains (stat: %v)", profile, err)
	}
}
