// Package nixtest makes Nix projects for tests and benchmarks: git repositories holding
// generated expressions of trivial /bin/sh derivations, which real Nix evaluates and builds
// offline.
package nixtest

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/nixgen"
)

// RequireNix skips t when Nix is not installed (scripts/deps.sh installs it for `make test`).
func RequireNix(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("nix-instantiate"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("nix-instantiate not found; scripts/deps.sh test installs nix-bin")
		}
		t.Skip("nix-instantiate not found")
	}
}

// Repo is a git repository in a temporary directory.
type Repo struct {
	t   testing.TB
	Dir string
}

// NewRepo creates an empty repository whose default branch is main.
func NewRepo(t testing.TB) *Repo {
	t.Helper()
	r := &Repo{t: t, Dir: t.TempDir()}
	r.Git("init", "-q", "-b", "main")
	return r
}

// Git runs git in the repository and returns its trimmed output.
func (r *Repo) Git(args ...string) string {
	r.t.Helper()
	out, err := Git(r.Dir, args...)
	if err != nil {
		r.t.Fatal(err)
	}
	return out
}

// Git runs git in dir with a fixed identity and no user configuration.
func Git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=test", "GIT_AUTHOR_EMAIL=test@example.invalid",
		"GIT_COMMITTER_NAME=test", "GIT_COMMITTER_EMAIL=test@example.invalid")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("git %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// Commit writes files (path → content; "" deletes) and commits them, returning the commit.
func (r *Repo) Commit(msg string, files map[string]string) string {
	r.t.Helper()
	for name, content := range files {
		p := filepath.Join(r.Dir, name)
		if content == "" {
			if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
				r.t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			r.t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			r.t.Fatal(err)
		}
	}
	r.Git("add", "-A")
	r.Git("commit", "-q", "--allow-empty", "-m", msg)
	return r.Git("rev-parse", "HEAD")
}

// Lib is nixgen.Lib: a Nix prelude defining mk and fail.
func Lib(salt string) string { return nixgen.Lib(salt) }

// Layered is nixgen.Layered: n derivations in layers of width.
func Layered(salt string, n, width int) string { return nixgen.Layered(salt, n, width) }

// LockFlake writes the flake.lock of the flake in the repository, as `nix flake lock` of the Nix
// on PATH writes it (the lock file's form differs between Nix versions), and commits it,
// returning the commit.
func (r *Repo) LockFlake() string {
	r.t.Helper()
	cmd := exec.Command("nix", "--extra-experimental-features", "nix-command flakes", "flake", "lock",
		"--option", "substituters", "")
	cmd.Dir = r.Dir
	cmd.Env = append(os.Environ(), "HOME="+r.t.TempDir(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		r.t.Fatalf("nix flake lock: %v\n%s", err, out)
	}
	return r.Commit("lock", nil)
}

// WritableTempDir is t.TempDir for trees Nix fills with read-only store paths: made writable
// again before the test's cleanup removes it.
func WritableTempDir(t testing.TB) string {
	d := t.TempDir()
	t.Cleanup(func() {
		_ = filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				_ = os.Chmod(p, 0o755)
			}
			return nil
		})
	})
	return d
}

// Offline runs a Nix command (bin: nix-store, nix, …) with no default substituter and no
// build-users group (absent on a bare nix-bin install), and a private narinfo disk cache. A
// test's own --option substituters comes later and wins. Without Nix it fails in CI and skips
// elsewhere, as RequireNix.
func Offline(t testing.TB, bin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	RequireNix(t)
	args = append([]string{"--option", "substituters", "", "--option", "build-users-group", ""}, args...)
	if bin == "nix" {
		args = append([]string{"--extra-experimental-features", "nix-command"}, args...)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+WritableTempDir(t), "NIX_REMOTE=")
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return strings.TrimSpace(o.String()), e.String(), err
}
