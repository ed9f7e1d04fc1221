// Package browsertest gives tests a real browser: a fresh headless Chromium per test, driven
// through the DevTools protocol with chromedp, and helpers that fail the test on error and wait
// with deadlines (never sleep) for what they read.
//
//	func TestPage(t *testing.T) {
//		srv := httptest.NewServer(handler)
//		t.Cleanup(srv.Close) // registered first, so it runs after the browser has closed
//		b := browsertest.New(t)
//		b.Navigate(srv.URL + "/ci/")
//		b.WaitText("#status", "succeeded", 30*time.Second)
//		b.Screenshot("dashboard")
//		if errs := b.ConsoleErrors(); len(errs) > 0 {
//			t.Errorf("console errors: %q", errs)
//		}
//	}
//
// The browser is Debian's chromium package, looked up as chromium or chromium-browser on PATH,
// then /usr/bin/chromium; `scripts/deps.sh test` installs it. Each Browser has its own temporary
// profile, so no cookies or storage leak between tests, and is killed with every process it
// started when its test ends. Screenshots go to $HARMONIA_ARTIFACTS, or to .artifacts/screenshots
// at the root of the repository, which git ignores.
package browsertest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/dom"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// DefaultTimeout bounds the life of a Browser: its context, Ctx, ends this long after New.
const DefaultTimeout = 60 * time.Second

// ActionTimeout bounds how long one helper (Text, Click, Navigate, ...) waits, for an element
// to appear or a page to load.
const ActionTimeout = 10 * time.Second

// closeTimeout bounds the graceful close at cleanup; after it the browser is killed.
const closeTimeout = 5 * time.Second

// pollInterval is how often WaitText reads the element again.
const pollInterval = 50 * time.Millisecond

// ArtifactsEnv names the environment variable that overrides the directory Screenshot writes to.
const ArtifactsEnv = "HARMONIA_ARTIFACTS"

// flags are the command-line flags Chromium is started with, on top of chromedp's defaults
// (which include --disable-dev-shm-usage and --headless).
var flags = []string{
	"headless", "no-sandbox", "disable-gpu", "no-first-run", "disable-background-networking",
	"disable-component-update", "disable-sync", "disable-dev-shm-usage",
}

// Binary returns the path of the Chromium binary, or an error naming how to install it.
func Binary() (string, error) {
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	const fallback = "/usr/bin/chromium"
	if fi, err := os.Stat(fallback); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return fallback, nil
	}
	return "", errors.New("no chromium or chromium-browser on PATH and no " + fallback + "; install it with `scripts/deps.sh test`")
}

// Need skips t when there is no Chromium, or fails it when the CI environment variable is
// "true": CI must run the browser tests.
func Need(t testing.TB) {
	t.Helper()
	if _, err := Binary(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("browsertest: %v", err)
		}
		t.Skipf("browsertest: %v", err)
	}
}

// Option changes how New starts a browser.
type Option func(*options)

type options struct {
	noJS    bool
	timeout time.Duration
	width   int
	height  int
}

// WithoutJavaScript turns the page's JavaScript off (emulation.SetScriptExecutionDisabled), to
// check that pages work without it. The helpers still work: they run through DevTools.
func WithoutJavaScript() Option { return func(o *options) { o.noJS = true } }

// WithTimeout sets how long the browser may live, instead of DefaultTimeout.
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// WithWindowSize sets the size of the window, in CSS pixels (default 1280×800); full-page
// screenshots extend below it.
func WithWindowSize(width, height int) Option {
	return func(o *options) { o.width, o.height = width, height }
}

// Browser is one headless Chromium with one tab, for one test.
type Browser struct {
	// Ctx is the chromedp context of the tab, for chromedp actions the helpers do not cover,
	// such as chromedp.Run(b.Ctx, chromedp.Title()). It ends DefaultTimeout (or WithTimeout) after New, and at the test's cleanup.
	Ctx context.Context

	t      testing.TB
	output *limitedBuffer // Chromium's stdout and stderr, and chromedp's errors

	mu       sync.Mutex // guards the fields below, written from chromedp's event loop
	errs     []string
	requests map[network.RequestID]string // URL of each request in flight
}

