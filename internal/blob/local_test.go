package blob_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
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

// TestLocalUploadStatusCodes checks the handler's answers, including a client whose body ends
// before its Content-Length (which net/http clients cannot send).
func TestLocalUploadStatusCodes(t *testing.T) {
	l := newLocal(t)
	ctx := context.Background()
	body := []byte("narinfo body")
	sum := sha256.Sum256(body)
	u, err := l.PresignPut(ctx, kNarinfo, int64(len(body)), sum[:], "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if ct := u.Headers.Get("Content-Type"); ct != "text/x-nix-narinfo" {
		t.Errorf("default content type %q", ct)
	}
	h := l.UploadHandler()
	serve := func(method, target string, ct string, cl int64, b []byte) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, target, bytes.NewReader(b))
		r.ContentLength = cl
		if ct != "" {
			r.Header.Set("Content-Type", ct)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
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
		{"lying content-length", "PUT", u.URL, ct, n, body[:5], http.StatusBadRequest},
		{"no content-length", "PUT", u.URL, ct, -1, body, http.StatusLengthRequired},
		{"no signature", "PUT", strings.Split(u.URL, "?")[0], ct, n, body, http.StatusForbidden},
		{"bad signature", "PUT", strings.Replace(u.URL, "sig=", "sig=00", 1), ct, n, body, http.StatusForbidden},
		{"other size", "PUT", strings.Replace(u.URL, "size=12", "size=5", 1), ct, 5, body[:5], http.StatusForbidden},
		{"traversal in path", "PUT", strings.Replace(u.URL, "/api/blob/", "/api/blob/../../", 1), ct, n, body, http.StatusTemporaryRedirect}, // to the cleaned path, whose signature fails,
		{"encoded traversal", "PUT", strings.Replace(u.URL, "/api/blob/", "/api/blob/%2e%2e/%2e%2e/", 1), ct, n, body, http.StatusForbidden},
		{"GET", "GET", u.URL, ct, 0, nil, http.StatusMethodNotAllowed},
		{"correct", "PUT", u.URL, ct, n, body, http.StatusOK},
	} {
		w := serve(c.method, c.target, c.ct, c.cl, c.body)
		if w.Code != c.want {
			t.Errorf("%s: %d %q, want %d", c.name, w.Code, w.Body.String(), c.want)
		}
	}
	if got := files(t, l.Dir()); len(got) != 1 || got[0] != kNarinfo {
		t.Errorf("files in store = %v, want only %s (no temporary files)", got, kNarinfo)
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
