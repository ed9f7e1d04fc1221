// Package apiclient is the command line's client of a frontend over HTTP: the read API under
// /api/v1/ (its own response types, from internal/apiv1), the build and evaluation actions, and
// a build's log, live or archived, all with a bearer token. Its errors carry the HTTP status, so
// the command line can turn them into stable exit codes; a read that is rate limited is retried
// after the server's Retry-After, a write is not. The credentials file that `harmonia-ci login`
// writes (credentials.go) and the login's loopback callback (login.go) live here too.
package apiclient

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Defaults of Options.
const (
	DefaultMaxRetries = 3
	DefaultMaxWait    = 2 * time.Minute
	// maxErrorBody bounds how much of an error answer is read.
	maxErrorBody = 64 << 10
)

// Options configure a Client.
type Options struct {
	// Server is the frontend's base URL, http or https (a path prefix is kept).
	Server string
	// Token is sent as "Authorization: Bearer"; "" asks anonymously.
	Token string
	// HTTPClient defaults to a client without an overall timeout (a log stream lasts as long as
	// its build); each call is bounded by its context.
	HTTPClient *http.Client
	// SleepFunc waits out a Retry-After; nil: a timer. Tests inject one.
	SleepFunc func(ctx context.Context, d time.Duration) error
	// MaxRetries is how often a rate-limited read is retried (default DefaultMaxRetries).
	MaxRetries int
	// MaxWait is the longest Retry-After waited for (default DefaultMaxWait); a longer one is
	// reported at once.
	MaxWait time.Duration
}

// Client calls one server.
type Client struct {
	base       *url.URL
	token      string
	http       *http.Client
	sleep      func(ctx context.Context, d time.Duration) error
	maxRetries int
	maxWait    time.Duration
}

// New checks the server URL and returns its client.
func New(o Options) (*Client, error) {
	base, err := ParseServer(o.Server)
	if err != nil {
		return nil, err
	}
	if strings.ContainsAny(o.Token, "\r\n") {
		return nil, errors.New("the token contains a line break")
	}
	c := &Client{base: base, token: strings.TrimSpace(o.Token), http: o.HTTPClient, sleep: o.SleepFunc,
		maxRetries: cmp.Or(o.MaxRetries, DefaultMaxRetries), maxWait: cmp.Or(o.MaxWait, DefaultMaxWait)}
	if c.http == nil {
		c.http = &http.Client{}
	}
	if c.sleep == nil {
		c.sleep = Sleep
	}
	return c, nil
}

