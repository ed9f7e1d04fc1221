package nix

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// nixOpts keep every Nix invocation offline and quiet: no default substituter (network
// retries), no build-users group (absent on a bare nix-bin install).
var nixOpts = []string{"--option", "substituters", "", "--option", "build-users-group", ""}

// requireNix fails (never skips) without Nix: the cross-checks against real Nix are the point
// of these tests, and CI installs it.
func requireNix(t *testing.T) {
	t.Helper()
	for _, bin := range []string{"nix-store", "nix", "nix-instantiate"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not found on PATH: these tests cross-check against real Nix; install the Debian package nix-bin (apt-get install nix-bin)", bin)
		}
	}
}

// runNix runs a Nix command with its caches in a per-test directory and returns trimmed stdout.
func runNix(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, stderr, err := tryNix(t, bin, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\nstderr:\n%s", bin, strings.Join(args, " "), err, stderr)
	}
	return out
}

// tryNix is runNix for commands that are expected to fail.
func tryNix(t *testing.T, bin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	requireNix(t)
	// nixOpts go first so that a test's own --option (e.g. substituters) overrides them.
	args = append(slices.Clone(nixOpts), args...)
	if bin == "nix" {
		args = append([]string{"--extra-experimental-features", "nix-command"}, args...)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+nixCacheHome(t), "NIX_REMOTE=")
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return strings.TrimSpace(o.String()), e.String(), err
}

var (
	nixCacheMu    sync.Mutex
	nixCacheHomes = map[*testing.T]string{}
)

// nixCacheHome isolates Nix's narinfo disk cache per test, so that one test's negative lookup
// of a URL can never answer another's.
func nixCacheHome(t *testing.T) string {
	nixCacheMu.Lock()
	defer nixCacheMu.Unlock()
	if d, ok := nixCacheHomes[t]; ok {
		return d
	}
	d := writableTempDir(t)
	nixCacheHomes[t] = d
	t.Cleanup(func() {
		nixCacheMu.Lock()
		delete(nixCacheHomes, t)
		nixCacheMu.Unlock()
	})
	return d
}

// writableTempDir is t.TempDir for directories Nix may fill with read-only store paths: it
// restores write permission before the test framework removes the tree (needed when not root).
func writableTempDir(t *testing.T) string {
	d := t.TempDir()
	t.Cleanup(func() {
		filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				os.Chmod(p, 0o755)
			}
			return nil
		})
	})
	return d
}

func writeFile(t *testing.T, path string, data []byte, perm fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, perm); err != nil {
		t.Fatal(err)
	}
	// WriteFile's mode is filtered by the umask; the NAR depends on the exact x bits.
	if err := os.Chmod(path, perm); err != nil {
		t.Fatal(err)
	}
}
