package eval_test

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/eval"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/nixdaemon"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

// leakTarget is what a project's code tries to read outside its own tree: a file, a git
// repository and a tarball (each may be missing), and the contents that must appear nowhere.
type leakTarget struct {
	name                string
	file, repo, tarball string
	dir                 string // a flake's path input
	secrets             []string
}

// fetchers are the ways a project reaches a path, each reading the target's secret into a
// derivation's arguments: an attribute that evaluates has read it.
var fetchers = []struct{ name, expr string }{
	{"fetchTree-path", `builtins.readFile "${builtins.fetchTree { type = "path"; path = "FILE"; }}"`},
	{"fetchTree-git", `builtins.readFile "${builtins.fetchTree { type = "git"; url = "file://REPO"; }}/secret.txt"`},
	{"fetchTree-tarball", `builtins.readFile "${builtins.fetchTree { type = "tarball"; url = "file://TARBALL"; }}/secret.txt"`},
	{"fetchGit", `builtins.readFile "${builtins.fetchGit { url = "file://REPO"; }}/secret.txt"`},
	{"path", `builtins.readFile (builtins.path { path = /. + "FILE"; name = "leak"; })`},
	{"storePath", `builtins.readFile (builtins.storePath "FILE")`},
}

// leakPrelude defines leak: a derivation carrying content in its arguments.
func leakPrelude(sys string) string {
	return fmt.Sprintf(`let leak = name: content: builtins.derivation { inherit name; system = %q; builder = "/bin/sh"; args = [ "-c" ": > $out" content ]; }; in
`, sys)
}

// attackNix is a ci.nix with an ordinary attribute "fine" and one attribute per fetcher and target.
func attackNix(sys string, targets []leakTarget) string {
	var b strings.Builder
	b.WriteString(leakPrelude(sys) + "{\n  fine = leak \"fine\" \"nothing\";\n")
	for _, t := range targets {
		r := strings.NewReplacer("FILE", t.file, "REPO", t.repo, "TARBALL", t.tarball)
		for _, f := range fetchers {
			fmt.Fprintf(&b, "  %s-%s = leak \"leak\" (%s);\n", f.name, t.name, r.Replace(f.expr))
		}
	}
	b.WriteString("}\n")
	return b.String()
}

// attackFlake is a flake whose input x is the path dir, with an ordinary check and one that
// reads x.
func attackFlake(sys, dir string) string {
	return fmt.Sprintf(`{
  inputs.x = { url = "path:%s"; flake = false; };
  outputs = { self, x }: %s{
    checks.%s = { fine = leak "fine" "nothing"; leak = leak "leak" (builtins.readFile "${x}/secret.txt"); };
  };
}`, dir, leakPrelude(sys), sys)
}

// result is an attribute's outcome, from the database or a walk.
type result struct{ drv, err string }

// checkNoLeak checks that "fine" evaluated, every other attribute is an error, and no secret
// appears in an error or a derivation.
func checkNoLeak(t *testing.T, got map[string]result, targets []leakTarget) {
	t.Helper()
	if got["fine"].drv == "" {
		t.Errorf("fine: %+v, want a derivation: the project's ordinary attributes still evaluate", got["fine"])
	}
	for _, tg := range targets {
		for _, f := range fetchers {
			name := f.name + "-" + tg.name
			a, ok := got[name]
			if !ok {
				t.Errorf("%s: not reported", name)
				continue
			}
			if a.drv != "" || a.err == "" {
				t.Errorf("%s: read outside the project: %+v", name, a)
			}
		}
	}
	checkSecrets(t, got, targets)
}

// checkSecrets checks that no secret of targets appears in an error or a derivation of got.
func checkSecrets(t *testing.T, got map[string]result, targets []leakTarget) {
	t.Helper()
	for name, a := range got {
		text := a.err
		if a.drv != "" {
			b, err := os.ReadFile(a.drv)
			if err != nil {
				t.Fatal(err)
			}
			text += string(b)
		}
		for _, tg := range targets {
			for _, s := range tg.secrets {
				if strings.Contains(text, s) {
					t.Errorf("%s carries the secret %q of %s: %+v", name, s, tg.name, a)
				}
			}
		}
	}
}

