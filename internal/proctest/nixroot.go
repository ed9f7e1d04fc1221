package proctest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// NixRoot is the Debian 13 root holding the second Nix the tests run against (Nix 2.26), which
// scripts/deps.sh makes and scripts/nix-root.sh enters: a test runs some of its processes there,
// with Nix 2.26 and a store of their own, beside others on this machine's Nix.
type NixRoot struct {
	Dir    string // the root
	script string // scripts/nix-root.sh
}

// DefaultNixRoot is where scripts/deps.sh makes the root unless HARMONIA_NIX_ROOT says.
const DefaultNixRoot = "/var/cache/harmonia-ci/debian13"

// RequireNixRoot returns the root, or skips t where it cannot be made here (with the reason
// scripts/deps.sh recorded). A root that is missing for another reason fails t on CI and skips
// it elsewhere, naming the command that makes it. Inside the root itself, t is skipped: such a
// test runs from the machine's own Nix.
func RequireNixRoot(t testing.TB) *NixRoot {
	t.Helper()
	if os.Getenv("HARMONIA_NIX_ROOT_INSIDE") != "" {
		t.Skip("runs from outside the Nix 2.26 root, with the machine's own Nix beside it")
	}
	dir := os.Getenv("HARMONIA_NIX_ROOT")
	if dir == "" {
		dir = DefaultNixRoot
	}
	_, file, _, _ := runtime.Caller(0)
	r := &NixRoot{Dir: dir, script: filepath.Join(filepath.Dir(file), "..", "..", "scripts", "nix-root.sh")}
	if _, err := os.Stat(filepath.Join(dir, ".harmonia-ci-root")); err == nil {
		return r
	}
	if why, err := os.ReadFile(dir + ".unavailable"); err == nil {
		t.Skipf("no Nix 2.26 root: it cannot be made here: %s", strings.TrimSpace(string(why)))
	}
	msg := "no Nix 2.26 root at " + dir + ": scripts/deps.sh nix-root makes it"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return nil
}

// Command runs argv in the root, with binds (directories seen there at the same paths) and env
// (NAME=VALUE) besides the root's fixed environment.
func (r *NixRoot) Command(binds, env []string, argv ...string) *exec.Cmd {
	args := []string{}
	for _, b := range binds {
		args = append(args, "--bind", b)
	}
	for _, e := range env {
		args = append(args, "--env", e)
	}
	args = append(append(args, "--"), argv...)
	return exec.Command(r.script, args...)
}

// Start runs the harmonia-ci binary in the root, as Start does here: binds are directories the
// process needs (its state, the database's socket, a chroot store), env its environment
// besides the root's. The binary's own directory is bound too.
func (r *NixRoot) Start(t testing.TB, name string, binds, env []string, args ...string) *Proc {
	t.Helper()
	bin := Binary(t)
	return start(t, name, r.Command(append(binds, filepath.Dir(bin)), env, append([]string{bin}, args...)...))
}
