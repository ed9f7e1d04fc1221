package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// An evaluation's private nix-daemon never outlives its node, even one killed with SIGKILL,
// which has no chance to stop it. The daemon lives as long as its evaluation: this one imports
// from a derivation whose build runs for a while.
func TestNixDaemonDiesWithItsNode(t *testing.T) {
	t.Parallel()
	nixtest.RequireNix(t)
	f := newFixture(t, "[eval]\npoll_interval = \"200ms\"\n")
	node := f.start("ev-1", "--roles", "frontend,evaluator,cache")
	proctest.WaitFor(t, 30*time.Second, "ev-1 active", func() bool { return f.nodeStatus("ev-1") == status.NodeActive })
	cli := newCLI(t, f)
	repo := nixtest.NewRepo(t)
	salt := "daemon-" + randomHex(t, 6)
	repo.Commit("init", map[string]string{"ci.nix": nixtest.Lib(salt) + `{
  a = mk (builtins.readFile (builtins.derivation {
    name = "slow"; system = builtins.currentSystem; builder = "/bin/sh"; salt = "` + salt + `";
    args = [ "-c" "i=0; while [ $i -lt 30000000 ]; do i=$((i+1)); done; echo a > $out" ];
  })) [ ];
}`})
	cli.ok("project", "add", "daemon", "--repo", repo.Dir)
	cli.ok("eval", "daemon")

	var daemon int
	proctest.WaitFor(t, 30*time.Second, "the evaluation's nix-daemon", func() bool {
		daemon = childNamed(node.Pid(), "nix-daemon")
		return daemon != 0
	})
	node.Signal(t, syscall.SIGKILL)
	node.Wait(t, 10*time.Second)
	proctest.WaitFor(t, 10*time.Second, "the nix-daemon to exit with its node", func() bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(daemon) + "/stat")
		// Gone, or a zombie waiting for init to reap it.
		return err != nil || strings.Contains(string(b[strings.LastIndexByte(string(b), ')')+1:]), " Z ")
	})
}

// childNamed returns the pid of a child of parent whose command is name, 0 if there is none.
func childNamed(parent int, name string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		fields := strings.Fields(s[end+1:])
		if len(fields) > 1 && s[open+1:end] == name && fields[1] == strconv.Itoa(parent) {
			return pid
		}
	}
	return 0
}