// New starts a fresh headless Chromium for t, with its own temporary profile, and opens a
// blank tab; the browser and every process it started are killed at t's cleanup. It calls Need
// first.
func New(t testing.TB, opts ...Option) *Browser {
	t.Helper()
	Need(t)
	o := options{timeout: DefaultTimeout, width: 1280, height: 800}
	for _, f := range opts {
		f(&o)
	}
	bin, err := Binary()
	if err != nil {
		t.Fatalf("browsertest: %v", err)
	}
	b := &Browser{t: t, output: &limitedBuffer{max: 64 << 10}, requests: map[network.RequestID]string{}}

	ctx, cancelTimeout := context.WithTimeout(context.Background(), o.timeout)
	allocOpts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin),
		chromedp.WindowSize(o.width, o.height),
		chromedp.CombinedOutput(b.output),
	)
	for _, f := range flags {
		allocOpts = append(allocOpts, chromedp.Flag(f, true))
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, allocOpts...)
	logf := func(format string, args ...any) { fmt.Fprintf(b.output, "chromedp: "+format+"\n", args...) }
	tabCtx, cancelTab := chromedp.NewContext(allocCtx, chromedp.WithErrorf(logf), chromedp.WithLogf(logf))
	b.Ctx = tabCtx
	t.Cleanup(func() {
		// Close gracefully, so Chromium can flush and exit; then kill it, its children and its
		// profile (chromedp finds the children by the profile directory on their command line).
		cctx, cancel := context.WithTimeout(tabCtx, closeTimeout)
		err := chromedp.Cancel(cctx)
		cancel()
		cancelTab()
		cancelAlloc() // waits for the processes to be reaped and the profile to be removed
		cancelTimeout()
		if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			t.Logf("browsertest: close chromium: %v", err)
		}
		if t.Failed() {
			t.Logf("browsertest: chromium output (without D-Bus complaints):\n%s", withoutDBus(b.output.String()))
		}
	})

	start := time.Now()
	if err := chromedp.Do(tabCtx); err != nil { // starts the browser and opens the tab
		t.Fatalf("browsertest: start %s: %v\n%s", bin, err, b.output.String())
	}
	if err := chromedp.Listen(tabCtx, b.onEvent); err != nil {
		t.Fatalf("browsertest: listen to the tab: %v", err)
	}
	if o.noJS {
		if _, err := chromedp.Call(tabCtx, emulation.SetScriptExecutionDisabled,
			emulation.SetScriptExecutionDisabledParams{Value: true}); err != nil {
			t.Fatalf("browsertest: disable JavaScript: %v", err)
		}
	}
	t.Logf("browsertest: started %s in %v", bin, time.Since(start).Round(time.Millisecond))
	return b
}

// onEvent records the console errors, uncaught exceptions, error log entries and failed
// requests of the tab. It runs on chromedp's event loop, so it only appends under the lock.
func (b *Browser) onEvent(ev any) {
	var msg string
	b.mu.Lock()
	defer b.mu.Unlock()
	switch ev := ev.(type) {
	case *runtime.EventExceptionThrown:
		msg = "exception: " + exceptionText(ev.ExceptionDetails)
	case *runtime.EventConsoleAPICalled:
		if ev.Type != runtime.ConsoleAPICalledTypeError && ev.Type != runtime.ConsoleAPICalledTypeAssert {
			return
		}
		args := make([]string, 0, len(ev.Args))
		for _, a := range ev.Args {
			args = append(args, remoteObjectText(a))
		}
		msg = "console." + string(ev.Type) + ": " + strings.Join(args, " ")
		if ev.StackTrace != nil && len(ev.StackTrace.CallFrames) > 0 {
			f := ev.StackTrace.CallFrames[0]
			msg += fmt.Sprintf(" (%s:%d)", f.URL, f.LineNumber+1)
		}
	case *log.EventEntryAdded:
		e := ev.Entry
		if e == nil || e.Level != log.EntryLevelError || isDefaultFavicon(e) {
			return
		}
		msg = "log " + string(e.Source) + ": " + e.Text
		if e.URL != "" {
			msg += " (" + e.URL + ")"
		}
	case *network.EventRequestWillBeSent:
		if ev.Request != nil {
			b.requests[ev.RequestID] = ev.Request.URL
		}
		return
	case *network.EventLoadingFinished:
		delete(b.requests, ev.RequestID)
		return
	case *network.EventLoadingFailed:
		reqURL := b.requests[ev.RequestID]
		delete(b.requests, ev.RequestID)
		if ev.Canceled { // a navigation away, or a closed EventSource: not the page's fault
			return
		}
		msg = "request failed: " + reqURL + ": " + ev.ErrorText
		if ev.BlockedReason != "" {
			msg += " (blocked: " + string(ev.BlockedReason) + ")"
		}
		if ev.CorsErrorStatus != nil {
			msg += " (CORS: " + string(ev.CorsErrorStatus.CorsError) + ")"
		}
	default:
		return
	}
	b.errs = append(b.errs, msg)
}

