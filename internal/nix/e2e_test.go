package nix

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// addTestPaths puts a small closure into the local Nix store and returns it in dependency
// order: a directory tree added with nix-store --add (no references), and a text file x that
// references another text file y.
func addTestPaths(t *testing.T) []string {
	t.Helper()
	tree := runNix(t, "nix-store", "--add", makeTree(t))
	x := strings.Trim(runNix(t, "nix-instantiate", "--read-write-mode", "--eval", "-E",
		`builtins.toFile "harmonia-test-x" "refers to ${builtins.toFile "harmonia-test-y" "leaf"}"`), `"`)
	refs := strings.Fields(runNix(t, "nix-store", "-q", "--references", x))
	if len(refs) != 1 {
		t.Fatalf("%s references %v, want exactly one path", x, refs)
	}
	return []string{tree, refs[0], x}
}

// pushToCache writes paths into dir as a zstd binary cache the way harmonia-ci's cache will:
// CompressNAR into nar/<filehash>.nar.zst, then a signed narinfo. CA is deliberately left out:
// Nix accepts content-addressed paths without any signature, which would make the wrong-key
// checks below vacuous.
func pushToCache(t *testing.T, dir string, key SecretKey, paths []string) {
	t.Helper()
	writeFile(t, filepath.Join(dir, "nix-cache-info"), []byte("StoreDir: /nix/store\nWantMassQuery: 1\nPriority: 30\n"), 0o644)
	if err := os.MkdirAll(filepath.Join(dir, "nar"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		sp, err := ParseStorePath(p)
		if err != nil {
			t.Fatal(err)
		}
		tmp, err := os.CreateTemp(filepath.Join(dir, "nar"), "upload-*")
		if err != nil {
			t.Fatal(err)
		}
		sizes, err := CompressNAR(context.Background(), p, tmp)
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
		url := NarURL(sizes.FileHash)
		if err := os.Rename(tmp.Name(), filepath.Join(dir, url)); err != nil {
			t.Fatal(err)
		}
		var refs []string
		for _, r := range strings.Fields(runNix(t, "nix-store", "-q", "--references", p)) {
			rsp, err := ParseStorePath(r)
			if err != nil {
				t.Fatal(err)
			}
			refs = append(refs, rsp.Base())
		}
		ni := NewNarInfo(p, sizes, refs)
		if err := ni.Sign(key); err != nil {
			t.Fatal(err)
		}
		text, err := ni.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, sp.Hash+".narinfo"), text, 0o644)
	}
}

// substitute asks a fresh chroot store to realise paths from the cache at url.
func substitute(t *testing.T, url, trusted string, paths []string) (store, stderr string, err error) {
	t.Helper()
	store = writableTempDir(t)
	args := append([]string{"--store", store, "-r"}, paths...)
	args = append(args, "--option", "require-sigs", "true", "--option", "trusted-public-keys", trusted,
		"--option", "substituters", url)
	_, stderr, err = tryNix(t, "nix-store", args...)
	return store, stderr, err
}

func TestSubstituteFromOurCache(t *testing.T) {
	paths := addTestPaths(t)
	key, err := GenerateKey("harmonia-e2e-1")
	if err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	pushToCache(t, cache, key, paths)
	srv := httptest.NewServer(http.FileServer(http.Dir(cache)))
	defer srv.Close()

	store, stderr, err := substitute(t, srv.URL, key.Public().String(), paths)
	if err != nil {
		t.Fatalf("nix-store -r from our cache failed: %v\n%s", err, stderr)
	}
	for _, p := range paths {
		got := filepath.Join(store, p)
		hash, _, err := HashNAR(got)
		if err != nil {
			t.Fatalf("substituted path missing: %v", err)
		}
		if want, _, _ := HashNAR(p); hash != want {
			t.Errorf("%s substituted with NAR hash %s, want %s", p, hash, want)
		}
	}

	sameName, err := GenerateKey("harmonia-e2e-1")
	if err != nil {
		t.Fatal(err)
	}
	otherName, err := GenerateKey("harmonia-e2e-2")
	if err != nil {
		t.Fatal(err)
	}
	for name, trusted := range map[string]string{
		"other key with the same name": sameName.Public().String(),
		"other key name":               otherName.Public().String(),
	} {
		t.Run(name, func(t *testing.T) {
			store, stderr, err := substitute(t, srv.URL, trusted, paths)
			if err == nil {
				t.Fatalf("nix-store -r succeeded with untrusted signatures\n%s", stderr)
			}
			// Nix 2.8: "… is not signed by any of the keys in …"; 2.26: "ignoring substitute for …,
			// as it's not signed by any of the keys in …".
			if !strings.Contains(stderr, "not signed by any of the keys in 'trusted-public-keys'") {
				t.Errorf("nix-store -r failed, but not for the signature:\n%s", stderr)
			}
			if _, err := os.Lstat(filepath.Join(store, paths[0])); err == nil {
				t.Errorf("%s was substituted despite the bad signature", paths[0])
			}
		})
	}
}
