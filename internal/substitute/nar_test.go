package substitute

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// TestFetchFromNixCaches reads caches written by real Nix, one per compression: the closure
// comes back complete and in dependency order, every NAR equals `nix-store --dump`, and the
// .drv reads back as its file.
func TestFetchFromNixCaches(t *testing.T) {
	c := realCaches(t)
	for _, comp := range compressions {
		t.Run(comp, func(t *testing.T) {
			srv := newCacheServer(t, http.FileServer(http.Dir(c.dirs[comp])))
			f := &Fetcher{Caches: []string{srv.URL}, Keys: []nix.PublicKey{c.key.Public()}}
			ctx := context.Background()
			found, err := f.Closure(ctx, []string{c.drv}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := slices.Sorted(slices.Values(paths(found))); !slices.Equal(got, c.closure) {
				t.Fatalf("Closure = %v, want %v", got, c.closure)
			}
			checkOrder(t, found, c.refs)
			var drv *Found
			for _, fd := range found {
				if fd.Cache != srv.URL || fd.Info.Compression != comp {
					t.Errorf("%s: cache %s, compression %q; want %s, %q", fd.Path(), fd.Cache, fd.Info.Compression, srv.URL, comp)
				}
				rc, err := f.OpenNAR(ctx, fd)
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(rc)
				rc.Close()
				if err != nil {
					t.Fatalf("read NAR of %s: %v", fd.Path(), err)
				}
				if !bytes.Equal(got, c.dump[fd.Path()]) {
					t.Errorf("NAR of %s: %d bytes that differ from nix-store --dump's %d", fd.Path(), len(got), len(c.dump[fd.Path()]))
				}
				if fd.Path() == c.drv {
					drv = fd
				}
			}

			want, err := os.ReadFile(c.drv)
			if err != nil {
				t.Fatal(err)
			}
			got, err := f.ReadFile(ctx, drv, int64(len(want)))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("ReadFile(%s) = %q, want %q", c.drv, got, want)
			}
			if _, err := f.ReadFile(ctx, drv, int64(len(want))-1); err == nil || !strings.Contains(err.Error(), "more than the limit") {
				t.Errorf("ReadFile with a limit one byte short: error = %v, want the limit", err)
			}
			tree := found[slices.IndexFunc(found, func(fd *Found) bool { return fd.Path() == c.tree })]
			if _, err := f.ReadFile(ctx, tree, 1<<20); err == nil || !strings.Contains(err.Error(), "NAR is a directory") {
				t.Errorf("ReadFile of a directory: error = %v, want one saying it is a directory", err)
			}
		})
	}
}

// TestOpenNARRejectsBadStreams serves NARs that differ from the signed narinfo and checks that
// reading them fails rather than ends, whatever the compression.
func TestOpenNARRejectsBadStreams(t *testing.T) {
	c := realCaches(t)
	flip := func(b []byte) []byte { b = bytes.Clone(b); b[len(b)/2] ^= 1; return b }
	tests := []struct {
		name        string
		compression string
		path        string // defaults to the tree, the largest NAR
		mutate      func([]byte) []byte
		wantErr     string // "" means success; "*" any error
	}{
		{name: "intact", compression: "none", mutate: slices.Clone[[]byte]},
		{name: "intact xz", compression: "xz", mutate: slices.Clone[[]byte]},
		{name: "flipped byte", compression: "none", mutate: flip, wantErr: "NAR hash is"},
		{name: "truncated", compression: "none", mutate: func(b []byte) []byte { return b[:len(b)-8] }, wantErr: "truncated: "},
		{name: "empty", compression: "none", mutate: func([]byte) []byte { return nil }, wantErr: "truncated: 0 of"},
		{name: "one byte too long", compression: "none", mutate: func(b []byte) []byte { return append(slices.Clone(b), 0) }, wantErr: "longer than its NarSize"},
		{name: "another path's NAR", compression: "none", path: "leaf", mutate: func([]byte) []byte { return c.dump[c.mid] }, wantErr: "*"},
		{name: "flipped byte xz", compression: "xz", mutate: flip, wantErr: "*"},
		{name: "flipped byte zstd", compression: "zstd", mutate: flip, wantErr: "*"},
		{name: "flipped byte bzip2", compression: "bzip2", mutate: flip, wantErr: "*"},
		{name: "truncated zstd", compression: "zstd", mutate: func(b []byte) []byte { return b[:len(b)/2] }, wantErr: "*"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := c.tree
			if tt.path == "leaf" {
				path = c.leaf
			}
			dir := c.dirs[tt.compression]
			keys := []nix.PublicKey{c.key.Public()}
			good := newCacheServer(t, http.FileServer(http.Dir(dir)))
			ctx := context.Background()
			found, err := (&Fetcher{Caches: []string{good.URL}, Keys: keys}).Lookup(ctx, path)
			if err != nil {
				t.Fatal(err)
			}
			data, err := os.ReadFile(filepath.Join(dir, found.Info.URL))
			if err != nil {
				t.Fatal(err)
			}
			data = tt.mutate(data)
			bad := newCacheServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Write(data)
			}))
			f := &Fetcher{Caches: []string{bad.URL}, Keys: keys}
			rc, err := f.OpenNAR(ctx, &Found{Cache: bad.URL, Info: found.Info})
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			got, err := io.ReadAll(rc)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("read: %v", err)
			case tt.wantErr == "" && !bytes.Equal(got, c.dump[path]):
				t.Fatalf("read %d bytes that differ from nix-store --dump", len(got))
			case tt.wantErr == "*" && err == nil, tt.wantErr != "" && tt.wantErr != "*" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("read: error = %v, want one containing %q", err, tt.wantErr)
			}
			if err != nil {
				// The error is sticky: a caller that reads on never sees a clean end.
				if _, again := rc.Read(make([]byte, 1)); again == nil || again == io.EOF {
					t.Errorf("read after %v: %v, want the error again", err, again)
				}
			}
		})
	}
}