// isDefaultFavicon reports whether e is the failure of the browser's own request for
// /favicon.ico, which it makes (or not, depending on timing) for a page that declares no icon.
func isDefaultFavicon(e *log.Entry) bool {
	if e.Source != log.EntrySourceNetwork {
		return false
	}
	u, err := url.Parse(e.URL)
	return err == nil && u.Path == "/favicon.ico"
}

// exceptionText formats an uncaught exception: its error's description (message and stack,
// first line only) and where it was thrown.
func exceptionText(d *runtime.ExceptionDetails) string {
	if d == nil {
		return "unknown exception"
	}
	text := d.Text
	if d.Exception != nil && d.Exception.Description != "" {
		desc, _, _ := strings.Cut(d.Exception.Description, "\n")
		text += " " + desc
	}
	if d.URL != "" {
		text += fmt.Sprintf(" (%s:%d)", d.URL, d.LineNumber+1)
	}
	return text
}

// remoteObjectText is a console argument as the console shows it.
func remoteObjectText(o *runtime.RemoteObject) string {
	if o == nil {
		return ""
	}
	if o.Type == runtime.RemoteObjectTypeString && len(o.Value) > 0 {
		var s string
		if err := json.Unmarshal(o.Value, &s); err == nil {
			return s
		}
	}
	if o.Description != "" {
		return o.Description
	}
	if len(o.Value) > 0 {
		return string(o.Value)
	}
	if o.UnserializableValue != "" {
		return string(o.UnserializableValue)
	}
	return string(o.Type)
}

// ConsoleErrors returns what went wrong in the tab so far, one line each: uncaught exceptions,
// console.error and failed console.assert calls, error entries of the browser log (Content
// Security Policy violations, responses with an error status) and requests that failed (not
// those canceled by a navigation). A test asserts it is empty to catch JavaScript errors. The
// failure of the browser's own request for /favicon.ico is left out: whether it is made depends
// on timing.
func (b *Browser) ConsoleErrors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.errs...)
}

// actionCtx bounds one helper by ActionTimeout (and by the browser's own deadline).
func (b *Browser) actionCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(b.Ctx, ActionTimeout)
}

// Navigate loads url in the tab and waits for its load event.
func (b *Browser) Navigate(url string) {
	b.t.Helper()
	ctx, cancel := b.actionCtx()
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		b.t.Fatalf("browsertest: navigate to %s: %v", url, err)
	}
}

// Text returns the textContent of the first element matching the CSS selector, waiting up to
// ActionTimeout for it to appear.
func (b *Browser) Text(selector string) string {
	b.t.Helper()
	ctx, cancel := b.actionCtx()
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(selector)))
	if err != nil {
		b.t.Fatalf("browsertest: text of %q: %v", selector, err)
	}
	return s
}

// peekTextJS returns the textContent of the first element matching the selector (the argument),
// or null when there is none. It runs through DevTools, so also with JavaScript off.
const peekTextJS = `(function(sel) { const e = document.querySelector(sel); return e === null ? null : e.textContent; })`

// peekText returns the text of the first element matching selector, and whether there is one,
// without waiting.
func (b *Browser) peekText(ctx context.Context, selector string) (string, bool, error) {
	s, err := chromedp.Run(ctx, chromedp.Evaluate[*string](peekTextJS+"("+jsString(selector)+")"))
	if err != nil {
		return "", false, err
	}
	if s == nil {
		return "", false, nil
	}
	return *s, true, nil
}

// WaitText waits up to timeout for the textContent of the first element matching the CSS
// selector to contain substr, reading it again every 50ms: the way to wait for a live update,
// or for the page a click led to. It fails the test with the last text it saw.
func (b *Browser) WaitText(selector, substr string, timeout time.Duration) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.Ctx, timeout)
	defer cancel()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	last, found := "", false
	var lastErr error
	for {
		// A read can fail while the page navigates (its context is destroyed); read again.
		if s, ok, err := b.peekText(ctx, selector); err == nil {
			last, found, lastErr = s, ok, nil
			if ok && strings.Contains(s, substr) {
				return
			}
		} else if ctx.Err() == nil {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			switch {
			case found:
				b.t.Fatalf("browsertest: %q did not contain %q within %v; its text was %q", selector, substr, timeout, last)
			case lastErr != nil:
				b.t.Fatalf("browsertest: %q did not contain %q within %v: %v", selector, substr, timeout, lastErr)
			default:
				b.t.Fatalf("browsertest: no element matched %q within %v (waiting for %q)", selector, timeout, substr)
			}
			return
		case <-tick.C:
		}
	}
}

