package apiclient

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// DefaultLoginTimeout is how long Login waits for the browser.
const DefaultLoginTimeout = 5 * time.Minute

// maxTokenLen bounds a token handed over by the callback.
const maxTokenLen = 4096

// LoginOptions configure Login.
type LoginOptions struct {
	Server string
	// Name names the token on the server; "" is DefaultTokenName.
	Name string
	// OpenFunc opens the URL in a browser; nil, or an error, and the URL is only printed.
	OpenFunc func(url string) error
	// Out is where the URL to visit is printed.
	Out io.Writer
	// Timeout bounds the wait for the browser (default DefaultLoginTimeout).
	Timeout time.Duration
}

// Login gets a token through the browser: it listens on a random loopback port, sends the
// browser to the server's /ci/tokens/cli page with that callback and a random state, and waits
// for the page's form POST of token and state to /callback. A callback whose state differs is
// refused and ends the login: someone other than the page posted it.
func Login(ctx context.Context, o LoginOptions) (string, error) {
	base, err := ParseServer(o.Server)
	if err != nil {
		return "", err
	}
	name := cmp.Or(o.Name, DefaultTokenName())
	state, err := newState()
	if err != nil {
		return "", err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("listen for the login callback: %w", err)
	}
	callback := "http://" + ln.Addr().String() + "/callback"
	page := base.JoinPath("/ci/tokens/cli")
	page.RawQuery = url.Values{"callback": {callback}, "state": {state}, "name": {name}}.Encode()

	type result struct {
		token string
		err   error
	}
	done := make(chan result, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /callback", func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
		if err := r.ParseForm(); err != nil {
			http.Error(w, "bad form", http.StatusBadRequest)
			return
		}
		got, token := r.PostForm.Get("state"), r.PostForm.Get("token")
		var res result
		switch {
		case subtle.ConstantTimeCompare([]byte(got), []byte(state)) != 1:
			res.err = errors.New("login refused: the callback's state does not match this login's (was it posted by another page?)")
			http.Error(w, "This login was not started here: state mismatch.", http.StatusBadRequest)
		case !validToken(token):
			res.err = errors.New("login failed: the server handed over no usable token")
			http.Error(w, "No usable token.", http.StatusBadRequest)
		default:
			res.token = token
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			fmt.Fprint(w, `<!doctype html><title>harmonia-ci</title><p>Logged in: you can close this tab and go back to the terminal.</p>`)
		}
		select {
		case done <- res:
		default:
		}
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx) // lets the answer to the callback reach the browser
	}()

	out := cmp.Or[io.Writer](o.Out, io.Discard)
	if o.OpenFunc == nil || o.OpenFunc(page.String()) != nil {
		fmt.Fprintf(out, "Open this URL in a browser to log in:\n\n  %s\n\n", page)
	} else {
		fmt.Fprintf(out, "Opened a browser to log in; if none opened, visit:\n\n  %s\n\n", page)
	}
	timer := time.NewTimer(cmp.Or(o.Timeout, DefaultLoginTimeout))
	defer timer.Stop()
	select {
	case res := <-done:
		return res.token, res.err
	case <-timer.C:
		return "", errors.New("login timed out: the browser did not come back")
	case <-ctx.Done():
		return "", context.Cause(ctx)
	}
}

// DefaultTokenName is "cli@<hostname>".
func DefaultTokenName() string {
	host, _ := os.Hostname()
	return "cli@" + cmp.Or(host, "unknown")
}

// newState is 32 random URL-safe characters.
func newState() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// validToken: non-empty, bounded, printable ASCII without spaces (it goes into a header).
func validToken(t string) bool {
	if t == "" || len(t) > maxTokenLen {
		return false
	}
	return !strings.ContainsFunc(t, func(r rune) bool { return r <= ' ' || r > '~' })
}
