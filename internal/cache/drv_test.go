package cache_test

import (
	"context"
	"crypto/sha256"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/cache"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// The .drv objects the signer keeps in the database are served like blob objects: the narinfo
// as stored and the NAR rendered from the .drv file, with the blob store's headers, GET and
// HEAD, with or without the narinfo memory cache; a miss falls through to the blob store.
func TestServesDerivationsFromTheDatabase(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	drvs := blob.NewDerivations(pool)
	const drvPath = "/nix/store/" + h32 + "-hello.drv"
	text := []byte(`Derive([("out","/nix/store/` + miss32 + `-hello","","")],[],[],"x86_64-linux","/bin/sh",[],[])`)
	nar := nix.FileNAR(text, false)
	sum := sha256.Sum256(nar)
	ni := &nix.NarInfo{StorePath: drvPath, URL: blob.DrvNARKey(sum), Compression: "none", FileHash: nix.FormatSHA256(sum),
		FileSize: int64(len(nar)), NarHash: nix.FormatSHA256(sum), NarSize: int64(len(nar)),
		CA: "text:" + nix.FormatSHA256(sha256.Sum256(text))}
	info, err := ni.MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := drvs.Put(context.Background(), []blob.Derivation{{StorePath: drvPath, NarInfo: info, Text: text, NarHash: sum, NarSize: int64(len(nar))}}); err != nil {
		t.Fatal(err)
	}
	// A blob narinfo under another hash: still served from the store behind.
	store := newLocal(t)
	put(t, store, miss32+".narinfo", []byte(narinfoBody))

	for _, memory := range []int64{0, cache.DefaultNarinfoCacheBytes} {
		mux := http.NewServeMux()
		cache.New(cache.Config{Store: store, Derivations: drvs, NarinfoCacheBytes: memory}).Register(access.NewRoutes(mux, nil))
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		for _, c := range []struct {
			method, path string
			status       int
			ctype, cc    string
			body         string
		}{
			{"GET", "/" + h32 + ".narinfo", 200, "text/x-nix-narinfo", "public, max-age=60", string(info)},
			{"GET", "/" + h32 + ".narinfo", 200, "text/x-nix-narinfo", "public, max-age=60", string(info)}, // from memory
			{"HEAD", "/" + h32 + ".narinfo", 200, "text/x-nix-narinfo", "public, max-age=60", string(info)},
			{"GET", "/" + ni.URL, 200, "application/x-nix-nar", "public, max-age=31536000, immutable", string(nar)},
			{"HEAD", "/" + ni.URL, 200, "application/x-nix-nar", "public, max-age=31536000, immutable", string(nar)},
			{"GET", "/" + miss32 + ".narinfo", 200, "text/x-nix-narinfo", "public, max-age=60", narinfoBody},
			{"GET", "/nar/" + miss52 + ".nar", 404, "", "public, max-age=5", ""},
		} {
			req, err := http.NewRequest(c.method, srv.URL+c.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			h := resp.Header
			if resp.StatusCode != c.status || h.Get("Cache-Control") != c.cc || (c.ctype != "" && h.Get("Content-Type") != c.ctype) {
				t.Errorf("memory %d: %s %s: %d %q %q, want %d %q %q", memory, c.method, c.path, resp.StatusCode,
					h.Get("Content-Type"), h.Get("Cache-Control"), c.status, c.ctype, c.cc)
				continue
			}
			if c.status != 200 {
				continue
			}
			if want := strconv.Itoa(len(c.body)); h.Get("Content-Length") != want {
				t.Errorf("memory %d: %s %s: Content-Length %q, want %s", memory, c.method, c.path, h.Get("Content-Length"), want)
			}
			if c.method == "GET" && string(body) != c.body {
				t.Errorf("memory %d: GET %s: body %q, want %q", memory, c.path, body, c.body)
			}
		}
	}
}
