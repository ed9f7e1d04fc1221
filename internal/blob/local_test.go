package blob_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
)

// files lists every entry under dir, relative to it.
func files(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestNewLocalRejectsShortSecret(t *testing.T) {
	if _, err := blob.NewLocal(t.TempDir(), "http://x", []byte("short")); err == nil {
		t.Fatal("NewLocal with a 5-byte secret = nil error")
	}
	if _, err := blob.NewLocal(t.TempDir(), "ftp://x", testSecret); err == nil {
		t.Fatal("NewLocal with an ftp upload base = nil error")
	}
}

// noRedirects is a client that shows redirects instead of following them.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// send PUTs (or whatever method says) body to target with content type ct and Content-Length
// cl (-1: none, the body is sent chunked), and returns the status and the error message.
func send(t *testing.T, method, target, ct string, cl int64, body []byte) (int, string) {
	t.Helper()
	var r io.Reader = bytes.NewReader(body)
	if cl < 0 {
		r = io.MultiReader(r) // of unknown length: net/http sends it chunked
	}
	req, err := http.NewRequest(method, target, r)
	if err != nil {
		t.Fatal(err)
	}
	if cl >= 0 {
		req.ContentLength = cl
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	resp, err := noRedirects.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	return resp.StatusCode, errorMessage(t, resp)
}

// errorMessage reads a response's body: the web package's {"error": msg} for an error.
func errorMessage(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	if resp.StatusCode < 400 || resp.StatusCode == http.StatusMethodNotAllowed {
		return string(b)
	}
	var e struct{ Error string }
	if err := json.Unmarshal(b, &e); err != nil || e.Error == "" || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("status %d with body %q (%s), want JSON {\"error\": ...}", resp.StatusCode, b, resp.Header.Get("Content-Type"))
	}
	return e.Error
}

// sendShort sends a PUT whose body ends before its Content-Length, which net/http clients
// cannot send, and returns the status and the error message.
func sendShort(t *testing.T, target, ct string, cl int64, body []byte) (int, string) {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "PUT %s HTTP/1.1\r\nHost: %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s",
		u.RequestURI(), u.Host, ct, cl, body)
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("short PUT: %v", err)
	}
	defer resp.Body.Close()
	return resp.StatusCode, errorMessage(t, resp)
}

// TestLocalUploadStatusCodes checks the handler's answers on a real HTTP server, including a
// client whose body ends before its Content-Length.
func TestLocalUploadStatusCodes(t *testing.T) {
	l := newLocal(t)
	ctx := context.Background()
	body := []byte("twelve bytes")
	sum := sha256.Sum256(body)
	key := narKey(body)
	u, err := l.PresignPut(ctx, key, int64(len(body)), sum[:], "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if ct := u.Headers.Get("Content-Type"); ct != "application/x-nix-nar" {
		t.Errorf("default content type %q", ct)
	}
	if !strings.Contains(u.URL, "size=12") {
		t.Fatalf("URL %s does not carry size=12", u.URL)
	}
	ct := u.Headers.Get("Content-Type")
	n := int64(len(body))
	for _, c := range []struct {
		name   string
		method string
		target string
		ct     string
		cl     int64
		body   []byte
		want   int
	}{
		{"no content-length", "PUT", u.URL, ct, -1, body, http.StatusLengthRequired},
		{"other content-length", "PUT", u.URL, ct, n - 1, body[:n-1], http.StatusBadRequest},
		{"no signature", "PUT", strings.Split(u.URL, "?")[0], ct, n, body, http.StatusForbidden},
		{"bad signature", "PUT", strings.Replace(u.URL, "sig=", "sig=00", 1), ct, n, body, http.StatusForbidden},
		{"other size", "PUT", strings.Replace(u.URL, "size=12", "size=5", 1), ct, 5, body[:5], http.StatusForbidden},
		{"other content type", "PUT", u.URL, "text/html", n, body, http.StatusForbidden},
		{"traversal in path", "PUT", strings.Replace(u.URL, "/api/blob/", "/api/blob/../../", 1), ct, n, body, http.StatusTemporaryRedirect}, // to the cleaned path, whose signature fails,
		{"encoded traversal", "PUT", strings.Replace(u.URL, "/api/blob/", "/api/blob/%2e%2e/%2e%2e/", 1), ct, n, body, http.StatusForbidden},
		{"GET", "GET", u.URL, ct, 0, nil, http.StatusMethodNotAllowed},
		{"correct", "PUT", u.URL, ct, n, body, http.StatusOK},
	} {
		code, msg := send(t, c.method, c.target, c.ct, c.cl, c.body)
		if code != c.want {
			t.Errorf("%s: %d %q, want %d", c.name, code, msg, c.want)
		}
		if c.name == "correct" {
			continue
		}
		if got := files(t, l.Dir()); len(got) != 0 {
			t.Fatalf("%s: files in store = %v, want none", c.name, got)
		}
		if c.name == "other content-length" {
			// The same lie, told by a client whose body ends early.
			if code, msg := sendShort(t, u.URL, ct, n, body[:5]); code != http.StatusBadRequest {
				t.Errorf("body shorter than its Content-Length: %d %q, want 400", code, msg)
			}
		}
	}
	if got := files(t, l.Dir()); len(got) != 1 || got[0] != key {
		t.Errorf("files in store = %v, want only %s (no temporary files)", got, key)
	}
}

