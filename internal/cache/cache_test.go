package cache_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/blobtest"
	"github.com/harmonia-ci/harmonia-ci/internal/cache"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
)

// The .drv objects' tests need a real PostgreSQL (one database per test).
func TestMain(m *testing.M) { dbtest.Main(m, blobtest.Cleanup) }

const (
	h32     = "1b9p07z77phvv2hf6gm9f28syp39f1ag"                     // stored
	miss32  = "0000000000000000000000000000000z"                     // valid, absent
	h52     = "1b9p07z77phvv2hf6gm9f28syp39f1ag1b9p07z77phvv2hf6gm9" // stored
	miss52  = "00000000000000000000000000000000000000000000000000zz" // valid, absent
	drvBase = h32 + "-hello-2.12.1.drv"
)

var (
	kNarinfo = h32 + ".narinfo"
	kListing = h32 + ".ls"
	kNar     = "nar/" + h52 + ".nar.zst"
	kLog     = "log/" + drvBase

	narinfoBody = "StorePath: /nix/store/" + h32 + "-hello\nURL: nar/" + h52 + ".nar.zst\n"
	listingBody = `{"version":1,"root":{"type":"regular","size":5}}`
	narBody     = strings.Repeat("\x28\xb5\x2f\xfd compressed nar bytes ", 5000)
	logText     = strings.Repeat("building hello...\nchecking for gcc... yes\n", 3000)
)

var testSecret = []byte("0123456789abcdef0123456789abcdef")

// recordingStore passes calls through to a real store, remembering every key asked for; with
// err set, Get and Head fail with it instead.
type recordingStore struct {
	blob.Store
	mu   sync.Mutex
	keys []string
	err  error
}

func (s *recordingStore) record(key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys = append(s.keys, key)
	return s.err
}

func (s *recordingStore) Get(ctx context.Context, key string) (io.ReadCloser, blob.Info, error) {
	if err := s.record(key); err != nil {
		return nil, blob.Info{}, err
	}
	return s.Store.Get(ctx, key)
}

func (s *recordingStore) Head(ctx context.Context, key string) (blob.Info, error) {
	if err := s.record(key); err != nil {
		return blob.Info{}, err
	}
	return s.Store.Head(ctx, key)
}

func (s *recordingStore) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.keys
	s.keys = nil
	return k
}

func newLocal(t *testing.T) blob.Store { return newLocalTB(t) }