// Click clicks the first element matching the CSS selector, as a mouse would, waiting up to
// ActionTimeout for it to be visible. It does not wait for a navigation the click causes: follow
// it with WaitText (Text would read whichever page is there).
func (b *Browser) Click(selector string) {
	b.t.Helper()
	ctx, cancel := b.actionCtx()
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(selector))); err != nil {
		b.t.Fatalf("browsertest: click %q: %v", selector, err)
	}
}

// SetValue sets the value of the first input, textarea or select matching the CSS selector,
// waiting up to ActionTimeout for it to appear. It fires no input events; a page that listens
// for typing needs chromedp.SendKeys on Ctx.
func (b *Browser) SetValue(selector, value string) {
	b.t.Helper()
	ctx, cancel := b.actionCtx()
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.SetValue(chromedp.CSS(selector), value)); err != nil {
		b.t.Fatalf("browsertest: set the value of %q: %v", selector, err)
	}
}

// submitJS submits the form of an element (the form itself, or the form it is in) the way
// pressing Enter does: with requestSubmit, which validates the form and fires its submit event.
// It reports whether a navigation follows: "navigate", "handled" (a page script called
// preventDefault), "invalid" or "noform".
const submitJS = `function() {
	const form = this.tagName === 'FORM' ? this : this.form || this.closest('form');
	if (!form) return 'noform';
	if (!form.checkValidity()) return 'invalid';
	let prevented = false;
	const seen = (e) => { prevented = e.defaultPrevented; };
	window.addEventListener('submit', seen);
	try { form.requestSubmit(); } finally { window.removeEventListener('submit', seen); }
	return prevented ? 'handled' : 'navigate';
}`

// Submit submits the form matching the CSS selector (or the form of the matching element), as
// pressing Enter in it would, and waits up to ActionTimeout for the page it leads to to load;
// when a page script handles the submission instead (preventDefault), it returns at once.
func (b *Browser) Submit(selector string) {
	b.t.Helper()
	ctx, cancel := b.actionCtx()
	defer cancel()
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	loads := chromedp.Events(lctx, page.LoadEventFired) // subscribed before the submission
	res, err := chromedp.Run(ctx, chromedp.QueryAfter(chromedp.CSS(selector),
		func(ctx context.Context, t *chromedp.Target, nodes []*chromedp.Node) (string, error) {
			return callOn[string](ctx, t, nodes[0], submitJS)
		}))
	if err != nil {
		b.t.Fatalf("browsertest: submit %q: %v", selector, err)
	}
	switch res {
	case "noform":
		b.t.Fatalf("browsertest: submit %q: not a form nor in one", selector)
	case "invalid":
		b.t.Fatalf("browsertest: submit %q: the form is invalid", selector)
	case "handled":
		return
	}
	for _, err := range loads {
		if err != nil {
			b.t.Fatalf("browsertest: submit %q: wait for the next page: %v", selector, err)
		}
		return
	}
}

// Screenshot writes a PNG of the whole page (beyond the window) to the artifacts directory, as
// TESTNAME-NAME.png, and logs its path so a person can find it. The directory is
// $HARMONIA_ARTIFACTS, or .artifacts/screenshots at the root of the repository.
func (b *Browser) Screenshot(name string) string {
	b.t.Helper()
	ctx, cancel := b.actionCtx()
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("browsertest: screenshot %s: %v", name, err)
	}
	dir, err := ArtifactsDir()
	if err != nil {
		b.t.Fatalf("browsertest: screenshot %s: %v", name, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.t.Fatalf("browsertest: screenshot %s: %v", name, err)
	}
	path := filepath.Join(dir, fileName(b.t.Name()+"-"+name)+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatalf("browsertest: screenshot %s: %v", name, err)
	}
	b.t.Logf("browsertest: screenshot %s", path)
	return path
}