// TestLocalUploadRefusals plays an attacker who holds upload URLs (from a leak, or their own
// signer with another secret) or nothing: the handler refuses every URL the signer would not
// have issued for that upload, and stores nothing.
func TestLocalUploadRefusals(t *testing.T) {
	ctx := context.Background()
	l, base := newLocalServer(t)
	// twin signs with the store's own secret, so its URLs differ from the store's only where
	// the test makes them; stranger signs with another secret.
	twin := openLocal(t, t.TempDir(), base, testSecret)
	stranger := openLocal(t, t.TempDir(), base, []byte("another secret, 32 bytes long..."))
	body := []byte("the bytes the attacker wants stored")
	sum := sha256.Sum256(body)
	size := int64(len(body))
	other := []byte("the bytes the signer signed for")
	logKey := "log/" + h32 + "-attack.drv"

	presign := func(s *blob.Local, key string, sum []byte, expiry time.Duration) blob.Upload {
		t.Helper()
		u, err := s.PresignPut(ctx, key, size, sum, "", expiry)
		if err != nil {
			t.Fatalf("PresignPut(%s): %v", key, err)
		}
		return u
	}
	// editKey points u at key instead; the signature covers the key it was made for.
	editKey := func(u blob.Upload, from, to string) blob.Upload {
		t.Helper()
		u.URL = strings.Replace(u.URL, "/api/blob/"+from+"?", "/api/blob/"+to+"?", 1)
		if !strings.Contains(u.URL, to) {
			t.Fatalf("%s not in %s", from, u.URL)
		}
		return u
	}
	// later is a twin whose clock runs ahead of the store's by d.
	later := func(d time.Duration) *blob.Local {
		s := openLocal(t, t.TempDir(), base, testSecret)
		blob.SetNow(s, func() time.Time { return time.Now().Add(d) })
		return s
	}
	for _, c := range []struct {
		name string
		key  string // what the attacker wants written
		u    blob.Upload
		want int
	}{
		// (a) Signed with another secret.
		{"narinfo signed with another secret", kNarinfo, presign(stranger, kNarinfo, sum[:], time.Minute), http.StatusForbidden},
		{"NAR signed with another secret", narKey(body), presign(stranger, narKey(body), sum[:], time.Minute), http.StatusForbidden},
		{"log signed with another secret", logKey, presign(stranger, logKey, sum[:], time.Minute), http.StatusForbidden},
		// (b) Correctly signed, but for objects that only the signer writes.
		{"narinfo", kNarinfo, presign(twin, kNarinfo, sum[:], time.Minute), http.StatusForbidden},
		{"listing", kListing, presign(twin, kListing, sum[:], time.Minute), http.StatusForbidden},
		{"realisation", kReal, presign(twin, kReal, sum[:], time.Minute), http.StatusForbidden},
		{"nix-cache-info", kCacheInfo, presign(twin, kCacheInfo, sum[:], time.Minute), http.StatusForbidden},
		{"log URL edited to a narinfo", kNarinfo, editKey(presign(l, logKey, sum[:], time.Minute), logKey, kNarinfo), http.StatusForbidden},
		{"log URL edited to a NAR", narKey(body), editKey(presign(l, logKey, sum[:], time.Minute), logKey, narKey(body)), http.StatusForbidden},
		// (c) A NAR key that is not the signed sum: whatever the body, the key would lie about it.
		{"NAR key of other bytes", narKey(other), blob.SignUnchecked(l, narKey(other), size, sum[:], "application/x-nix-nar", time.Now().Add(time.Minute)), http.StatusBadRequest},
		{"NAR key of other bytes, log type", narKey(other), blob.SignUnchecked(l, narKey(other), size, sum[:], blob.ContentTypeFor(logKey), time.Now().Add(time.Minute)), http.StatusBadRequest},
		// (d) Valid signatures, expiring beyond now + MaxURLExpiry (+ one minute of slack).
		{"NAR, expiry 1h from a clock 2 minutes ahead", narKey(body), presign(later(2*time.Minute), narKey(body), sum[:], blob.MaxURLExpiry), http.StatusForbidden},
		{"log, expiry 1h from a clock 1 hour ahead", logKey, presign(later(time.Hour), logKey, sum[:], blob.MaxURLExpiry), http.StatusForbidden},
		{"log, expiry in a week", logKey, blob.SignUnchecked(l, logKey, size, sum[:], blob.ContentTypeFor(logKey), time.Now().Add(7*24*time.Hour)), http.StatusForbidden},
		{"log, expired", logKey, blob.SignUnchecked(l, logKey, size, sum[:], blob.ContentTypeFor(logKey), time.Now().Add(-time.Second)), http.StatusForbidden},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, msg := upload(t, c.u, body)
			if code != c.want {
				t.Errorf("upload: %d %q, want %d", code, msg, c.want)
			} else {
				t.Logf("refused: %d %s", code, msg)
			}
			assertMissing(t, l, c.key)
			if got := files(t, l.Dir()); len(got) != 0 {
				t.Errorf("files in store = %v, want none", got)
			}
		})
	}
	// The refusals above are the URLs', not the bodies': the same requests within the rules
	// succeed, so a handler that refused everything would fail here.
	for _, c := range []struct {
		name string
		key  string
		u    blob.Upload
	}{
		{"NAR", narKey(body), presign(l, narKey(body), sum[:], time.Minute)},
		{"log", logKey, presign(twin, logKey, sum[:], time.Minute)},
		{"log, expiry 1h from a clock 30 s ahead", logKey, presign(later(30*time.Second), logKey, sum[:], blob.MaxURLExpiry)},
	} {
		t.Run("accepted/"+c.name, func(t *testing.T) {
			if code, msg := upload(t, c.u, body); code != http.StatusOK {
				t.Errorf("upload: %d %q, want 200", code, msg)
			}
			if got, _ := content(t, l, c.key); got != string(body) {
				t.Errorf("%s holds %q, want %q", c.key, got, body)
			}
		})
	}
}