// plantSecrets puts in dir what a node's state directory may hold that a project must not
// read, all of it readable by others (as the source copies are): a file, a git repository
// and a tarball, each with secret, owned by uid:gid.
func plantSecrets(t *testing.T, dir, secret string, uid, gid int) leakTarget {
	t.Helper()
	file := filepath.Join(dir, "secret")
	if err := os.WriteFile(file, []byte(secret), 0o644); err != nil {
		t.Fatal(err)
	}
	src := nixtest.NewRepo(t)
	src.Commit("secret", map[string]string{"secret.txt": secret})
	repo := filepath.Join(dir, "planted")
	if out, err := exec.Command("git", "clone", "-q", src.Dir, repo).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	tarball := filepath.Join(dir, "secret.tar.gz")
	writeTarball(t, tarball, map[string]string{"top/secret.txt": secret})
	for _, p := range []string{file, repo, tarball} {
		chownAll(t, p, uid, gid)
	}
	return leakTarget{name: "state", file: file, repo: repo, tarball: tarball, dir: repo, secrets: []string{secret}}
}

func writeTarball(t *testing.T, path string, files map[string]string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	zw := gzip.NewWriter(f)
	tw := tar.NewWriter(zw)
	for name, content := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, content); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []io.Closer{tw, zw, f} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
}