// ParseServer checks a server URL: http or https, a host, no credentials, query or fragment.
// The trailing slash is dropped, so that one server has one spelling (the credentials key).
func ParseServer(raw string) (*url.URL, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	switch {
	case raw == "":
		return nil, errors.New("no server: pass --server URL or set HARMONIA_CI_SERVER")
	case err != nil:
		return nil, fmt.Errorf("server URL %q: %w", raw, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("server URL %q: want http:// or https://", raw)
	case u.Host == "":
		return nil, fmt.Errorf("server URL %q has no host", raw)
	case u.User != nil:
		return nil, fmt.Errorf("server URL %q: no credentials in the URL, pass a token instead", u.Redacted())
	case u.RawQuery != "" || u.Fragment != "":
		return nil, fmt.Errorf("server URL %q: no query or fragment", raw)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = ""
	return u, nil
}

// Server is the server's base URL, without a trailing slash.
func (c *Client) Server() string { return c.base.String() }

// Sleep waits d, or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Error is a failed call: the server's answer (Status, and its message), or no answer at all
// (Status 0, Err the network's error). It never holds the token.
type Error struct {
	Server       string // the base URL
	Method, Path string
	Status       int
	Msg          string        // the server's {"error": …}, or its status text
	RetryAfter   time.Duration // of a 429
	Anonymous    bool          // the request carried no token
	Err          error
}

func (e *Error) Error() string {
	where := e.Method + " " + e.Path
	switch {
	case e.Status == 0:
		return fmt.Sprintf("%s: server %s unreachable: %v", where, e.Server, e.Err)
	case e.Status == http.StatusUnauthorized && e.Anonymous:
		return fmt.Sprintf("%s: the server wants a token (401 %s): run `harmonia-ci login --server URL` or pass --token", where, e.Msg)
	case e.Status == http.StatusUnauthorized:
		return fmt.Sprintf("%s: the server refused the token (401 %s): it is invalid, revoked or expired; run `harmonia-ci login --server URL` or pass another --token", where, e.Msg)
	case e.Status == http.StatusForbidden:
		return fmt.Sprintf("%s: forbidden (403 %s): the token's user may not do this; nothing was changed", where, e.Msg)
	case e.Status == http.StatusNotFound:
		return fmt.Sprintf("%s: not found (404 %s): it does not exist, or the token's user may not read it", where, e.Msg)
	case e.Status == http.StatusTooManyRequests:
		return fmt.Sprintf("%s: rate limited (429 %s): retry after %s", where, e.Msg, e.RetryAfter)
	}
	return fmt.Sprintf("%s: %d %s", where, e.Status, e.Msg)
}

func (e *Error) Unwrap() error { return e.Err }

// request is one call: a path under the base URL, a query, a JSON body for writes.
type request struct {
	method string
	path   string
	query  url.Values
	body   any
	accept string
	header http.Header
}

// do sends r and returns the response of a 2xx, retrying a read that is rate limited; any other
// answer is an *Error. The caller closes the body.
func (c *Client) do(ctx context.Context, r request) (*http.Response, error) {
	for attempt := 0; ; attempt++ {
		resp, err := c.send(ctx, r)
		var ae *Error
		if !errors.As(err, &ae) || ae.Status != http.StatusTooManyRequests || r.method != http.MethodGet ||
			attempt >= c.maxRetries || ae.RetryAfter > c.maxWait {
			return resp, err
		}
		if err := c.sleep(ctx, ae.RetryAfter); err != nil {
			return nil, fmt.Errorf("waiting to retry %s %s: %w", r.method, r.path, err)
		}
	}
}

func (c *Client) send(ctx context.Context, r request) (*http.Response, error) {
	ref, err := url.Parse(c.base.EscapedPath() + r.path) // r.path is escaped
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", r.method, r.path, err)
	}
	u := *c.base
	u.Path, u.RawPath, u.RawQuery = ref.Path, ref.RawPath, r.query.Encode()
	var body io.Reader
	if r.body != nil {
		b, err := json.Marshal(r.body)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u.String(), body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", r.method, r.path, err)
	}
	if r.body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range r.header {
		req.Header[k] = v
	}
	req.Header.Set("Accept", cmp.Or(r.accept, "application/json"))
	req.Header.Set("User-Agent", "harmonia-ci-cli")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s %s: %w", r.method, r.path, context.Cause(ctx))
		}
		// url.Error names the URL, never the request's headers.
		return nil, &Error{Server: c.base.String(), Method: r.method, Path: r.path, Err: unwrapURLError(err)}
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return resp, nil
	}
	defer resp.Body.Close()
	e := errorOf(r, resp)
	e.Server, e.Anonymous = c.base.String(), c.token == ""
	return nil, e
}

// unwrapURLError drops url.Error's "Get "URL":" prefix, which Error's own prefix repeats.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// errorOf reads a failed answer: its JSON {"error"} if any, its Retry-After.
func errorOf(r request, resp *http.Response) *Error {
	e := &Error{Method: r.method, Path: r.path, Status: resp.StatusCode}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var body struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(b, &body) == nil && body.Error != "" {
		e.Msg = body.Error
	} else {
		e.Msg = http.StatusText(resp.StatusCode)
	}
	if resp.StatusCode == http.StatusTooManyRequests {
		e.RetryAfter = time.Second
		if s, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("Retry-After"))); err == nil && s >= 0 {
			e.RetryAfter = time.Duration(s) * time.Second
		}
	}
	return e
}

// getJSON reads path into v.
func (c *Client) getJSON(ctx context.Context, path string, query url.Values, v any) error {
	resp, err := c.do(ctx, request{method: http.MethodGet, path: path, query: query})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("GET %s: decode the answer: %w", path, err)
	}
	return nil
}

// ActionResult is a write's answer.
type ActionResult struct {
	Message string `json:"message"`
}

// post runs the action at path.
func (c *Client) post(ctx context.Context, path string) (ActionResult, error) {
	var res ActionResult
	resp, err := c.do(ctx, request{method: http.MethodPost, path: path, body: struct{}{}})
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		return res, fmt.Errorf("POST %s: decode the answer: %w", path, err)
	}
	return res, nil
}