// fileID is what changes when a file is written again.
type fileID struct {
	ino     uint64
	modTime time.Time
	size    int64
}

func statFile(t *testing.T, path string) fileID {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fileID{ino: fi.Sys().(*syscall.Stat_t).Ino, modTime: fi.ModTime(), size: fi.Size()}
}

// TestLocalNARWriteOnce: once a NAR is stored, nothing changes it through an upload: other bytes
// cannot be signed for its key, and the same bytes again are answered 200 without a write.
func TestLocalNARWriteOnce(t *testing.T) {
	ctx := context.Background()
	l := newLocal(t)
	body := []byte(strings.Repeat("the NAR ", 100))
	sum := sha256.Sum256(body)
	key := narKey(body)
	u, err := l.PresignPut(ctx, key, int64(len(body)), sum[:], "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if code, msg := upload(t, u, body); code != http.StatusOK {
		t.Fatalf("first upload: %d %s", code, msg)
	}
	path := filepath.Join(l.Dir(), filepath.FromSlash(key))
	// An old mtime, so that any rewrite shows even within the file system's time granularity.
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	before := statFile(t, path)

	// Other bytes, same length, under the NAR's key.
	evil := slices.Clone(body)
	evil[0] ^= 1
	evilSum := sha256.Sum256(evil)
	if u, err := l.PresignPut(ctx, key, int64(len(evil)), evilSum[:], "", time.Minute); err == nil {
		t.Errorf("PresignPut of other bytes under %s = %s, want a refusal (the sum is pinned by the key)", key, u.URL)
	}
	again, err := l.PresignPut(ctx, key, int64(len(body)), sum[:], "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		u    blob.Upload
		body []byte
		want int
	}{
		{"other bytes on the NAR's URL", u, evil, http.StatusBadRequest},
		{"other bytes on a URL signed for them", blob.SignUnchecked(l, key, int64(len(evil)), evilSum[:], "application/x-nix-nar", time.Now().Add(time.Minute)), evil, http.StatusBadRequest},
		{"the same bytes on the same URL", u, body, http.StatusOK},
		{"the same bytes on a new URL", again, body, http.StatusOK},
	} {
		code, msg := upload(t, c.u, c.body)
		if code != c.want {
			t.Errorf("%s: %d %q, want %d", c.name, code, msg, c.want)
		}
		if after := statFile(t, path); after != before {
			t.Errorf("%s: the NAR's file changed from %+v to %+v", c.name, before, after)
		}
		if got, _ := content(t, l, key); got != string(body) {
			t.Errorf("%s: the NAR holds %q", c.name, got)
		}
	}
	if got := files(t, l.Dir()); len(got) != 1 || got[0] != key {
		t.Errorf("files in store = %v, want only %s (no temporary files)", got, key)
	}
}