func chownAll(t *testing.T, root string, uid, gid int) {
	t.Helper()
	err := filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// etcTarget is the node's /etc.
var etcTarget = leakTarget{name: "etc", file: "/etc/passwd", repo: "/etc", tarball: "/etc/passwd", dir: "/etc/nix",
	secrets: []string{"root:x:0:0"}}

// An evaluation sees only its project, on a root node: a project's code reaching with every
// fetcher for another project's source copy, /etc and the state directory gets an error on
// each such attribute, its ordinary attribute still evaluates, and no secret appears anywhere;
// a flake whose path input points there is refused.
func TestEvaluationSeesOnlyItsProject(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	sys := nixSystem(t)
	state := reachableDir(t)
	h.startEvaluator("ev-1", func(c *eval.Config) { c.StateDir = state })

	// Another project, evaluated on this node first: its source copy is in the state directory.
	victimSecret := "victim-secret-" + h.salt
	_, vcommit := h.newProject("victim", map[string]string{
		"ci.nix":     h.lib() + `{ v = mk "v" [ ]; }`,
		"secret.txt": victimSecret,
	})
	ve, _ := h.trigger("victim", "", vcommit)
	h.waitSucceeded(ve.ID)
	vid := h.queryStrings(`SELECT id::text FROM projects WHERE name = 'victim'`)[0]
	copyDir := filepath.Join(state, "eval", vid, "source.git")
	victim := leakTarget{name: "other", file: filepath.Join(copyDir, "HEAD"), repo: copyDir,
		tarball: filepath.Join(copyDir, "HEAD"), dir: copyDir, secrets: []string{victimSecret}}
	stateT := plantSecrets(t, state, "state-secret-"+h.salt, 0, 0)
	targets := []leakTarget{victim, etcTarget, stateT}

	_, commit := h.newProject("attacker", map[string]string{"ci.nix": attackNix(sys, targets)})
	e, _ := h.trigger("attacker", "", commit)
	h.waitSucceeded(e.ID)
	checkNoLeak(t, dbResults(h, e.ID), targets)

	for _, tg := range targets {
		t.Run("flake-"+tg.name, func(t *testing.T) {
			for _, locked := range []bool{true, false} {
				name := fmt.Sprintf("flake-%s-%t", tg.name, locked)
				repo, commit := h.newProject(name, map[string]string{"flake.nix": attackFlake(sys, tg.dir)})
				if locked {
					commit = repo.LockFlake()
				}
				e, _ := h.sub(t).trigger(name, "", commit)
				got := h.sub(t).waitFinished(e.ID)
				if locked && (got.Status != status.EvalFailed || !strings.Contains(got.Error, `flake input "x"`) || !strings.Contains(got.Error, "outside the project")) {
					t.Errorf("locked: %s %q, want the input refused as outside the project", got.Status, got.Error)
				}
				res := dbResults(h.sub(t), e.ID)
				if a, ok := res["checks."+sys+".leak"]; ok && a.drv != "" {
					t.Errorf("locked %t: the flake read its input %s: %+v", locked, tg.dir, a)
				}
				res["evaluation"] = result{err: got.Error}
				checkSecrets(t, res, targets)
			}
		})
	}
}

func dbResults(h *harness, id int64) map[string]result {
	got := map[string]result{}
	for name, a := range h.attrs(id) {
		got[name] = result{drv: a.DrvPath, err: a.Error}
	}
	return got
}

// waitFinished waits until evaluation id has finished, whichever way.
func (h *harness) waitFinished(id int64) evaluation.Evaluation {
	h.t.Helper()
	var e evaluation.Evaluation
	waittest.For(h.t, finishTimeout, func() bool {
		e = h.get(id)
		return e.Finished()
	}, "evaluation %d to finish", id)
	return e
}

// viewChildEnv names the job file of TestViewUnprivilegedChild.
const viewChildEnv = "HCI_TEST_VIEW_CHILD"

// viewJob is what the unprivileged child walks, and where it writes what it found.
type viewJob struct {
	Home, WorkDir, Results string
	Specs                  map[string]eval.Spec
}

// An evaluation sees only its project on a node that does not run as root either: the node's
// own user (here the unprivileged harmonia-eval, which owns the state directory and everything
// planted in it) walks the same attacks, reaching the store through a nix-daemon as on a
// multi-user install.
func TestEvaluationSeesOnlyItsProjectUnprivileged(t *testing.T) {
	t.Parallel()
	nixtest.RequireNix(t)
	u, err := user.Lookup("harmonia-eval")
	if err != nil {
		t.Skipf("no unprivileged user to run a node as: %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to start a node as another user")
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	sys := nixSystem(t)
	salt := salt(t)
	state := reachableDir(t)

	// Another project's source copy, as the evaluator keeps it.
	victimSecret := "victim-secret-" + salt
	vsrc := nixtest.NewRepo(t)
	vsrc.Commit("init", map[string]string{"secret.txt": victimSecret})
	copyDir := filepath.Join(state, "eval", "1", "source.git")
	if out, err := exec.Command("git", "clone", "-q", "--bare", vsrc.Dir, copyDir).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	victim := leakTarget{name: "other", file: filepath.Join(copyDir, "HEAD"), repo: copyDir,
		tarball: filepath.Join(copyDir, "HEAD"), dir: copyDir, secrets: []string{victimSecret}}
	stateT := plantSecrets(t, state, "state-secret-"+salt, uid, gid)
	targets := []leakTarget{victim, etcTarget, stateT}

	// The attacker's tree, exported as the evaluator exports it, and flakes locked on its inputs.
	work := filepath.Join(state, "eval", "2")
	attacker := nixtest.NewRepo(t)
	rev := attacker.Commit("init", map[string]string{"ci.nix": attackNix(sys, targets)})
	tree := filepath.Join(work, "tree", "source")
	if out, err := exec.Command("git", "clone", "-q", attacker.Dir, tree).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	job := viewJob{Home: filepath.Join(state, "eval-home", "2"), WorkDir: work, Results: filepath.Join(state, "results.json"),
		Specs: map[string]eval.Spec{"file": {Source: tree, Mode: "file", Rev: rev, File: "ci.nix", Roots: [][]string{{}}, Force: 1}}}
	for _, tg := range targets {
		fl := nixtest.NewRepo(t)
		fl.Commit("init", map[string]string{"flake.nix": attackFlake(sys, tg.dir)})
		frev := fl.LockFlake()
		copy := filepath.Join(state, "eval", "flake-"+tg.name, "source.git")
		if out, err := exec.Command("git", "clone", "-q", "--bare", fl.Dir, copy).CombinedOutput(); err != nil {
			t.Fatalf("git clone: %v\n%s", err, out)
		}
		job.Specs["flake-"+tg.name] = eval.Spec{Source: copy, Mode: "flake", Rev: frev, Roots: [][]string{{"checks"}}, Force: 2,
			FlakeRef: "git+file://" + copy + "?rev=" + frev + "&allRefs=1"}
	}
	for _, d := range []string{job.Home} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	chownAll(t, filepath.Join(state, "eval"), uid, gid)
	chownAll(t, filepath.Join(state, "eval-home"), uid, gid)
	if err := os.Chown(state, uid, gid); err != nil {
		t.Fatal(err)
	}
	jobFile := filepath.Join(state, "job.json")
	b, _ := json.Marshal(job)
	if err := os.WriteFile(jobFile, b, 0o644); err != nil {
		t.Fatal(err)
	}

	// The store through a nix-daemon, the node's user an untrusted client of it.
	d := nixdaemon.New(nixdaemon.Config{Options: [][2]string{{"substituters", ""}}, Dir: filepath.Join(reachableDir(t), "nixd")}, testLogger(t))
	t.Cleanup(d.Close)
	socket, err := d.Ensure(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// This test binary, run as the node's user.
	bin := filepath.Join(reachableDir(t), "eval.test")
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	child := func() *exec.Cmd {
		cmd := exec.CommandContext(ctx, bin, "-test.run=^TestViewUnprivilegedChild$", "-test.count=1", "-test.v")
		cmd.Dir = state
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "TMPDIR=/tmp", "HOME=" + job.Home, viewChildEnv + "=" + jobFile,
			"NIX_REMOTE=daemon", "NIX_DAEMON_SOCKET_PATH=" + socket}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}}
		return cmd
	}
	if out, err := runBusyExecutable(ctx, child); err != nil {
		t.Fatalf("the unprivileged walk: %v\n%s", err, out)
	}
	var results map[string]map[string]result
	raw, err := os.ReadFile(job.Results)
	if err != nil {
		t.Fatal(err)
	}
	var wire map[string]map[string][2]string
	if err := json.Unmarshal(raw, &wire); err != nil {
		t.Fatal(err)
	}
	results = map[string]map[string]result{}
	for spec, attrs := range wire {
		results[spec] = map[string]result{}
		for name, a := range attrs {
			results[spec][name] = result{drv: a[0], err: a[1]}
		}
	}
	checkNoLeak(t, results["file"], targets)
	for _, tg := range targets {
		got := results["flake-"+tg.name]
		if a := got["checks."+sys+".leak"]; a.drv != "" {
			t.Errorf("flake-%s: the flake read its input %s: %+v", tg.name, tg.dir, a)
		}
		checkSecrets(t, got, targets)
	}
}

