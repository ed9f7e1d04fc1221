package substitute

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

const (
	// ParallelDefault is the default number of concurrent narinfo lookups.
	ParallelDefault = 16
	// NarinfoTimeout bounds a whole narinfo request, from dialling to the last byte.
	NarinfoTimeout = 30 * time.Second
	// MaxNarinfoSize is the largest narinfo accepted; real ones are well under 100 KiB even with
	// thousands of references.
	MaxNarinfoSize = 1 << 20
)

// ErrNotFound means that every cache answered and none has a validly signed narinfo for the
// path.
var ErrNotFound = errors.New("no cache has a validly signed narinfo")

// DefaultTransport bounds connecting and the TLS handshake but not whole requests: a NAR
// download may take as long as its context allows. The default client's, for clients that wrap
// it.
var DefaultTransport http.RoundTripper = &http.Transport{
	Proxy:                 http.ProxyFromEnvironment,
	DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	ForceAttemptHTTP2:     true,
	TLSHandshakeTimeout:   10 * time.Second,
	MaxIdleConnsPerHost:   ParallelDefault,
	IdleConnTimeout:       90 * time.Second,
	ExpectContinueTimeout: time.Second,
}

var defaultClient = &http.Client{Transport: DefaultTransport}

// Fetcher fetches store paths from binary caches: the first cache, in order, with a validly
// signed narinfo for a path wins. The zero value has no caches and no keys; set at least Caches
// and Keys. A Fetcher is safe for concurrent use once its fields are set.
type Fetcher struct {
	// Caches are the base URLs of binary caches ("http://host:port", "https://host/prefix"), in
	// order of preference.
	Caches []string
	// HTTP is the client for every request. Default: one that gives up connecting after 10s.
	// Narinfo requests are always bounded by NarinfoTimeout; NAR downloads only by their context.
	HTTP *http.Client
	// Keys are the trusted public keys: a narinfo counts only if one of them signed it. Unlike
	// Nix, content-addressed paths need a signature too.
	Keys []nix.PublicKey
	// Parallel is the number of concurrent narinfo lookups in Closure. Default: ParallelDefault.
	Parallel int
}

// Found is a store path a cache has: its verified narinfo and the cache it came from.
type Found struct {
	Cache string // base URL, from Fetcher.Caches without a trailing slash
	Info  *nix.NarInfo
}

// Path returns the found store path.
func (f *Found) Path() string { return f.Info.StorePath }

func (f *Fetcher) client() *http.Client { return cmp.Or(f.HTTP, defaultClient) }

// check refuses a Fetcher that could never accept anything, which is a configuration error
// rather than a missing path.
func (f *Fetcher) check() error {
	if len(f.Keys) == 0 {
		return errors.New("no trusted public keys")
	}
	for _, c := range f.Caches {
		if _, err := cacheURL(c); err != nil {
			return err
		}
	}
	return nil
}

// cacheURL validates a cache base URL and returns it without a trailing slash.
func cacheURL(c string) (string, error) {
	u, err := url.Parse(c)
	if err != nil {
		return "", fmt.Errorf("cache URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("cache URL %q: want http(s)://host[/path]", c)
	}
	return strings.TrimRight(c, "/"), nil
}

// cacheError is why one cache did not supply a path. A definite answer (absent, unsigned,
// malformed) says the cache does not have a usable narinfo; anything else (a network error, an
// unexpected status) says nothing about whether it has one.
type cacheError struct {
	cache    string
	err      error
	definite bool
}

func (e *cacheError) Error() string { return e.cache + ": " + e.err.Error() }
func (e *cacheError) Unwrap() error { return e.err }

// Lookup finds storePath in the caches, in order, and returns the first narinfo that is
// signed by a trusted key and names exactly storePath. A cache that does not have it (404),
// answers with an unparsable or unsigned narinfo, or cannot be reached is skipped.
//
// If no cache supplies the path, the error names each cache's reason. It wraps ErrNotFound
// only when every cache gave a definite answer: if one could not be asked (a network error, a
// status other than 200 or 404), the path may well exist and the error does not wrap it.
func (f *Fetcher) Lookup(ctx context.Context, storePath string) (*Found, error) {
	sp, err := nix.ParseStorePath(storePath)
	if err != nil {
		return nil, fmt.Errorf("look up: %w", err)
	}
	if err := f.check(); err != nil {
		return nil, fmt.Errorf("look up %s: %w", storePath, err)
	}
	var reasons []error
	definite := true
	for _, c := range f.Caches {
		base, _ := cacheURL(c)
		ni, err := f.narinfo(ctx, base, sp)
		if err == nil {
			return &Found{Cache: base, Info: ni}, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("look up %s: %w", storePath, context.Cause(ctx))
		}
		var ce *cacheError
		if !errors.As(err, &ce) || !ce.definite {
			definite = false
		}
		reasons = append(reasons, err)
	}
	if len(f.Caches) == 0 {
		reasons = append(reasons, errors.New("no caches configured"))
	}
	if definite {
		reasons = append([]error{ErrNotFound}, reasons...)
	}
	return nil, &lookupError{path: storePath, errs: reasons}
}

// lookupError is a failed Lookup: each cache's reason, after ErrNotFound if they all were
// definite.
type lookupError struct {
	path string
	errs []error
}

func (e *lookupError) Error() string {
	msgs := make([]string, len(e.errs))
	for i, err := range e.errs {
		msgs[i] = err.Error()
	}
	return "look up " + e.path + ": " + strings.Join(msgs, "; ")
}

func (e *lookupError) Unwrap() []error { return e.errs }

// narinfo fetches, parses and verifies the narinfo of sp from the cache at base.
func (f *Fetcher) narinfo(ctx context.Context, base string, sp nix.StorePath) (*nix.NarInfo, error) {
	fail := func(definite bool, format string, args ...any) error {
		return &cacheError{cache: base, err: fmt.Errorf(format, args...), definite: definite}
	}
	ctx, cancel := context.WithTimeout(ctx, NarinfoTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/"+sp.Hash+".narinfo", nil)
	if err != nil {
		return nil, fail(false, "%w", err)
	}
	resp, err := f.client().Do(req)
	if err != nil {
		return nil, fail(false, "%w", err)
	}
	defer func() {
		// Draining a short error page lets the connection be reused.
		_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
		resp.Body.Close()
	}()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return nil, fail(true, "not found")
	default:
		return nil, fail(false, "narinfo: unexpected status %s", resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxNarinfoSize+1))
	if err != nil {
		return nil, fail(false, "narinfo: %w", err)
	}
	if len(body) > MaxNarinfoSize {
		return nil, fail(true, "narinfo larger than %d bytes", MaxNarinfoSize)
	}
	ni, err := nix.ParseNarInfo(body)
	if err != nil {
		return nil, fail(true, "%w", err)
	}
	if ni.StorePath != sp.String() {
		return nil, fail(true, "narinfo is for StorePath %s", ni.StorePath)
	}
	for _, k := range f.Keys {
		if ni.Verify(k) {
			return ni, nil
		}
	}
	return nil, fail(true, "narinfo not signed by any trusted key")
}
