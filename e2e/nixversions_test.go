package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// TestMixedNixVersions: a cluster whose builder runs one Nix and whose evaluator runs another
// (this machine's 2.8 and Debian 13's 2.26, each way round) builds both example projects as one
// (examples/dag, and examples/failing under `failing`: a failure crosses the versions too); every
// node and the evaluation say which Nix they ran; and a fresh store substitutes every output,
// signatures required, through either Nix.
func TestMixedNixVersions(t *testing.T) {
	root := proctest.RequireNixRoot(t)
	hostNix := nixtest.Version(t)
	rootNix := rootVersion(t, root)
	example := map[string]string{"ci.nix": `import ./dag.nix // {
  failing = import ./failing.nix // { recurseForDerivations = true; };
}`}
	for name, dir := range map[string]string{"dag.nix": "dag", "failing.nix": "failing"} {
		b, err := os.ReadFile(filepath.Join("../examples", dir, "ci.nix"))
		if err != nil {
			t.Fatal(err)
		}
		example[name] = string(b)
	}
	for _, tt := range []struct {
		name        string
		inRoot      string // the node that runs Nix 2.26
		evalNix     string
		builderNix  string
		builderProt string
	}{
		{"builder on 2.26", "b1", hostNix, rootNix, "1.38"},
		{"evaluator on 2.26", "eval-1", rootNix, hostNix, "1.34"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := newBuildCluster(t, buildClusterOptions{builders: 1, nixRoot: root, inNixRoot: []string{tt.inRoot}})
			c.repo.Commit("example", example)
			var e evalJSON
			c.cli.json(&e, "eval", c.project, "--wait", "--json")
			if e.Status != status.EvalSucceeded || e.NixVersion != tt.evalNix {
				t.Fatalf("evaluation %d: %s with Nix %q (%s); want succeeded with %s", e.ID, e.Status, e.NixVersion, e.Error, tt.evalNix)
			}
			if out := c.cli.ok("eval", "show", strconv.FormatInt(e.ID, 10)); !strings.Contains(out, "evaluated by Nix "+tt.evalNix+" on eval-1") {
				t.Errorf("eval show does not say which Nix evaluated:\n%s", out)
			}
			jobs := c.waitFinished(e.ID, 3*time.Minute)
			var built []jobRow
			for _, j := range jobs {
				want := status.JobSucceeded
				switch {
				case strings.HasSuffix(j.DrvPath, "-broken-tool.drv"):
					want = status.JobFailed
				case strings.HasSuffix(j.DrvPath, "-broken-app.drv"):
					want = status.JobDepFailed
				default:
					built = append(built, j)
				}
				if j.Status != want {
					t.Errorf("%s, want %s", j, want)
				}
			}
			if len(built) != len(jobs)-2 || len(built) < 20 {
				t.Fatalf("%d of %d jobs succeeded; want all but examples/failing's two", len(built), len(jobs))
			}

			var nodes []cluster.NodeStatus
			c.cli.json(&nodes, "nodes", "--json")
			want := map[string]cluster.NixInfo{"b1": {Version: tt.builderNix, Protocol: tt.builderProt},
				"eval-1": {Version: tt.evalNix}, "front-1": {}}
			for _, n := range nodes {
				if w, ok := want[n.ID]; ok && n.NixInfo != w {
					t.Errorf("node %s reports Nix %+v, want %+v", n.ID, n.NixInfo, w)
				}
			}
			if out := c.cli.ok("nodes"); !strings.Contains(out, tt.builderNix+" (protocol "+tt.builderProt+")") {
				t.Errorf("harmonia-ci nodes does not show the builder's Nix %s:\n%s", tt.builderNix, out)
			}

			// A flake locking an input inside its repository, the lock written by this machine's
			// Nix (2.8), is evaluated by either and built by the other. (Nix 2.26 reads that lock
			// as one to update, and then gives the flake no self.rev; 2.8 cannot read a lock 2.26
			// wrote for such an input: see docs/decisions.md.)
			flake := nixtest.NewRepo(t)
			flake.Commit("flake", map[string]string{
				"lib/flake.nix": `{ outputs = { self }: { greeting = "hello from lib"; }; }`,
				"flake.nix": `{
  inputs.lib.url = "path:./lib";
  outputs = { self, lib }: let sys = "x86_64-linux"; in {
    checks.${sys}.greet = builtins.derivation { name = "greet"; system = sys; builder = "/bin/sh";
      args = [ "-c" "echo ${lib.greeting} > $out" ]; };
  };
}`})
			flake.LockFlake()
			c.cli.ok("project", "add", "flake", "--repo", flake.Dir)
			var fe evalJSON
			c.cli.json(&fe, "eval", "flake", "--wait", "--json")
			if fe.Status != status.EvalSucceeded || fe.NixVersion != tt.evalNix || len(fe.Attrs) != 1 || fe.Attrs[0].DrvPath == "" {
				t.Fatalf("flake evaluation %d: %s with Nix %q (%s), attributes %+v", fe.ID, fe.Status, fe.NixVersion, fe.Error, fe.Attrs)
			}
			fjobs := c.waitFinished(fe.ID, time.Minute)
			if len(fjobs) != 1 || fjobs[0].Status != status.JobSucceeded {
				t.Fatalf("the flake's build: %v", fjobs)
			}
			built = append(built, fjobs...)

			// Both Nix versions substitute every output from the cache, signatures required.
			paths := c.outputPaths(built)
			c.checkSubstitutable(paths)
			args := append([]string{"nix-store", "--store", filepath.Join(t.TempDir(), "fresh"), "--realise"}, paths...)
			args = append(args, "--option", "substituters", c.cacheURL, "--option", "trusted-public-keys", c.pub,
				"--option", "require-sigs", "true", "--option", "build-users-group", "", "--option", "max-jobs", "0")
			if out, err := root.Command(c.rootBinds, []string{"HOME=" + t.TempDir()}, args...).CombinedOutput(); err != nil {
				t.Fatalf("Nix %s could not substitute the %d outputs: %v\n%s", rootNix, len(paths), err, lastLines(string(out), 30))
			}
		})
	}
}

// rootVersion is the version of the Nix in the root.
func rootVersion(t *testing.T, root *proctest.NixRoot) string {
	t.Helper()
	out, err := root.Command(nil, nil, "nix-store", "--version").Output()
	if err != nil {
		t.Fatalf("nix-store --version in the Nix 2.26 root: %v", err)
	}
	f := strings.Fields(string(out))
	if len(f) == 0 || !strings.HasPrefix(f[len(f)-1], "2.") {
		t.Fatalf("nix-store --version in the root printed %q", out)
	}
	return f[len(f)-1]
}

// dbSocketDir is the directory of the database's Unix socket, which a process in the Nix root
// needs to see.
func dbSocketDir(t *testing.T, url string) string {
	t.Helper()
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(cfg.Host, "/") {
		t.Fatalf("the test database is not on a Unix socket: %q", cfg.Host)
	}
	return cfg.Host
}