// TestViewUnprivilegedChild is TestEvaluationSeesOnlyItsProjectUnprivileged's node: it walks
// the job's specs as this process's user and records every attribute (a walk that fails
// outright is recorded as the attribute "walk").
func TestViewUnprivilegedChild(t *testing.T) {
	jobFile := os.Getenv(viewChildEnv)
	if jobFile == "" {
		t.Skip("run by TestEvaluationSeesOnlyItsProjectUnprivileged")
	}
	var job viewJob
	b, err := os.ReadFile(jobFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &job); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string][2]string{}
	for name, spec := range job.Specs {
		got := map[string][2]string{}
		r := &eval.NixRunner{Home: job.Home, WorkDir: job.WorkDir}
		err := r.Walk(t.Context(), spec, func(a eval.Attr) error {
			got[a.Name] = [2]string{a.DrvPath, a.Error}
			return nil
		})
		if err != nil {
			got["walk"] = [2]string{"", err.Error()}
		}
		out[name] = got
	}
	b, _ = json.Marshal(out)
	if err := os.WriteFile(job.Results, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// An evaluator does not start without bubblewrap, and says which package provides it.
func TestEvaluatorNeedsBwrap(t *testing.T) {
	t.Parallel()
	_, err := eval.New(eval.Config{NodeID: "n", StateDir: t.TempDir(), Confinement: eval.Confinement{User: "harmonia-eval"},
		Runner: &eval.NixRunner{Bwrap: "/nonexistent/bwrap"}}, nil, testLogger(t), nil)
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/bwrap is not installed") || !strings.Contains(err.Error(), "apt-get install bubblewrap") {
		t.Fatalf("got %v, want an error naming bwrap and its package", err)
	}
}

// runBusyExecutable runs a freshly written executable. A parallel test's fork can
// briefly hold the write descriptor it was written through (until that child's
// exec closes it), and exec then fails with ETXTBSY; that is retried until ctx ends.
func runBusyExecutable(ctx context.Context, cmd func() *exec.Cmd) ([]byte, error) {
	for {
		out, err := cmd().CombinedOutput()
		if !errors.Is(err, syscall.ETXTBSY) {
			return out, err
		}
		select {
		case <-ctx.Done():
			return out, err
		case <-time.After(20 * time.Millisecond):
		}
	}
}
