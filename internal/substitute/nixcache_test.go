package substitute

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
)

// compressions are the narinfo Compression values the tests have real Nix write.
var compressions = []string{"none", "xz", "zstd", "bzip2"}

// nixCaches is a small closure in the local Nix store, copied by real Nix into one binary cache
// per compression, all signed by key, and once more into a cache signed by an untrusted key.
// The closure is drv → top → {mid → leaf, tree}: a .drv whose input source is a text file
// referring to another text file and to a directory tree.
type nixCaches struct {
	key                       nix.SecretKey
	drv, top, mid, leaf, tree string
	closure                   []string            // all five, sorted
	refs                      map[string][]string // nix-store -q --references, without the path itself
	dump                      map[string][]byte   // nix-store --dump
	dirs                      map[string]string   // compression → cache directory
	untrusted                 string              // cache directory (compression none) signed by another key
}

var (
	cachesOnce sync.Once
	cachesVal  *nixCaches
	cachesErr  error
	// fixtureDir holds the caches; TestMain removes it.
	fixtureDir string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if fixtureDir != "" {
		os.RemoveAll(fixtureDir)
	}
	os.Exit(code)
}

// realCaches returns the caches, made by real Nix on first use. The fixture is shared by the
// whole test binary because each `nix copy` costs a few hundred milliseconds.
func realCaches(t *testing.T) *nixCaches {
	t.Helper()
	nixtest.RequireNix(t)
	cachesOnce.Do(func() { cachesVal, cachesErr = makeCaches() })
	if cachesErr != nil {
		t.Fatal(cachesErr)
	}
	return cachesVal
}