// ArtifactsDir returns the directory Screenshot writes to: $HARMONIA_ARTIFACTS if set, else
// .artifacts/screenshots in the repository holding the working directory (found by its go.mod).
func ArtifactsDir() (string, error) {
	if d := os.Getenv(ArtifactsEnv); d != "" {
		return filepath.Abs(d)
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find the artifacts directory: %w", err)
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return filepath.Join(d, ".artifacts", "screenshots"), nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("find the artifacts directory: no go.mod above %s; set %s", wd, ArtifactsEnv)
		}
	}
}

// fileName makes s safe as a file name: subtest slashes and other odd characters become '_'.
func fileName(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' {
			return r
		}
		return '_'
	}, s)
}

// Cookies returns the browser's cookies for the current page (and its frames), with their
// flags (HTTPOnly, Secure, SameSite, Expires), which document.cookie cannot show.
func (b *Browser) Cookies() []*network.Cookie {
	b.t.Helper()
	ctx, cancel := b.actionCtx()
	defer cancel()
	res, err := chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{})
	if err != nil {
		b.t.Fatalf("browsertest: cookies: %v", err)
	}
	return res.Cookies
}

// Location returns the URL of the current page.
func (b *Browser) Location() string {
	b.t.Helper()
	ctx, cancel := b.actionCtx()
	defer cancel()
	h, err := chromedp.Run(ctx, chromedp.NavigationEntries())
	if err != nil {
		b.t.Fatalf("browsertest: location: %v", err)
	}
	if h.CurrentIndex < 0 || int(h.CurrentIndex) >= len(h.Entries) {
		b.t.Fatalf("browsertest: location: no current entry in the history")
	}
	return h.Entries[h.CurrentIndex].URL
}

// Attr returns the value of the attribute name of the first element matching the CSS selector,
// and whether it has it, waiting up to ActionTimeout for the element to appear.
func (b *Browser) Attr(selector, name string) (string, bool) {
	b.t.Helper()
	ctx, cancel := b.actionCtx()
	defer cancel()
	res, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS(selector), name))
	if err != nil {
		b.t.Fatalf("browsertest: attribute %s of %q: %v", name, selector, err)
	}
	return res.Value, res.Exists
}

// countJS counts the elements matching the selector (the argument).
const countJS = `(function(sel) { return document.querySelectorAll(sel).length; })`

// Count returns how many elements match the CSS selector now, without waiting.
func (b *Browser) Count(selector string) int {
	b.t.Helper()
	ctx, cancel := b.actionCtx()
	defer cancel()
	n, err := chromedp.Run(ctx, chromedp.Evaluate[int](countJS+"("+jsString(selector)+")"))
	if err != nil {
		b.t.Fatalf("browsertest: count %q: %v", selector, err)
	}
	return n
}

// withoutDBus drops Chromium's complaints that there is no D-Bus, which a container never has.
func withoutDBus(out string) string {
	var b strings.Builder
	for line := range strings.Lines(out) {
		if !strings.Contains(line, ":ERROR:dbus/") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// limitedBuffer keeps the first max bytes written to it, for Chromium's output.
type limitedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if room := l.max - l.buf.Len(); room > 0 {
		l.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (l *limitedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// callOn calls the JavaScript function declaration with the node as this, and decodes its
// result into a T.
func callOn[T any](ctx context.Context, t *chromedp.Target, n *chromedp.Node, function string) (T, error) {
	var zero T
	r, err := cdp.Call(ctx, t, dom.ResolveNode, dom.ResolveNodeParams{NodeID: n.NodeID})
	if err != nil {
		return zero, err
	}
	defer cdp.Call(ctx, t, runtime.ReleaseObject, runtime.ReleaseObjectParams{ObjectID: r.Object.ObjectID})
	yes := true
	res, err := cdp.Call(ctx, t, runtime.CallFunctionOn, runtime.CallFunctionOnParams{
		FunctionDeclaration: function,
		ObjectID:            r.Object.ObjectID,
		ReturnByValue:       &yes,
	})
	if err != nil {
		return zero, err
	}
	if res.ExceptionDetails != nil {
		return zero, errors.New(exceptionText(res.ExceptionDetails))
	}
	var v T
	if res.Result == nil || len(res.Result.Value) == 0 {
		return zero, errors.New("the function returned nothing")
	}
	if err := json.Unmarshal(res.Result.Value, &v); err != nil {
		return zero, fmt.Errorf("decode the result: %w", err)
	}
	return v, nil
}

// jsString is s as a JavaScript string literal.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
