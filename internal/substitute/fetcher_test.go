package substitute

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// TestLookup asks for a path real Nix copied to a cache, through lists of caches that lack it
// or serve something unusable in its place: the first usable cache wins, and when there is
// none the error gives each cache's reason and wraps ErrNotFound only if every answer was
// definite.
func TestLookup(t *testing.T) {
	c := realCaches(t)
	midNarinfo, err := os.ReadFile(filepath.Join(c.dirs["none"], hashPart(t, c.mid)+".narinfo"))
	if err != nil {
		t.Fatal(err)
	}
	body := func(b []byte) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(b) })
	}
	handlers := map[string]http.Handler{
		"nix":       http.FileServer(http.Dir(c.dirs["none"])),
		"xz":        http.FileServer(http.Dir(c.dirs["xz"])),
		"empty":     http.NotFoundHandler(),
		"untrusted": http.FileServer(http.Dir(c.untrusted)),
		"broken": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "oops", http.StatusInternalServerError)
		}),
		"forbidden": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "no", http.StatusForbidden)
		}),
		"garbage":    body([]byte("hello\n")),
		"other path": body(midNarinfo), // validly signed, but for mid
		"huge":       body(append(bytes.Clone(midNarinfo), bytes.Repeat([]byte("X: y\n"), MaxNarinfoSize/5)...)),
	}
	tests := []struct {
		name         string
		caches       []string // handler names
		wantCache    int      // index of the cache that supplies the path
		wantErr      []string // substrings of the error; none means success
		wantNotFound bool
	}{
		{name: "first cache", caches: []string{"nix", "xz"}, wantCache: 0},
		{name: "404 then found", caches: []string{"empty", "xz"}, wantCache: 1},
		{name: "untrusted key then found", caches: []string{"untrusted", "nix"}, wantCache: 1},
		{name: "server error then found", caches: []string{"broken", "nix"}, wantCache: 1},
		{name: "garbage then found", caches: []string{"garbage", "nix"}, wantCache: 1},
		{name: "other path then found", caches: []string{"other path", "nix"}, wantCache: 1},
		{name: "404", caches: []string{"empty"}, wantErr: []string{"no cache has a validly signed narinfo", "not found"}, wantNotFound: true},
		{name: "untrusted key", caches: []string{"untrusted"}, wantErr: []string{"not signed by any trusted key"}, wantNotFound: true},
		{name: "other path", caches: []string{"other path"}, wantErr: []string{"narinfo is for StorePath " + c.mid}, wantNotFound: true},
		{name: "garbage", caches: []string{"garbage"}, wantErr: []string{"parse narinfo"}, wantNotFound: true},
		{name: "huge", caches: []string{"huge"}, wantErr: []string{"larger than"}, wantNotFound: true},
		{name: "every reason", caches: []string{"empty", "untrusted", "garbage"},
			wantErr: []string{"not found", "not signed", "parse narinfo"}, wantNotFound: true},
		{name: "no caches", wantErr: []string{"no caches configured"}, wantNotFound: true},
		{name: "server error", caches: []string{"empty", "broken"}, wantErr: []string{"not found", "500 Internal Server Error"}},
		{name: "forbidden", caches: []string{"forbidden"}, wantErr: []string{"403 Forbidden"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var urls []string
			for _, name := range tt.caches {
				urls = append(urls, newCacheServer(t, handlers[name]).URL)
			}
			f := &Fetcher{Caches: urls, Keys: []nix.PublicKey{c.key.Public()}}
			found, err := f.Lookup(context.Background(), c.top)
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if found.Cache != urls[tt.wantCache] || found.Path() != c.top {
					t.Errorf("Lookup = %s from %s, want %s from %s", found.Path(), found.Cache, c.top, urls[tt.wantCache])
				}
				return
			}
			if err == nil {
				t.Fatalf("Lookup found %s at %s, want an error", found.Path(), found.Cache)
			}
			t.Logf("error: %v", err)
			for _, want := range append([]string{c.top}, tt.wantErr...) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Lookup error = %v, want it to contain %q", err, want)
				}
			}
			if errors.Is(err, ErrNotFound) != tt.wantNotFound {
				t.Errorf("errors.Is(%v, ErrNotFound) = %v, want %v", err, !tt.wantNotFound, tt.wantNotFound)
			}
		})
	}
}

// TestLookupRefusesBadInput checks that malformed store paths and configurations are refused
// before any request, and never as ErrNotFound.
func TestLookupRefusesBadInput(t *testing.T) {
	srv := newCacheServer(t, http.NotFoundHandler())
	key, err := nix.GenerateKey("test-1")
	if err != nil {
		t.Fatal(err)
	}
	good := "/nix/store/" + strings.Repeat("a", 32) + "-hello"
	tests := []struct {
		name    string
		caches  []string
		keys    []nix.PublicKey
		path    string
		wantErr string
	}{
		{name: "not in the store", path: "/etc/passwd", wantErr: "not in /nix/store"},
		{name: "dot dot", path: "/nix/store/../../etc/passwd", wantErr: "parse store path"},
		{name: "fragment in path", path: "/nix/store/" + strings.Repeat("a", 32) + "-x#y", wantErr: "invalid character"},
		{name: "bad hash", path: "/nix/store/" + strings.Repeat("e", 32) + "-hello", wantErr: "invalid hash part"},
		{name: "subpath", path: good + "/bin/hello", wantErr: "invalid character"},
		{name: "no keys", keys: []nix.PublicKey{}, path: good, wantErr: "no trusted public keys"},
		{name: "bad cache URL", caches: []string{"ftp://example.invalid"}, path: good, wantErr: "want http(s)://host"},
		{name: "cache URL with query", caches: []string{srv.URL + "?x=1"}, path: good, wantErr: "want http(s)://host"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &Fetcher{Caches: []string{srv.URL}, Keys: []nix.PublicKey{key.Public()}}
			if tt.caches != nil {
				f.Caches = tt.caches
			}
			if tt.keys != nil {
				f.Keys = tt.keys
			}
			_, err := f.Lookup(context.Background(), tt.path)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("Lookup(%q) error = %v, want one containing %q", tt.path, err, tt.wantErr)
			}
			if errors.Is(err, ErrNotFound) {
				t.Errorf("Lookup(%q) error %v wraps ErrNotFound", tt.path, err)
			}
		})
	}
	if got := srv.asked(); len(got) != 0 {
		t.Errorf("narinfos asked for = %v, want none", got)
	}
}
