package forge

import (
	"bytes"
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

// maxResponse bounds what is read of one API answer.
const maxResponse = 16 << 20

// maxRateLimitWait is the longest a call waits for a rate limit to lift; past it the call
// fails (and the caller retries later) rather than hold a goroutine for an hour.
const maxRateLimitWait = 5 * time.Minute

// APIError is a forge answer other than 2xx.
type APIError struct {
	Method, URL string
	Code        int
	Message     string // the forge's "message", or the start of the body
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s %s: %d %s", e.Method, e.URL, e.Code, e.Message)
}

// Is makes a 404 match ErrNotFound.
func (e *APIError) Is(target error) bool {
	return target == ErrNotFound && e.Code == http.StatusNotFound
}

// Temporary reports whether retrying later may succeed: server errors and rate limits.
func (e *APIError) Temporary() bool {
	return e.Code >= 500 || e.Code == http.StatusTooManyRequests || e.Code == http.StatusForbidden
}

// api is a JSON REST client for one forge: base URL, authentication and rate-limit handling.
type api struct {
	base   *url.URL
	http   *http.Client
	auth   func(ctx context.Context, req *http.Request) error
	header http.Header // added to every request (Accept, API version)
	sleep  func(ctx context.Context, d time.Duration) error
}

func newAPI(base string, client *http.Client) (*api, error) {
	u, err := url.Parse(strings.TrimRight(base, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("forge API URL %q: want an absolute http(s) URL", base)
	}
	if client == nil {
		client = &http.Client{Timeout: 30 * time.Second}
	}
	return &api{base: u, http: client, header: http.Header{}, sleep: sleepCtx}, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// url joins path (already escaped, starting with '/') and query to the base URL.
func (a *api) url(path string, query url.Values) string {
	u := *a.base
	// path is escaped already (a branch may hold an escaped '/'): keep that form.
	u.RawPath = a.base.EscapedPath() + path
	u.Path, _ = url.PathUnescape(u.RawPath)
	if query != nil {
		u.RawQuery = query.Encode()
	}
	return u.String()
}

// do sends a request with a JSON body (nil: none) and decodes a 2xx JSON answer into out (nil:
// discarded). A rate-limit answer (429, or 403 with Retry-After or an exhausted
// X-RateLimit-Remaining) is waited out and retried, up to maxRateLimitWait in all. It returns
// the response headers (for pagination).
func (a *api) do(ctx context.Context, method, rawURL string, body, out any) (http.Header, error) {
	var payload []byte
	if body != nil {
		var err error
		if payload, err = json.Marshal(body); err != nil {
			return nil, fmt.Errorf("encode %s %s: %w", method, rawURL, err)
		}
	}
	waited := time.Duration(0)
	for {
		h, wait, err := a.once(ctx, method, rawURL, payload, out)
		if wait <= 0 {
			return h, err
		}
		if waited+wait > maxRateLimitWait {
			return h, fmt.Errorf("%w (rate limited for %s more)", err, wait)
		}
		waited += wait
		if serr := a.sleep(ctx, wait); serr != nil {
			return h, err
		}
	}
}

// once makes one request; wait > 0 says the answer was a rate limit to wait out.
func (a *api) once(ctx context.Context, method, rawURL string, payload []byte, out any) (http.Header, time.Duration, error) {
	var rd io.Reader
	if payload != nil {
		rd = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, rawURL, rd)
	if err != nil {
		return nil, 0, fmt.Errorf("%s %s: %w", method, rawURL, err)
	}
	for k, v := range a.header {
		req.Header[k] = v
	}
	req.Header.Set("Accept", cmpOr(a.header.Get("Accept"), "application/json"))
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if a.auth != nil {
		if err := a.auth(ctx, req); err != nil {
			return nil, 0, err
		}
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("%s %s: %w", method, rawURL, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return resp.Header, 0, fmt.Errorf("%s %s: read answer: %w", method, rawURL, err)
	}
	if resp.StatusCode/100 != 2 {
		apiErr := &APIError{Method: method, URL: rawURL, Code: resp.StatusCode, Message: errorMessage(data)}
		return resp.Header, rateLimitWait(resp, time.Now()), apiErr
	}
	if out != nil && len(data) > 0 && resp.StatusCode != http.StatusNoContent {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.Header, 0, fmt.Errorf("%s %s: decode answer: %w", method, rawURL, err)
		}
	}
	return resp.Header, 0, nil
}

// rateLimitWait is how long a rate-limit answer asks the client to wait, 0 if it is none: a
// 429 or 403 with Retry-After (GitHub's secondary limits), or with X-RateLimit-Remaining 0
// until X-RateLimit-Reset (its primary limit).
func rateLimitWait(resp *http.Response, now time.Time) time.Duration {
	if resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusTooManyRequests {
		return 0
	}
	if s := resp.Header.Get("Retry-After"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n >= 0 {
			return max(time.Duration(n)*time.Second, time.Second)
		}
		if t, err := http.ParseTime(s); err == nil {
			return max(t.Sub(now), time.Second)
		}
	}
	if resp.Header.Get("X-RateLimit-Remaining") == "0" {
		if n, err := strconv.ParseInt(resp.Header.Get("X-RateLimit-Reset"), 10, 64); err == nil {
			return max(time.Unix(n, 0).Sub(now), time.Second)
		}
	}
	if resp.StatusCode == http.StatusTooManyRequests {
		return time.Minute
	}
	return 0
}

func errorMessage(body []byte) string {
	var m struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &m) == nil && m.Message != "" {
		return m.Message
	}
	s := strings.TrimSpace(string(body))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// nextPage returns the rel="next" URL of an RFC 8288 Link header, "" on the last page.
func nextPage(h http.Header) string {
	for _, link := range h.Values("Link") {
		for part := range strings.SplitSeq(link, ",") {
			target, params, ok := strings.Cut(strings.TrimSpace(part), ";")
			if !ok || !strings.HasPrefix(target, "<") || !strings.HasSuffix(target, ">") {
				continue
			}
			for p := range strings.SplitSeq(params, ";") {
				k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
				if strings.EqualFold(k, "rel") && strings.Trim(v, `"`) == "next" {
					return target[1 : len(target)-1]
				}
			}
		}
	}
	return ""
}

// getAll follows Link rel="next" from rawURL and appends each page's items to a slice; pages
// is the most it reads (a guard against a forge that links in a circle).
func getAll[T any](ctx context.Context, a *api, rawURL string, pages int) ([]T, error) {
	var all []T
	for i := 0; rawURL != ""; i++ {
		if i >= pages {
			return nil, fmt.Errorf("GET %s: more than %d pages", rawURL, pages)
		}
		var page []T
		h, err := a.do(ctx, http.MethodGet, rawURL, nil, &page)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		next := nextPage(h)
		if next != "" && !a.sameOrigin(next) {
			return nil, fmt.Errorf("GET %s: next page %q is on another host", rawURL, next)
		}
		rawURL = next
	}
	return all, nil
}

// sameOrigin keeps credentials on the forge: a Link header must not send them elsewhere.
func (a *api) sameOrigin(raw string) bool {
	u, err := url.Parse(raw)
	return err == nil && u.Scheme == a.base.Scheme && u.Host == a.base.Host
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// isTemporary reports whether err is worth retrying: a network failure or a temporary answer.
func isTemporary(err error) bool {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Temporary()
	}
	return err != nil && !errors.Is(err, context.Canceled)
}