func newLocalTB(t testing.TB) blob.Store {
	t.Helper()
	l, err := blob.NewLocal(t.TempDir(), "http://unused", testSecret)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func newS3(t *testing.T) blob.Store {
	t.Helper()
	s, err := blob.NewS3(blobtest.StartMinIO(t))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func put(t testing.TB, s blob.Store, key string, body []byte) {
	t.Helper()
	if err := s.Put(context.Background(), key, bytes.NewReader(body), int64(len(body)), blob.PutOptions{}); err != nil {
		t.Fatalf("Put(%s): %v", key, err)
	}
}

func zstdCompress(t *testing.T, b []byte) []byte {
	t.Helper()
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	return enc.EncodeAll(b, nil)
}

// serve returns a test server for a cache over store, and the recorder in between.
func serve(t *testing.T, store blob.Store, logger *slog.Logger) (*httptest.Server, *recordingStore) {
	t.Helper()
	rec := &recordingStore{Store: store}
	mux := http.NewServeMux()
	cache.New(cache.Config{Store: rec, Logger: logger}).Register(access.NewRoutes(mux, nil))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, rec
}

// noRedirects sees redirects instead of following them.
var noRedirects = &http.Client{
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	Timeout:       10 * time.Second,
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func do(t *testing.T, method, url string, header http.Header) response {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := noRedirects.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, url, err)
	}
	return response{resp.StatusCode, resp.Header, body}
}

// comparedHeaders must be equal between GET and HEAD.
var comparedHeaders = []string{"Content-Type", "Content-Length", "Cache-Control", "Content-Encoding", "Vary", "Location"}

type pathCase struct {
	name   string
	path   string
	accept string // Accept-Encoding
	status int
	ctype  string
	cc     string // Cache-Control; "" means not checked
	body   string // checked for 200 only, and only if set
	encode string // Content-Encoding
	keys   []string
}

func pathCases(compressedLog []byte) []pathCase {
	const (
		immutable = "public, max-age=31536000, immutable"
		hit       = "public, max-age=60"
		miss      = "public, max-age=5"
		plain     = "text/plain; charset=utf-8"
	)
	return []pathCase{
		{name: "cache info", path: "/nix-cache-info", status: 200, ctype: "text/x-nix-cache-info", cc: hit,
			body: "StoreDir: /nix/store\nWantMassQuery: 1\nPriority: 30\n"},
		{name: "narinfo hit", path: "/" + kNarinfo, status: 200, ctype: "text/x-nix-narinfo", cc: hit, body: narinfoBody, keys: []string{kNarinfo}},
		{name: "narinfo miss", path: "/" + miss32 + ".narinfo", status: 404, cc: miss, keys: []string{miss32 + ".narinfo"}},
		{name: "narinfo short hash", path: "/" + h32[1:] + ".narinfo", status: 400},
		{name: "narinfo long hash", path: "/" + h32 + "0.narinfo", status: 400},
		{name: "narinfo bad alphabet", path: "/" + "e" + h32[1:] + ".narinfo", status: 400},
		{name: "narinfo upper case", path: "/" + strings.ToUpper(h32) + ".narinfo", status: 400},
		{name: "narinfo empty hash", path: "/.narinfo", status: 400},
		{name: "narinfo store path name", path: "/" + h32 + "-hello.narinfo", status: 400},
		{name: "listing hit", path: "/" + kListing, status: 200, ctype: "application/json", cc: hit, body: listingBody, keys: []string{kListing}},
		{name: "listing miss", path: "/" + miss32 + ".ls", status: 404, cc: miss, keys: []string{miss32 + ".ls"}},
		{name: "listing bad hash", path: "/xyz.ls", status: 400},
		{name: "nar hit", path: "/" + kNar, status: 200, ctype: "application/x-nix-nar", cc: immutable, body: narBody, keys: []string{kNar}},
		{name: "nar miss", path: "/nar/" + miss52 + ".nar.zst", status: 404, cc: miss, keys: []string{"nar/" + miss52 + ".nar.zst"}},
		{name: "nar xz not in layout", path: "/nar/" + h52 + ".nar.xz", status: 400},
		{name: "nar uncompressed miss", path: "/nar/" + miss52 + ".nar", status: 404, cc: miss, keys: []string{"nar/" + miss52 + ".nar"}},
		{name: "nar bz2 not in layout", path: "/nar/" + h52 + ".nar.bz2", status: 400},
		{name: "nar short hash", path: "/nar/" + h52[1:] + ".nar.zst", status: 400},
		{name: "nar bad alphabet", path: "/nar/" + "u" + h52[1:] + ".nar.zst", status: 400},
		{name: "nar encoded traversal", path: "/nar/..%2f..%2fetc%2fpasswd", status: 400},
		{name: "nar encoded dots", path: "/nar/%2e%2e%2f" + kNarinfo, status: 400},
		{name: "nar encoded dotdot segment", path: "/nar/%2e%2e", status: 400},
		{name: "nar encoded slash", path: "/nar/x%2f" + h52 + ".nar.zst", status: 400},
		{name: "nar backslash", path: "/nar/..%5c" + h52 + ".nar.zst", status: 400},
		{name: "nar nested", path: "/nar/a/" + h52 + ".nar.zst", status: 404},
		{name: "nar dir", path: "/nar/", status: 404},
		{name: "log plain", path: "/" + kLog, status: 200, ctype: plain, cc: hit, body: logText, keys: []string{kLog}},
		{name: "log zstd", path: "/" + kLog, accept: "gzip, zstd", status: 200, ctype: plain, cc: hit, body: string(compressedLog), encode: "zstd", keys: []string{kLog}},
		{name: "log zstd refused", path: "/" + kLog, accept: "zstd;q=0, gzip", status: 200, ctype: plain, cc: hit, body: logText, keys: []string{kLog}},
		{name: "log miss", path: "/log/" + miss32 + "-hello.drv", status: 404, cc: miss, keys: []string{"log/" + miss32 + "-hello.drv"}},
		{name: "log miss zstd", path: "/log/" + miss32 + "-hello.drv", accept: "zstd", status: 404, cc: miss, keys: []string{"log/" + miss32 + "-hello.drv"}},
		{name: "log not a drv", path: "/log/" + h32 + "-hello", status: 400},
		{name: "log bad hash", path: "/log/" + h32[2:] + "-hello.drv", status: 400},
		{name: "log dot name", path: "/log/" + h32 + "-.drv", status: 400},
		{name: "log encoded traversal", path: "/log/..%2f..%2f..%2fetc%2fshadow", status: 400},
		{name: "log dotdot redirected", path: "/log/../x", status: http.StatusTemporaryRedirect},
		{name: "log dotdot to narinfo redirected", path: "/log/../" + kNarinfo, status: http.StatusTemporaryRedirect},
		{name: "double slash redirected", path: "//nix-cache-info", status: http.StatusTemporaryRedirect},
		{name: "double slash nar redirected", path: "/nar//" + h52 + ".nar.zst", status: http.StatusTemporaryRedirect},
		{name: "encoded dotdot top", path: "/%2e%2e/etc/passwd", status: 404},
		{name: "encoded dotdot narinfo", path: "/%2e%2e%2f" + kNarinfo, status: 400},
		{name: "root", path: "/", status: 404},
		{name: "unknown top-level", path: "/index.html", status: 404, cc: miss},
		{name: "unknown nested", path: "/etc/passwd", status: 404},
		{name: "realisation not served", path: "/realisations/" + h32 + "!out.doi", status: 404},
		{name: "cache info subpath", path: "/nix-cache-info/x", status: 404},
	}
}

// fill stores one object of each kind and returns the compressed log.
func fill(t *testing.T, s blob.Store) []byte {
	t.Helper()
	compressedLog := zstdCompress(t, []byte(logText))
	put(t, s, kNarinfo, []byte(narinfoBody))
	put(t, s, kListing, []byte(listingBody))
	put(t, s, kNar, []byte(narBody))
	put(t, s, kLog, compressedLog)
	return compressedLog
}

func runPathCases(t *testing.T, store blob.Store) {
	compressedLog := fill(t, store)
	srv, rec := serve(t, store, nil)
	for _, c := range pathCases(compressedLog) {
		t.Run(c.name, func(t *testing.T) {
			var hdr http.Header
			if c.accept != "" {
				hdr = http.Header{"Accept-Encoding": {c.accept}}
			}
			rec.take()
			get := do(t, "GET", srv.URL+c.path, hdr)
			getKeys := rec.take()
			head := do(t, "HEAD", srv.URL+c.path, hdr)
			headKeys := rec.take()

			for _, r := range []struct {
				method string
				resp   response
				keys   []string
			}{{"GET", get, getKeys}, {"HEAD", head, headKeys}} {
				if r.resp.status != c.status {
					t.Errorf("%s %s: status %d, want %d; body %q", r.method, c.path, r.resp.status, c.status, trunc(r.resp.body))
				}
				if !slices.Equal(r.keys, c.keys) {
					t.Errorf("%s %s: store asked for %q, want %q", r.method, c.path, r.keys, c.keys)
				}
				if c.ctype != "" && r.resp.header.Get("Content-Type") != c.ctype {
					t.Errorf("%s %s: Content-Type %q, want %q", r.method, c.path, r.resp.header.Get("Content-Type"), c.ctype)
				}
				if c.cc != "" && r.resp.header.Get("Cache-Control") != c.cc {
					t.Errorf("%s %s: Cache-Control %q, want %q", r.method, c.path, r.resp.header.Get("Cache-Control"), c.cc)
				}
				if got := r.resp.header.Get("Content-Encoding"); got != c.encode {
					t.Errorf("%s %s: Content-Encoding %q, want %q", r.method, c.path, got, c.encode)
				}
				if strings.HasPrefix(c.path, "/log/") && c.status != http.StatusTemporaryRedirect && r.resp.header.Get("Vary") != "Accept-Encoding" && c.status != 400 {
					t.Errorf("%s %s: Vary %q, want Accept-Encoding", r.method, c.path, r.resp.header.Get("Vary"))
				}
			}
			if len(head.body) != 0 {
				t.Errorf("HEAD %s: body %q, want none", c.path, trunc(head.body))
			}
			if c.status == 200 && c.body != "" && string(get.body) != c.body {
				t.Errorf("GET %s: body %q, want %q", c.path, trunc(get.body), trunc([]byte(c.body)))
			}
			if c.status == 200 && c.encode == "" && !strings.HasPrefix(c.path, "/log/") &&
				get.header.Get("Content-Length") != strconv.Itoa(len(c.body)) && c.body != "" {
				t.Errorf("GET %s: Content-Length %q, want %d", c.path, get.header.Get("Content-Length"), len(c.body))
			}
			if c.status == http.StatusTemporaryRedirect {
				// ServeMux's own clean-path redirect: to a clean path on this server.
				loc := get.header.Get("Location")
				if !strings.HasPrefix(loc, "/") || strings.Contains(loc, "..") || strings.Contains(loc, "//") {
					t.Errorf("GET %s: redirect to %q, want a clean absolute path", c.path, loc)
				}
			} else {
				for _, h := range comparedHeaders {
					if g, hd := get.header.Values(h), head.header.Values(h); !slices.Equal(g, hd) {
						t.Errorf("%s: GET %q, HEAD %q", h, g, hd)
					}
				}
			}
		})
	}
}

func trunc(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "..."
	}
	return string(b)
}