// TestOpenNARStopsAtNarSize serves a NAR that never ends: reading must fail once the stream
// passes NarSize, not wait for the end.
func TestOpenNARStopsAtNarSize(t *testing.T) {
	c := realCaches(t)
	keys := []nix.PublicKey{c.key.Public()}
	good := newCacheServer(t, http.FileServer(http.Dir(c.dirs["none"])))
	ctx := context.Background()
	found, err := (&Fetcher{Caches: []string{good.URL}, Keys: keys}).Lookup(ctx, c.leaf)
	if err != nil {
		t.Fatal(err)
	}
	endless := newCacheServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := w.Write(c.dump[c.leaf]); err != nil {
			return
		}
		chunk := make([]byte, 32<<10)
		for {
			if _, err := w.Write(chunk); err != nil {
				return // the client hung up
			}
		}
	}))
	f := &Fetcher{Caches: []string{endless.URL}, Keys: keys}
	rc, err := f.OpenNAR(ctx, &Found{Cache: endless.URL, Info: found.Info})
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, rc)
	rc.Close()
	if err == nil || !strings.Contains(err.Error(), "longer than its NarSize") {
		t.Fatalf("read: error = %v, want one about NarSize", err)
	}
	if n > found.Info.NarSize {
		t.Errorf("read %d bytes before failing, more than NarSize %d", n, found.Info.NarSize)
	}
}

// TestOpenNARRefuses checks narinfos OpenNAR refuses before or instead of streaming.
func TestOpenNARRefuses(t *testing.T) {
	c := realCaches(t)
	keys := []nix.PublicKey{c.key.Public()}
	srv := newCacheServer(t, http.FileServer(http.Dir(c.dirs["none"])))
	ctx := context.Background()
	found, err := (&Fetcher{Caches: []string{srv.URL}, Keys: keys}).Lookup(ctx, c.leaf)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		edit    func(ni *nix.NarInfo)
		wantErr string
	}{
		{name: "unknown compression", edit: func(ni *nix.NarInfo) { ni.Compression = "lz4" }, wantErr: `unsupported compression "lz4"`},
		{name: "absolute URL", edit: func(ni *nix.NarInfo) { ni.URL = srv.URL + "/" + ni.URL }, wantErr: "only URLs relative to the cache"},
		{name: "rooted URL", edit: func(ni *nix.NarInfo) { ni.URL = "/" + ni.URL }, wantErr: "only URLs relative to the cache"},
		{name: "network-path URL", edit: func(ni *nix.NarInfo) { ni.URL = "//example.invalid/x.nar" }, wantErr: "only URLs relative to the cache"},
		{name: "missing NAR", edit: func(ni *nix.NarInfo) { ni.URL = "nar/missing.nar" }, wantErr: "404"},
		{name: "bad NarHash", edit: func(ni *nix.NarInfo) { ni.NarHash = "sha256:xyz" }, wantErr: "parse hash"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ni := *found.Info
			tt.edit(&ni)
			f := &Fetcher{Caches: []string{srv.URL}, Keys: keys}
			rc, err := f.OpenNAR(ctx, &Found{Cache: srv.URL, Info: &ni})
			if err == nil {
				rc.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("OpenNAR error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}
