package builder

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixgen"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
)

// niceOf reads the nice value of a process from /proc/<pid>/stat (its 19th field; the command
// name, field 2, holds no spaces here).
func niceOf(t *testing.T, stat string) int {
	t.Helper()
	fields := strings.Fields(stat)
	if len(fields) < 19 {
		t.Fatalf("a stat line of %d fields: %q", len(fields), stat)
	}
	n, err := strconv.Atoi(fields[18])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// buildOut builds drvPath in the chroot store root through ss and returns its out file.
func buildOut(t *testing.T, ss *Session, root, drvPath string) string {
	t.Helper()
	drv, err := nix.ReadDerivation(root, drvPath)
	if err != nil {
		t.Fatal(err)
	}
	outs, err := ss.Build(storeTestCtx(t), drvPath, drv, nil, BuildLimits{}, &storeTestLog{})
	if err != nil {
		t.Fatal(err)
	}
	out, err := os.ReadFile(filepath.Join(root, outs["out"]))
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// Builds run at the store's nice value, below the node's own work, whatever the node's is.
func TestBuildsRunAtTheStoresNice(t *testing.T) {
	nixtest.RequireNix(t)
	t.Parallel()
	self, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	own := niceOf(t, string(self))
	root := t.TempDir()
	// The builder writes its own stat line: only shell built-ins exist in the sandbox.
	expr := nixgen.Lib(storeTestSalt(t)) + ` let
  stat = name: builtins.derivation {
    inherit name;
    system = builtins.currentSystem;
    builder = "/bin/sh";
    args = [ "-c" "read -r line < /proc/$$/stat; echo \"$line\" > $out" ];
  };
in { nice0 = stat "nice0"; nice7 = stat "nice7"; }`
	drvs := storeTestInstantiate(t, root, expr, "nice0", "nice7")
	for _, nice := range []int{0, 7} {
		drvPath := drvs[fmt.Sprint("nice", nice)]
		t.Run(fmt.Sprint("nice ", nice), func(t *testing.T) {
			want := min(own+nice, 19)
			var daemon int
			s := &Store{Root: root, Nice: nice, onStart: func(pid int) { daemon = pid }}
			ss := storeTestOpen(t, s)
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", daemon))
			if err != nil {
				t.Fatal(err)
			}
			if got := niceOf(t, string(stat)); got != want {
				t.Errorf("the daemon runs at nice %d; want %d", got, want)
			}
			if got := niceOf(t, buildOut(t, ss, root, drvPath)); got != want {
				t.Errorf("the build ran at nice %d; want %d", got, want)
			}
		})
	}
}

// Builds run in the store's cgroup, which PrepareCgroup gave a low CPU weight, though Nix starts
// each in a session of its own.
func TestBuildsRunInTheStoresCgroup(t *testing.T) {
	nixtest.RequireNix(t)
	t.Parallel()
	parent := WritableCPUCgroup()
	if parent == "" {
		t.Skip("no writable cgroup hierarchy with the cpu controller (needs root)")
	}
	cg := filepath.Join(parent, fmt.Sprintf("harmonia-test-%d", os.Getpid()))
	if err := PrepareCgroup(cg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(cg) }) // after the session's cleanup: its daemon is gone
	for _, w := range []struct{ file, want string }{{"cpu.shares", cgroupSharesV1}, {"cpu.weight", cgroupWeightV2}} {
		if got, err := os.ReadFile(filepath.Join(cg, w.file)); err == nil && strings.TrimSpace(string(got)) != w.want {
			t.Errorf("%s is %s; want %s", w.file, got, w.want)
		}
	}
	root := t.TempDir()
	expr := nixgen.Lib(storeTestSalt(t)) + ` {
  cgroup = builtins.derivation {
    name = "cgroup";
    system = builtins.currentSystem;
    builder = "/bin/sh";
    args = [ "-c" "while read -r l; do echo \"$l\"; done < /proc/self/cgroup > $out" ];
  };
}`
	drvPath := storeTestInstantiate(t, root, expr, "cgroup")["cgroup"]
	ss := storeTestOpen(t, &Store{Root: root, Cgroup: cg})
	got := buildOut(t, ss, root, drvPath)
	rel := "/" + filepath.Base(cg)
	if !strings.Contains(got, ":"+rel+"\n") {
		t.Errorf("the build's cgroups:\n%s\nwant %s", got, rel)
	}
	if err := PrepareCgroup("relative/dir"); err == nil {
		t.Error("PrepareCgroup of a relative path = nil error")
	}
}