func TestPathsLocal(t *testing.T) { runPathCases(t, newLocal(t)) }

func TestPathsS3(t *testing.T) { runPathCases(t, newS3(t)) }

func TestLogDecompression(t *testing.T) {
	store := newLocal(t)
	compressed := fill(t, store)
	corrupt := drvBaseWith("corrupt")
	put(t, store, "log/"+corrupt, []byte("this is not zstd at all, nothing like it"))
	srv, _ := serve(t, store, slog.New(slog.DiscardHandler))

	for _, c := range []struct {
		accept     string
		compressed bool
	}{
		{"", false},
		{"gzip", false},
		{"zstd", true},
		{"ZSTD", true},
		{"gzip;q=1.0, zstd;q=0.5", true},
		{"zstd;q=0", false},
		{"zstd;q=0.0, br", false},
		{"zstdx", false},
	} {
		var hdr http.Header
		if c.accept != "" {
			hdr = http.Header{"Accept-Encoding": {c.accept}}
		}
		r := do(t, "GET", srv.URL+"/"+kLog, hdr)
		if r.status != 200 {
			t.Fatalf("Accept-Encoding %q: status %d", c.accept, r.status)
		}
		if c.compressed {
			if !bytes.Equal(r.body, compressed) || r.header.Get("Content-Encoding") != "zstd" {
				t.Errorf("Accept-Encoding %q: got %d bytes, Content-Encoding %q; want the stored %d bytes, zstd",
					c.accept, len(r.body), r.header.Get("Content-Encoding"), len(compressed))
			}
		} else if string(r.body) != logText || r.header.Get("Content-Encoding") != "" {
			t.Errorf("Accept-Encoding %q: got %q, Content-Encoding %q; want the plain log",
				c.accept, trunc(r.body), r.header.Get("Content-Encoding"))
		}
		if r.header.Get("Vary") != "Accept-Encoding" {
			t.Errorf("Accept-Encoding %q: Vary %q", c.accept, r.header.Get("Vary"))
		}
	}

	// Each attempt's own log is served beside the latest, by the same rules.
	put(t, store, kLog+".1", zstdCompress(t, []byte("the first attempt failed\n")))
	if r := do(t, "GET", srv.URL+"/"+kLog+".1", nil); r.status != 200 || string(r.body) != "the first attempt failed\n" {
		t.Errorf("attempt 1's log: status %d, body %q", r.status, trunc(r.body))
	}
	if r := do(t, "GET", srv.URL+"/"+kLog, nil); r.status != 200 || string(r.body) != logText {
		t.Errorf("the latest log beside an attempt's: status %d, body %q", r.status, trunc(r.body))
	}
	for p, want := range map[string]int{kLog + ".2": http.StatusNotFound, kLog + ".0": http.StatusBadRequest, kLog + ".x": http.StatusBadRequest} {
		if r := do(t, "GET", srv.URL+"/"+p, nil); r.status != want {
			t.Errorf("GET /%s: status %d, want %d", p, r.status, want)
		}
	}

	// A corrupt stored log is an error, not a 200 with garbage; the raw bytes are still
	// served to a client that decompresses itself.
	if r := do(t, "GET", srv.URL+"/log/"+corrupt, nil); r.status != http.StatusBadGateway {
		t.Errorf("corrupt log: status %d, body %q; want 502", r.status, r.body)
	}
	if r := do(t, "GET", srv.URL+"/log/"+corrupt, http.Header{"Accept-Encoding": {"zstd"}}); r.status != 200 {
		t.Errorf("corrupt log as zstd: status %d", r.status)
	}
}