func makeCaches() (*nixCaches, error) {
	dir, err := os.MkdirTemp("", "substitute-test-")
	if err != nil {
		return nil, err
	}
	fixtureDir = dir
	env := &nixEnv{cacheHome: filepath.Join(dir, "xdg")}
	c := &nixCaches{refs: map[string][]string{}, dump: map[string][]byte{}, dirs: map[string]string{}}

	// Deterministic contents, so that reruns reuse the same store paths.
	tree := filepath.Join(dir, "harmonia-substitute-tree")
	var big bytes.Buffer
	for i := range 20000 {
		fmt.Fprintf(&big, "line %d %x\n", i, i*i*2654435761)
	}
	for name, f := range map[string]struct {
		data string
		mode os.FileMode
	}{
		"big.txt":         {big.String(), 0o644},
		"bin/run":         {"#!/bin/sh\necho hi\n", 0o755},
		"share/doc/empty": {"", 0o644},
	} {
		p := filepath.Join(tree, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(p, []byte(f.data), f.mode); err != nil {
			return nil, err
		}
		if err := os.Chmod(p, f.mode); err != nil {
			return nil, err
		}
	}
	if err := os.Symlink("bin/run", filepath.Join(tree, "link")); err != nil {
		return nil, err
	}
	if c.tree, err = env.run("nix-store", "--add", tree); err != nil {
		return nil, err
	}
	expr := `let
  leaf = builtins.toFile "harmonia-substitute-leaf" "leaf";
  mid = builtins.toFile "harmonia-substitute-mid" "mid refers to ${leaf}";
  top = builtins.toFile "harmonia-substitute-top" "top refers to ${mid} and ${builtins.storePath "` + c.tree + `"}";
in derivation {
  name = "harmonia-substitute";
  system = builtins.currentSystem;
  builder = "/bin/sh";
  args = [ "-c" "echo ${top} > $out" ];
}`
	if c.drv, err = env.run("nix-instantiate", "-E", expr); err != nil {
		return nil, err
	}
	closure, err := env.run("nix-store", "-qR", c.drv)
	if err != nil {
		return nil, err
	}
	c.closure = slices.Sorted(slices.Values(strings.Fields(closure)))
	for _, p := range c.closure {
		switch {
		case strings.HasSuffix(p, "-harmonia-substitute-top"):
			c.top = p
		case strings.HasSuffix(p, "-harmonia-substitute-mid"):
			c.mid = p
		case strings.HasSuffix(p, "-harmonia-substitute-leaf"):
			c.leaf = p
		}
		refs, err := env.run("nix-store", "-q", "--references", p)
		if err != nil {
			return nil, err
		}
		c.refs[p] = slices.DeleteFunc(strings.Fields(refs), func(r string) bool { return r == p })
		var out bytes.Buffer
		if err := env.cmd(&out, "nix-store", "--dump", p).Run(); err != nil {
			return nil, fmt.Errorf("nix-store --dump %s: %w", p, err)
		}
		c.dump[p] = out.Bytes()
	}
	if len(c.closure) != 5 || c.top == "" || c.mid == "" || c.leaf == "" {
		return nil, fmt.Errorf("closure of %s is %v, want five paths", c.drv, c.closure)
	}

	if c.key, err = nix.GenerateKey("harmonia-substitute-test-1"); err != nil {
		return nil, err
	}
	untrusted, err := nix.GenerateKey("harmonia-substitute-untrusted-1")
	if err != nil {
		return nil, err
	}
	copyTo := func(name, compression string, key nix.SecretKey) (string, error) {
		keyFile := filepath.Join(dir, key.Name+".sec")
		if err := key.WriteFile(keyFile, true); err != nil {
			return "", err
		}
		cache := filepath.Join(dir, name)
		_, err := env.run("nix", "copy", "--derivation", "--to",
			"file://"+cache+"?compression="+compression+"&secret-key="+keyFile, c.drv)
		return cache, err
	}
	for _, comp := range compressions {
		if c.dirs[comp], err = copyTo("cache-"+comp, comp, c.key); err != nil {
			return nil, err
		}
	}
	if c.untrusted, err = copyTo("cache-untrusted", "none", untrusted); err != nil {
		return nil, err
	}
	return c, nil
}

// nixEnv runs Nix offline against the local store, with its caches in a private directory.
type nixEnv struct{ cacheHome string }

func (e *nixEnv) cmd(stdout *bytes.Buffer, bin string, args ...string) *exec.Cmd {
	args = append([]string{"--option", "substituters", "", "--option", "build-users-group", ""}, args...)
	if bin == "nix" {
		args = append([]string{"--extra-experimental-features", "nix-command"}, args...)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+e.cacheHome, "NIX_REMOTE=")
	cmd.Stdout = stdout
	return cmd
}

// run runs a Nix command and returns its trimmed standard output.
func (e *nixEnv) run(bin string, args ...string) (string, error) {
	var out, stderr bytes.Buffer
	cmd := e.cmd(&out, bin, args...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %w\n%s", bin, strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(out.String()), nil
}

// hashPart returns the hash part of a store path, which names its narinfo.
func hashPart(t *testing.T, p string) string {
	t.Helper()
	sp, err := nix.ParseStorePath(p)
	if err != nil {
		t.Fatal(err)
	}
	return sp.Hash
}

// cacheServer serves a binary cache and records which narinfos were asked for.
type cacheServer struct {
	*httptest.Server
	mu       sync.Mutex
	narinfos []string // hash parts, in request order
}

// newCacheServer serves h, answering 404 for the narinfos of the hidden store paths.
func newCacheServer(t *testing.T, h http.Handler, hidden ...string) *cacheServer {
	t.Helper()
	hide := map[string]bool{}
	for _, p := range hidden {
		hide[hashPart(t, p)+".narinfo"] = true
	}
	s := &cacheServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(r.URL.Path, "/")
		if hash, ok := strings.CutSuffix(name, ".narinfo"); ok {
			s.mu.Lock()
			s.narinfos = append(s.narinfos, hash)
			s.mu.Unlock()
		}
		if hide[name] {
			http.NotFound(w, r)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

// asked returns the hash parts of the narinfos asked for so far, sorted.
func (s *cacheServer) asked() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(slices.Values(s.narinfos))
}

// hashParts returns the sorted hash parts of store paths.
func hashParts(t *testing.T, paths ...string) []string {
	t.Helper()
	out := make([]string, 0, len(paths))
	for _, p := range paths {
		out = append(out, hashPart(t, p))
	}
	slices.Sort(out)
	return out
}

// checkOrder fails unless every path in got comes after each of its references (refs, full
// paths) that is in got.
func checkOrder(t *testing.T, got []*Found, refs map[string][]string) {
	t.Helper()
	pos := map[string]int{}
	for i, f := range got {
		pos[f.Path()] = i
	}
	for i, f := range got {
		for _, r := range refs[f.Path()] {
			if j, ok := pos[r]; ok && j > i {
				t.Errorf("%s (position %d) comes before its reference %s (position %d)", f.Path(), i, r, j)
			}
		}
	}
}

// paths returns the store paths of found, in order.
func paths(found []*Found) []string {
	out := make([]string, len(found))
	for i, f := range found {
		out[i] = f.Path()
	}
	return out
}