// TestLocalLogReplaced: a log is not write-once: a new build attempt's log replaces the old.
func TestLocalLogReplaced(t *testing.T) {
	ctx := context.Background()
	l := newLocal(t)
	key := "log/" + h32 + "-retried.drv"
	put(t, l, key, "attempt 1 failed")
	for _, body := range []string{"attempt 2 failed too", "attempt 3 succeeded"} {
		sum := sha256.Sum256([]byte(body))
		u, err := l.PresignPut(ctx, key, int64(len(body)), sum[:], "", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if code, msg := upload(t, u, []byte(body)); code != http.StatusOK {
			t.Fatalf("upload of %q: %d %s", body, code, msg)
		}
		if got, _ := content(t, l, key); got != body {
			t.Errorf("log holds %q, want %q", got, body)
		}
	}
}

// TestLocalNoEscapeThroughSymlink: a directory of the layout replaced by a symlink to
// elsewhere must not let writes land outside the store.
func TestLocalNoEscapeThroughSymlink(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	if err := os.Symlink(outside, filepath.Join(dir, "nar")); err != nil {
		t.Fatal(err)
	}
	l, err := blob.NewLocal(dir, "", testSecret)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Put(context.Background(), kNar, strings.NewReader("x"), 1, blob.PutOptions{}); err == nil {
		t.Error("Put through a symlink leaving the store = nil error")
	}
	if got := files(t, outside); len(got) != 0 {
		t.Errorf("files written outside the store: %v", got)
	}
}

func TestLocalListIgnoresStrayFiles(t *testing.T) {
	l := newLocal(t)
	put(t, l, kNarinfo, "x")
	for _, p := range []string{".tmp-123", "nar/.tmp-456", "README", "nar/notahash.nar.zst"} {
		full := filepath.Join(l.Dir(), p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte("stray"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := list(t, l, ""); len(got) != 1 || got[0] != kNarinfo+":1" {
		t.Errorf("List = %v, want only %s", got, kNarinfo)
	}
}

// A NAR cut short (a crash between its write and the signer's sync) is not kept as if it were
// whole: the next upload of the right bytes replaces it.
func TestLocalTruncatedNARIsReplaced(t *testing.T) {
	ctx := context.Background()
	l := newLocal(t)
	body := []byte(strings.Repeat("a whole NAR ", 100))
	sum := sha256.Sum256(body)
	key := narKey(body)
	path := filepath.Join(l.Dir(), filepath.FromSlash(key))
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, body[:10], 0o644); err != nil {
		t.Fatal(err)
	}
	u, err := l.PresignPut(ctx, key, int64(len(body)), sum[:], "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if code, msg := upload(t, u, body); code != http.StatusOK {
		t.Fatalf("upload: %d %s", code, msg)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, body) {
		t.Fatalf("the truncated NAR is still there (%d bytes)", len(got))
	}
}

func TestLocalSyncKeys(t *testing.T) {
	l := newLocal(t)
	put(t, l, kNarinfo, "narinfo")
	put(t, l, kNar, "nar")
	for _, c := range []struct {
		name    string
		keys    []string
		wantErr string // "" for success
	}{
		{"written objects", []string{kNar, kNarinfo}, ""},
		{"none", nil, ""},
		{"one never written", []string{kNar, kLog}, "blob: sync log"},
		{"not a key", []string{"../escape"}, "invalid"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := l.SyncKeys(context.Background(), c.keys)
			switch {
			case c.wantErr == "" && err != nil:
				t.Fatalf("SyncKeys(%q) = %v", c.keys, err)
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
				t.Fatalf("SyncKeys(%q) = %v; want an error containing %q", c.keys, err, c.wantErr)
			}
		})
	}
}