func drvBaseWith(name string) string { return "0" + h32[1:] + "-" + name + ".drv" }

func TestStoreErrorsAreNotLeaked(t *testing.T) {
	var logs bytes.Buffer
	store := newLocal(t)
	fill(t, store)
	srv, rec := serve(t, store, slog.New(slog.NewTextHandler(&logs, nil)))
	const secret = "dial tcp 10.1.2.3:9000: secret-bucket-credentials"
	rec.err = errors.New(secret)
	for _, path := range []string{"/" + kNarinfo, "/" + kListing, "/" + kNar, "/" + kLog} {
		for _, method := range []string{"GET", "HEAD"} {
			for _, accept := range []string{"", "zstd"} {
				r := do(t, method, srv.URL+path, http.Header{"Accept-Encoding": {accept}})
				if r.status != http.StatusBadGateway {
					t.Errorf("%s %s: status %d, want 502", method, path, r.status)
				}
				if bytes.Contains(r.body, []byte("secret")) || bytes.Contains(r.body, []byte("10.1.2.3")) {
					t.Errorf("%s %s: body leaks the error: %q", method, path, r.body)
				}
				if r.header.Get("Content-Encoding") != "" {
					t.Errorf("%s %s: error response has Content-Encoding %q", method, path, r.header.Get("Content-Encoding"))
				}
				if cc := r.header.Get("Cache-Control"); cc != "no-store" {
					t.Errorf("%s %s: Cache-Control %q, want no-store", method, path, cc)
				}
			}
		}
	}
	if !strings.Contains(logs.String(), secret) {
		t.Errorf("the store error was not logged:\n%s", logs.String())
	}
	// Wrapped ErrNotFound from a store is a 404.
	rec.err = errors.Join(errors.New("wrapped"), blob.ErrNotFound)
	if r := do(t, "GET", srv.URL+"/"+kNarinfo, nil); r.status != 404 {
		t.Errorf("wrapped ErrNotFound: status %d, want 404", r.status)
	}
}

func TestPriority(t *testing.T) {
	mux := http.NewServeMux()
	cache.New(cache.Config{Store: newLocal(t), Priority: 41}).Register(access.NewRoutes(mux, nil))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	r := do(t, "GET", srv.URL+"/nix-cache-info", nil)
	if want := "StoreDir: /nix/store\nWantMassQuery: 1\nPriority: 41\n"; string(r.body) != want {
		t.Errorf("nix-cache-info = %q, want %q", r.body, want)
	}
}
