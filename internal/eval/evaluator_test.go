package eval_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/eval"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/gitrepo"
	"github.com/harmonia-ci/harmonia-ci/internal/metricstest"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/signertest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

// Two projects whose attributes share part of one DAG, evaluated at once: every derivation of
// the union of their closures is recorded once with its outputs and inputs, and has exactly
// one build job.
func TestSharedDAGOneJobPerDerivation(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.startEvaluator("ev-1", func(c *eval.Config) { c.MaxEvals = 2 })
	dag := h.lib() + `
let
  base = mk "base" [ ];
  libone = mk "libone" [ base ];
  libtwo = mk "libtwo" [ base libone ];
in `
	projects := []struct {
		name  string
		expr  string
		attrs []string
	}{
		{"one", `{ shared = libtwo; tool = mk "tool" [ libone ]; one = mk "one" [ libtwo ]; }`, []string{"one", "shared", "tool"}},
		{"two", `{ shared = libtwo; two = mk "two" [ libone base ]; lonely = mk "lonely" [ ]; }`, []string{"lonely", "shared", "two"}},
	}
	ids := make([]int64, len(projects))
	for i, p := range projects {
		_, commit := h.newProject(p.name, map[string]string{"ci.nix": dag + p.expr})
		e, created := h.trigger(p.name, "", commit)
		// The evaluator, already running, may have claimed it by the time Trigger reads it back.
		if !created || !e.Status.Unfinished() {
			t.Fatalf("%s: evaluation %+v created=%v, want a new queued (or just claimed) one", p.name, e, created)
		}
		ids[i] = e.ID
	}
	var roots []string
	for i, p := range projects {
		h.waitSucceeded(ids[i])
		attrs := h.attrs(ids[i])
		if got := slices.Sorted(maps.Keys(attrs)); !slices.Equal(got, p.attrs) {
			t.Fatalf("%s: attributes %q, want %q", p.name, got, p.attrs)
		}
		for _, a := range attrs {
			if !strings.HasSuffix(a.DrvPath, ".drv") || a.Error != "" || a.JobStatus != status.JobPending {
				t.Errorf("%s: attribute %+v, want a derivation with a pending job", p.name, a)
			}
			roots = append(roots, a.DrvPath)
		}
	}
	if a, b := h.attrs(ids[0])["shared"], h.attrs(ids[1])["shared"]; a.DrvPath != b.DrvPath || a.JobID != b.JobID {
		t.Fatalf("the shared attribute differs between the projects: %+v and %+v", a, b)
	}

	union := drvClosure(t, roots...)
	if len(union) != 7 {
		t.Fatalf("closure of %d derivations, want 7: %q", len(union), union)
	}
	if n, distinct := h.queryInt(`SELECT count(*) FROM build_jobs`), h.queryInt(`SELECT count(DISTINCT drv_path) FROM build_jobs`); n != distinct || n != int64(len(union)) {
		t.Fatalf("%d build jobs for %d distinct derivations, want one job for each of the %d derivations", n, distinct, len(union))
	}
	if jobs := sorted(h.queryStrings(`SELECT drv_path FROM build_jobs`)); !slices.Equal(jobs, union) {
		t.Fatalf("build jobs for\n%q\nwant the closure\n%q", jobs, union)
	}
	if drvs := sorted(h.queryStrings(`SELECT drv_path FROM derivations`)); !slices.Equal(drvs, union) {
		t.Fatalf("derivations\n%q\nwant the closure\n%q", drvs, union)
	}
	// Each derivation's outputs and inputs as Nix itself shows them.
	shown := nixtest.ShowDerivations(t, nil, union...)
	for _, drv := range union {
		d, ok := shown[drv]
		if !ok {
			t.Fatalf("nix derivation show did not show %s", drv)
		}
		var name, system, narHash string
		var narSize int64
		if err := h.pool.QueryRow(h.ctx(), `SELECT name, system, nar_hash, nar_size FROM derivations WHERE drv_path = $1`, drv).Scan(&name, &system, &narHash, &narSize); err != nil {
			t.Fatalf("%s: %v", drv, err)
		}
		if name != d.Env["name"] || system != d.System {
			t.Errorf("%s: recorded as %s on %s, want %s on %s", drv, name, system, d.Env["name"], d.System)
		}
		// The NAR hash and size are computed from the .drv's text; Nix's own record is the judge.
		wantHash := strings.TrimSpace(runNix(t, "nix-store", "--query", "--hash", drv))
		wantSize := strings.TrimSpace(runNix(t, "nix-store", "--query", "--size", drv))
		if narHash != wantHash || fmt.Sprint(narSize) != wantSize {
			t.Errorf("%s: NAR %s of %d bytes, Nix has %s of %s bytes", drv, narHash, narSize, wantHash, wantSize)
		}
		var wantOuts, wantIns []string
		for o, out := range d.Outputs {
			wantOuts = append(wantOuts, o+"="+out)
		}
		for in, outs := range d.InputDrvs {
			wantIns = append(wantIns, in+"="+strings.Join(outs, ","))
		}
		outs := h.queryStrings(`SELECT output_name || '=' || output_path FROM derivation_outputs WHERE drv_path = $1`, drv)
		if !slices.Equal(sorted(outs), sorted(wantOuts)) {
			t.Errorf("%s: outputs %q, want %q", drv, outs, wantOuts)
		}
		ins := h.queryStrings(`SELECT input_drv || '=' || array_to_string(outputs, ',') FROM derivation_inputs WHERE referrer = $1`, drv)
		if !slices.Equal(sorted(ins), sorted(wantIns)) {
			t.Errorf("%s: inputs %q, want %q", drv, ins, wantIns)
		}
	}
}

// Batches prepared while the previous commit's interval runs are committed together at the
// end of the walk: a later batch's closure stops at the derivations of an earlier one that are
// not in the database yet, and the commit holds each derivation, edge and job once, with
// readiness counted across the batches.
func TestPreparedBatchesCommitTogether(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.startEvaluator("ev-1", func(c *eval.Config) { c.BatchAttrs, c.CommitInterval = 1, time.Hour })
	attrs := h.evaluateOnce("together", `
let x = mk "x" [ ]; b = mk "b" [ x ]; in {
  a = mk "a" [ ];
  b = b;
  c = mk "c" [ x b ];
}`, 3)
	union := drvClosure(t, attrs["a"].DrvPath, attrs["c"].DrvPath)
	if jobs := sorted(h.queryStrings(`SELECT drv_path FROM build_jobs`)); !slices.Equal(jobs, union) {
		t.Fatalf("build jobs for\n%q\nwant one per derivation of the closure\n%q", jobs, union)
	}
	if n := h.queryInt(`SELECT count(*) FROM derivation_inputs WHERE referrer = $1`, attrs["c"].DrvPath); n != 2 {
		t.Fatalf("c has %d inputs recorded, want 2 (x and b)", n)
	}
	for attr, want := range map[string]int64{"a": 0, "b": 1, "c": 2} {
		if got := h.queryInt(`SELECT blocked_inputs FROM build_jobs WHERE drv_path = $1`, attrs[attr].DrvPath); got != want {
			t.Errorf("%s: blocked by %d inputs, want %d", attr, got, want)
		}
	}
}

// Every batch committed on its own (inputs first, as Nix walks a closure), the jobs' dependent
// chains still count what came above them in later commits: the evaluation raises them once,
// after its last commit.
func TestChainsAfterSeparateCommits(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.startEvaluator("ev-1", func(c *eval.Config) { c.BatchAttrs, c.CommitInterval = 1, time.Nanosecond })
	attrs := h.evaluateOnce("chains", `
let x = mk "x" [ ]; b = mk "b" [ x ]; in {
  a = x;
  b = b;
  c = mk "c" [ x b ];
}`, 3)
	// x ← b ← c and x ← c: x has the two jobs of the longest chain above it.
	for attr, want := range map[string]int64{"a": 2, "b": 1, "c": 0} {
		if got := h.queryInt(`SELECT dependent_chain FROM build_jobs WHERE drv_path = $1`, attrs[attr].DrvPath); got != want {
			t.Errorf("%s: chain %d, want %d", attr, got, want)
		}
	}
}

// Attributes that fail are recorded with their error and no derivation; the rest of the
// project is evaluated; nested sets are walked only with recurseForDerivations.
func TestAttributeErrorsAndNesting(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.startEvaluator("ev-1")
	_, commit := h.newProject("errors", map[string]string{"ci.nix": h.lib() + `
let a = mk "a" [ ]; in {
  inherit a;
  b = mk "b" [ a ];
  thrown = throw "boom from thrown";
  typeError = 1 + "x";
  badDep = mk "bad-dep" [ a (throw "deep boom") ];
  nested = { c = mk "c" [ ]; };
  recursing = { recurseForDerivations = true; d = mk "d" [ a ]; deeper = { e = mk "e" [ ]; }; };
  notADerivation = 42;
}`})
	e, _ := h.trigger("errors", "", commit)
	h.waitSucceeded(e.ID)
	attrs := h.attrs(e.ID)
	want := []string{"a", "b", "badDep", "recursing.d", "thrown", "typeError"}
	if got := slices.Sorted(maps.Keys(attrs)); !slices.Equal(got, want) {
		t.Fatalf("attributes %q, want %q", got, want)
	}
	for _, name := range []string{"a", "b", "recursing.d"} {
		if a := attrs[name]; !strings.HasSuffix(a.DrvPath, ".drv") || a.Error != "" || a.JobStatus != status.JobPending {
			t.Errorf("%s: %+v, want a derivation with a pending job", name, a)
		}
	}
	for name, msg := range map[string]string{"thrown": "boom from thrown", "typeError": "cannot add", "badDep": "deep boom"} {
		a := attrs[name]
		if a.DrvPath != "" || a.JobID != 0 || !strings.Contains(a.Error, msg) {
			t.Errorf("%s: %+v, want no derivation and an error containing %q", name, a, msg)
		}
		// The database says the same as Attrs: error set, drv_path NULL.
		var errText *string
		var drv *string
		if err := h.pool.QueryRow(h.ctx(), `SELECT error, drv_path FROM eval_attrs WHERE eval_id = $1 AND attr = $2`, e.ID, name).Scan(&errText, &drv); err != nil {
			t.Fatal(err)
		}
		if errText == nil || drv != nil {
			t.Errorf("%s: eval_attrs error=%v drv_path=%v, want an error and no derivation", name, errText, drv)
		}
	}
	// Only the three derivations (and nothing of the failing or unwalked attributes) got jobs.
	if n := h.queryInt(`SELECT count(*) FROM build_jobs`); n != 3 {
		t.Errorf("%d build jobs, want 3 (a, b, recursing.d)", n)
	}
	for _, name := range []string{"c", "e", "bad-dep"} {
		if n := h.queryInt(`SELECT count(*) FROM derivations WHERE name = $1`, name); n != 0 {
			t.Errorf("derivation %s was recorded", name)
		}
	}
}

// Flakes (checks by default), ci.nix, .harmonia-ci.toml's attrs, and a bad .harmonia-ci.toml.
func TestProjectKinds(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.startEvaluator("ev-1", func(c *eval.Config) { c.MaxEvals = 2 })
	sys := nixSystem(t)
	// self.rev is in every derivation: the flake is fetched at its commit.
	flake := func(prefix string) string {
		return fmt.Sprintf(`{
  outputs = { self }: let
    sys = %q;
    mk = name: builtins.derivation { inherit name; system = sys; builder = "/bin/sh";
      args = [ "-c" "echo ${name} ${self.rev} > $out" ]; salt = %q; };
  in {
    checks.${sys} = { one = mk "%[3]s-one"; two = mk "%[3]s-two"; nested = { three = mk "flake-three"; }; };
    packages.${sys}.default = mk "flake-pkg";
  };
}`, sys, h.salt, prefix)
	}
	cases := []struct {
		name    string
		files   map[string]string
		pull    bool // the commit is on no branch, only at refs/pull/1/head, and requested for branch pr-1
		status  status.EvalStatus
		attrs   []string
		errWant string
	}{
		{name: "flake", files: map[string]string{"flake.nix": flake("flake")}, status: status.EvalSucceeded,
			attrs: []string{"checks." + sys + ".one", "checks." + sys + ".two"}},
		{name: "flake-pull", files: map[string]string{"flake.nix": flake("pull")}, pull: true, status: status.EvalSucceeded,
			attrs: []string{"checks." + sys + ".one", "checks." + sys + ".two"}},
		{name: "ci-nix", files: map[string]string{"ci.nix": h.lib() + `{ x = mk "file-x" [ ]; y = mk "file-y" [ ]; }`},
			status: status.EvalSucceeded, attrs: []string{"x", "y"}},
		{name: "default-nix", files: map[string]string{"default.nix": h.lib() + `{ z = mk "default-z" [ ]; }`},
			status: status.EvalSucceeded, attrs: []string{"z"}},
		{name: "settings-attrs", files: map[string]string{
			".harmonia-ci.toml": `attrs = ["only.these"]` + "\n",
			"ci.nix": h.lib() + `{
  only = { these = { x = mk "only-x" [ ]; y = mk "only-y" [ ]; }; other = mk "only-other" [ ]; };
  top = mk "top" [ ];
}`}, status: status.EvalSucceeded, attrs: []string{"only.these.x", "only.these.y"}},
		{name: "bad-settings", files: map[string]string{
			".harmonia-ci.toml": "attrs = [\"x\"]\nbogus-key = true\n",
			"ci.nix":            h.lib() + `{ x = mk "bad-x" [ ]; }`,
		}, status: status.EvalFailed, errWant: "bogus-key"},
	}
	ids := map[string]int64{}
	for _, c := range cases {
		if !c.pull {
			_, commit := h.newProject(c.name, c.files)
			e, _ := h.trigger(c.name, "", commit)
			ids[c.name] = e.ID
			continue
		}
		repo, _ := h.newProject(c.name, map[string]string{"README": "not a Nix project on main\n"})
		repo.Git("checkout", "-q", "-b", "contributor")
		commit := repo.Commit("pull request", c.files)
		repo.Git("checkout", "-q", "main")
		repo.Git("update-ref", "refs/pull/1/head", commit)
		repo.Git("branch", "-q", "-D", "contributor")
		e, _ := h.trigger(c.name, "pr-1", commit)
		ids[c.name] = e.ID
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := h.sub(t)
			e := h.waitStatus(ids[c.name], c.status)
			if !strings.Contains(e.Error, c.errWant) {
				t.Errorf("error %q, want it to contain %q", e.Error, c.errWant)
			}
			if e.FinishedAt == nil {
				t.Error("finished_at not set")
			}
			if got := h.attrNames(e.ID); !slices.Equal(got, c.attrs) {
				t.Errorf("attributes %q, want %q", got, c.attrs)
			}
			for name, a := range h.attrs(e.ID) {
				if !strings.HasSuffix(a.DrvPath, ".drv") || a.JobStatus != status.JobPending {
					t.Errorf("%s: %+v, want a derivation with a pending job", name, a)
				}
			}
		})
	}
	for _, name := range []string{"flake-three", "flake-pkg", "only-other", "top", "bad-x"} {
		if n := h.queryInt(`SELECT count(*) FROM derivations WHERE name = $1`, name); n != 0 {
			t.Errorf("derivation %s was recorded: it is outside the attributes evaluated", name)
		}
	}
}

// Outputs the cache already holds get no job, and neither do the dependencies only they need.
func TestCachedOutputsGetNoJob(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.startEvaluator("ev-1")
	ci := h.lib() + `
let
  dep = mk "dep" [ ];
  both = mk "both" [ ];
  cached = mk "cached" [ dep both ];
in {
  inherit cached;
  top = mk "top" [ cached both ];
}`
	repo, commit := h.newProject("cached", map[string]string{"ci.nix": ci})

	// Build "cached" (and its inputs) with real Nix, and put only its output in the cache, as an
	// earlier build of it did.
	cachedDrv := runNix(t, "nix-instantiate", filepath.Join(repo.Dir, "ci.nix"), "-A", "cached")
	out := runNix(t, "nix-store", "--realise", cachedDrv, "--option", "sandbox", "false")
	refs := strings.Fields(runNix(t, "nix-store", "-q", "--references", out))
	h.cluster.Seed(t, "", signertest.SeedPath{StorePath: out, References: refs, Deriver: cachedDrv})

	e, _ := h.trigger("cached", "", commit)
	h.waitSucceeded(e.ID)
	attrs := h.attrs(e.ID)
	if a := attrs["cached"]; a.DrvPath != cachedDrv || a.JobID != 0 || a.JobStatus != "" {
		t.Errorf("cached: %+v, want derivation %s and no job", a, cachedDrv)
	}
	if a := attrs["top"]; a.JobStatus != status.JobPending {
		t.Errorf("top: %+v, want a pending job", a)
	}
	jobs := sorted(h.queryStrings(`SELECT d.name FROM build_jobs j JOIN derivations d ON d.drv_path = j.drv_path`))
	if want := []string{"both", "top"}; !slices.Equal(jobs, want) {
		t.Errorf("jobs for %q, want %q: neither the cached derivation nor what only it needs is built", jobs, want)
	}
	// The closure is recorded whole all the same.
	drvs := sorted(h.queryStrings(`SELECT name FROM derivations`))
	if want := []string{"both", "cached", "dep", "top"}; !slices.Equal(drvs, want) {
		t.Errorf("derivations %q, want %q", drvs, want)
	}
}

// What an evaluation publishes is enough for a builder elsewhere: a fresh store fetches every
// .drv of the closure (and its sources) from the cache, checking signatures.
func TestDrvClosureSubstitutable(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.startEvaluator("ev-1")
	_, commit := h.newProject("publish", map[string]string{
		"build.sh": "echo " + h.salt + " > $out\n",
		"ci.nix": h.lib() + `
let s = mk "s" [ ]; in {
  plain = mk "plain" [ s ];
  withSrc = builtins.derivation { name = "with-src"; system = builtins.currentSystem; builder = "/bin/sh";
    args = [ ./build.sh ]; dep = s; salt = "` + h.salt + `"; };
  top = mk "top" [ s (mk "hidden" [ ]) ];
}`})
	e, _ := h.trigger("publish", "", commit)
	h.waitSucceeded(e.ID)
	var drvs []string
	for _, a := range h.attrs(e.ID) {
		drvs = append(drvs, a.DrvPath)
	}
	closure := strings.Fields(runNix(t, "nix-store", append([]string{"-q", "--requisites"}, drvs...)...))
	var nDrv, nSrc int
	for _, p := range closure {
		if strings.HasSuffix(p, ".drv") {
			nDrv++
		} else if strings.HasSuffix(p, "-build.sh") {
			nSrc++
		}
	}
	if nDrv != 5 || nSrc != 1 {
		t.Fatalf("closure %q: want 5 derivations and the source build.sh", closure)
	}

	store := t.TempDir()
	copyArgs := func(dir, key string) []string {
		return append([]string{"--extra-experimental-features", "nix-command", "copy", "--derivation",
			"--from", h.cacheURL, "--to", dir, "--option", "trusted-public-keys", key, "--option", "require-sigs", "true"}, drvs...)
	}
	runNix(t, "nix", copyArgs(store, h.publicKey)...)
	for _, p := range closure {
		if _, err := os.Stat(filepath.Join(store, p)); err != nil {
			t.Errorf("%s did not arrive in the fresh store: %v", p, err)
		}
	}
	// .drv files and sources are content-addressed, and their narinfos say so (CA): Nix checks
	// such a path by its content, so even a store trusting another key accepts them. They are
	// signed all the same, by the cluster's key.
	other, err := nix.GenerateKey("eval-test-1")
	if err != nil {
		t.Fatal(err)
	}
	args := append(copyArgs(t.TempDir(), other.Public().String()), nixOptions...)
	if out, err := runCmd("nix", args...); err != nil {
		t.Fatalf("copy of content-addressed paths into a store trusting another key: %v\n%s", err, out)
	}
	pub, err := nix.ParsePublicKey(h.publicKey)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range closure {
		ni := h.narInfo(p)
		if ni.CA == "" || !ni.Verify(pub) {
			t.Errorf("%s: CA %q, signature valid %v; want content-addressed and signed", p, ni.CA, ni.Verify(pub))
		}
	}
}

// An evaluation that times out, is cancelled or whose Nix crashes ends with its error, and
// leaves nothing behind: no attributes, and no pending job only it needed.
func TestEvaluationEnds(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		settings string
		slow     func(h *harness, g *gate) string // the attribute that never finishes
		act      func(t *testing.T, h *harness, id int64, nixPid int)
		status   status.EvalStatus
		errWant  string
		outcome  string // its harmonia_ci_evaluations_finished_total label
		// The evaluation runs at least atLeast (started_at to finished_at); the runner stops
		// within stopWithin of act.
		atLeast, stopWithin time.Duration
	}{
		{
			name:     "timeout",
			settings: `eval-timeout = "3s"` + "\n",
			slow: func(h *harness, _ *gate) string {
				// Hours of CPU in little memory: a busy Nix, not a blocked one.
				return `mk ("slow" + builtins.substring 0 0 (toString (builtins.foldl'
    (a: i: a + builtins.foldl' (x: y: x + y) 0 (builtins.genList (x: x) 100000)) 0 (builtins.genList (x: x) 100000)))) [ ]`
			},
			act:        func(*testing.T, *harness, int64, int) {},
			status:     status.EvalFailed,
			errWant:    "timed out after 3s",
			outcome:    "timeout",
			atLeast:    3 * time.Second,
			stopWithin: 30 * time.Second,
		},
		{
			name: "cancel",
			slow: func(h *harness, g *gate) string { return g.drv("gated", h.salt) },
			act: func(t *testing.T, h *harness, id int64, _ int) {
				if err := evaluation.Cancel(h.ctx(), h.pool, id, "cancelled by the test"); err != nil {
					t.Fatalf("cancel: %v", err)
				}
				if e := h.get(id); e.Status != status.EvalCancelled {
					t.Fatalf("status %s right after Cancel, want cancelled", e.Status)
				}
				if err := evaluation.Cancel(h.ctx(), h.pool, id, "again"); !errors.Is(err, evaluation.ErrFinished) {
					t.Errorf("cancelling again: %v, want ErrFinished", err)
				}
				if err := evaluation.Cancel(h.ctx(), h.pool, id+1000, "nothing"); !errors.Is(err, evaluation.ErrNotFound) {
					t.Errorf("cancelling a missing evaluation: %v, want ErrNotFound", err)
				}
			},
			status:     status.EvalCancelled,
			errWant:    "cancelled by the test",
			outcome:    "cancelled",
			stopWithin: 5 * time.Second,
		},
		{
			name: "crash",
			slow: func(h *harness, g *gate) string { return g.drv("gated", h.salt) },
			act: func(t *testing.T, _ *harness, _ int64, pid int) {
				if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
					t.Fatalf("kill nix-instantiate %d: %v", pid, err)
				}
			},
			status:     status.EvalFailed,
			errWant:    "signal killed",
			outcome:    "failed",
			stopWithin: 5 * time.Second,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			var children pids
			reg := prometheus.NewRegistry()
			ev := h.startEvaluator("ev-1", func(cfg *eval.Config) {
				cfg.Runner = &eval.NixRunner{OnStart: children.onStart}
				cfg.Registerer = reg
			})
			g := newGate(t)
			files := map[string]string{"ci.nix": h.lib() + `
let a = mk "a" [ ]; in {
  inherit a;
  b = mk "b" [ a ];
  zslow = ` + c.slow(h, g) + `;
}`}
			if c.settings != "" {
				files[".harmonia-ci.toml"] = c.settings
			}
			_, commit := h.newProject("ends", files)
			e, _ := h.trigger("ends", "", commit)
			// a and b are reported and ingested (with jobs) before Nix gets stuck in zslow.
			h.waitAttrs(e.ID, 2)
			before := h.attrs(e.ID)
			for _, name := range []string{"a", "b"} {
				if before[name].JobStatus != status.JobPending {
					t.Fatalf("%s: %+v before the end, want a pending job", name, before[name])
				}
			}
			pid := children.last()
			start := time.Now()
			c.act(t, h, e.ID, pid)

			end := h.waitStatus(e.ID, c.status)
			if !strings.Contains(end.Error, c.errWant) {
				t.Errorf("error %q, want it to contain %q", end.Error, c.errWant)
			}
			if end.FinishedAt == nil || end.StartedAt == nil {
				t.Fatalf("started_at %v, finished_at %v: want both set", end.StartedAt, end.FinishedAt)
			}
			if d := end.FinishedAt.Sub(*end.StartedAt); d < c.atLeast {
				t.Errorf("ran for %s, want at least %s", d, c.atLeast)
			}
			waitNixGone(t, pid)
			waittest.For(t, 10*time.Second, func() bool { return ev.Running() == 0 }, "the evaluator to let go of the evaluation")
			if d := time.Since(start); d > c.stopWithin {
				t.Errorf("took %s to stop, want at most %s", d, c.stopWithin)
			}
			for _, o := range []string{"succeeded", "failed", "timeout", "cancelled", "released"} {
				want := 0.0
				if o == c.outcome {
					want = 1
				}
				finished, timed := outcomeSeries(t, reg, o)
				if finished != want || float64(timed) != want {
					t.Errorf("outcome %s: counted %v, timed %d; want %v", o, finished, timed, want)
				}
			}
			if n := h.queryInt(`SELECT count(*) FROM eval_attrs WHERE eval_id = $1`, e.ID); n != 0 {
				t.Errorf("%d attributes left", n)
			}
			for _, name := range []string{"a", "b"} {
				if s := h.jobStatus(before[name].DrvPath); s != status.JobCancelled {
					t.Errorf("job of %s is %s, want cancelled: nothing else needs it", name, s)
				}
			}
			if n := h.queryInt(`SELECT count(*) FROM build_jobs WHERE status = 'pending'`); n != 0 {
				t.Errorf("%d pending jobs left", n)
			}
			// The row stays as the end left it.
			if again := h.get(e.ID); again.Status != end.Status || again.Error != end.Error {
				t.Errorf("evaluation changed after it ended: %+v, then %+v", end, again)
			}
		})
	}
}

// Two evaluators on one database share twelve evaluations: each is run once, by the node that
// claimed it, in one attempt.
func TestTwoEvaluators(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	// The spec of every walk, as the node's walks record it in the project's HOME (the one
	// place a walk may write), under the node's state directory.
	states := map[string]string{}
	repo, _ := h.newProject("many", map[string]string{"ci.nix": h.lib() + `{ base = mk "base" [ ]; }`})
	ids := map[string]int64{} // commit → evaluation
	for i := range 12 {
		branch := fmt.Sprintf("b%02d", i)
		repo.Git("checkout", "-q", "-b", branch, "main")
		commit := repo.Commit(branch, map[string]string{"ci.nix": h.lib() + fmt.Sprintf(`
let base = mk "base" [ ]; in { inherit base; own = mk "own-%d" [ base ]; }`, i)})
		e, created := h.trigger("many", branch, commit)
		if !created {
			t.Fatalf("%s: evaluation not created", branch)
		}
		ids[commit] = e.ID
	}
	// Both start on a full queue.
	nodes := []string{"ev-a", "ev-b"}
	for _, n := range nodes {
		states[n] = reachableDir(t)
		h.startEvaluator(n, func(c *eval.Config) {
			c.StateDir = states[n]
			c.Runner = &eval.NixRunner{Bin: recordingNix(t, n)}
		})
	}
	for _, id := range ids {
		h.waitSucceeded(id)
	}
	ran := walked(t, states)
	perNode := map[string]int{}
	for commit, id := range ids {
		e := h.get(id)
		if e.Attempt != 1 || !slices.Contains(nodes, e.ClaimedBy) {
			t.Errorf("evaluation %d: attempt %d claimed by %q, want attempt 1 by one of %q", id, e.Attempt, e.ClaimedBy, nodes)
		}
		if by := ran[commit]; len(by) != 1 || by[0] != e.ClaimedBy {
			t.Errorf("evaluation %d (claimed by %s) was run by %q, want exactly once by its claimer", id, e.ClaimedBy, by)
		}
		perNode[e.ClaimedBy]++
		if got := h.attrNames(id); !slices.Equal(got, []string{"base", "own"}) {
			t.Errorf("evaluation %d: attributes %q", id, got)
		}
	}
	t.Logf("evaluations per node: %v", perNode)
	if len(perNode) != 2 {
		t.Errorf("evaluations per node %v: want both evaluators to take part", perNode)
	}
	if n := h.queryInt(`SELECT count(*) FROM build_jobs`); n != 13 {
		t.Errorf("%d build jobs, want 13 (base once, and each own-N)", n)
	}
}

// recordingNix is a nix-instantiate for node's runner that copies the spec file of each walk
// into its HOME (as walk-NODE_RANDOM; every walk is pid 1 of its view) before it runs Nix.
func recordingNix(t *testing.T, node string) string {
	t.Helper()
	nixBin, err := exec.LookPath("nix-instantiate")
	if err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf(`#!/bin/sh
prev=
for a in "$@"; do
  if [ "$prev" = specFile ]; then cp "$a" "$(mktemp "$HOME/walk-%s_XXXXXXXX")" || exit 1; fi
  prev=$a
done
exec '%s' "$@"
`, node, nixBin)
	p := filepath.Join(reachableDir(t), "nix-instantiate") // run by the evaluation user
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// walked reads what recordingNix recorded in the projects' HOMEs under each node's state
// directory: commit → the nodes that walked it.
func walked(t *testing.T, states map[string]string) map[string][]string {
	t.Helper()
	var files []string
	for _, dir := range states {
		found, err := filepath.Glob(filepath.Join(dir, "eval-home", "*", "walk-*_*"))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, found...)
	}
	ran := map[string][]string{}
	for _, f := range files {
		node, _, ok := strings.Cut(strings.TrimPrefix(filepath.Base(f), "walk-"), "_")
		b, err := os.ReadFile(f)
		if err != nil || !ok {
			t.Fatalf("walk record %s: %v", f, err)
		}
		var spec struct {
			Rev   string   `json:"rev"`
			Probe []string `json:"probe"`
		}
		if err := json.Unmarshal(b, &spec); err != nil {
			t.Fatalf("walk record %s: %v", f, err)
		}
		if spec.Probe == nil {
			ran[spec.Rev] = append(ran[spec.Rev], node)
		}
	}
	return ran
}

// An evaluation reaped from a node that went silent is run again elsewhere; the old runner
// changes nothing any more: its status watcher stops it, and a write it still tries is
// refused. Nothing of the first attempt remains once the second succeeds.
func TestReapedEvaluation(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// statusInterval of the old node: short, its watcher stops it; long, it only learns
		// from the write it tries when its Nix gets going again.
		statusInterval time.Duration
	}{
		{"watcher", 100 * time.Millisecond},
		{"late-write", time.Hour},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			g := newGate(t)
			// Evaluated where the search path has hci-old-node (the old node), zgated waits on
			// the gate.
			repo, commit := h.newProject("reaped", map[string]string{"ci.nix": h.lib() + `
let old = builtins.any (e: e.prefix == "hci-old-node") builtins.nixPath; a = mk "a" [ ]; in {
  inherit a;
  b = mk "b" [ a ];
} // (if !old then { } else { zgated = mk ("gated" + builtins.substring 0 0 (` + g.expr() + `)) [ ]; })`})

			var oldGate cluster.InFlight
			var children pids
			old := h.startEvaluator("ev-old", func(cfg *eval.Config) {
				cfg.Gate = &oldGate
				cfg.StatusInterval = c.statusInterval
				cfg.Runner = &eval.NixRunner{OnStart: children.onStart, SearchPath: []string{"hci-old-node=/"}}
			})
			queuetest.InsertNode(t, h.pool, queuetest.Node{ID: "ev-old", Roles: []string{"evaluator"}})

			e, _ := h.trigger("reaped", "", commit)
			h.waitAttrs(e.ID, 2)
			if got := h.get(e.ID); got.Status != status.EvalRunning || got.ClaimedBy != "ev-old" || got.Attempt != 1 {
				t.Fatalf("before the reap: %+v", got)
			}
			firstAttrs := h.queryStrings(`SELECT id::text FROM eval_attrs WHERE eval_id = $1`, e.ID)
			oldPid := children.last()

			// The old node drains (claims nothing more) and goes silent; the reaper hands its
			// evaluation back to the queue.
			oldGate.Close()
			queuetest.Backdate(t, h.pool, "ev-old", 5*time.Minute)
			leader := queuetest.StartLeader(t, h.pool, "maint", queuetest.SteadyElector(), nil)
			term := leader.NextTerm(t, 30*time.Second)
			reaper := queuetest.Task(t, queue.MaintenanceTasks(queue.MaintenanceConfig{}, h.logger), "reap-dead-claims")
			if n := queuetest.RunTask(t, h.pool, term, reaper); n != 1 {
				t.Fatalf("the reaper released %d claims, want the evaluation", n)
			}
			if got := h.get(e.ID); got.Status != status.EvalQueued {
				t.Fatalf("after the reap: %+v, want queued", got)
			}

			if c.name == "watcher" {
				// Nix is still stuck at the gate: only the watcher can stop it.
				waitNixGone(t, oldPid)
				waittest.For(t, 10*time.Second, func() bool { return old.Running() == 0 }, "the old evaluator to stop")
				if got := h.get(e.ID); got.Status != status.EvalQueued {
					t.Fatalf("the old evaluator changed the reaped evaluation: %+v", got)
				}
			}

			h.startEvaluator("ev-new")
			done := h.waitSucceeded(e.ID)
			if done.Attempt != 2 || done.ClaimedBy != "ev-new" {
				t.Fatalf("succeeded in attempt %d by %s, want attempt 2 by ev-new", done.Attempt, done.ClaimedBy)
			}
			attrs := h.attrs(e.ID)

			if c.name == "late-write" {
				// The old Nix gets going again and reports zgated; its ingestion is refused.
				g.open(t)
				waitNixGone(t, oldPid)
				waittest.For(t, 10*time.Second, func() bool { return old.Running() == 0 }, "the old evaluator to stop")
				// It got as far as publishing zgated's .drv (the step before its ingestion
				// transaction): the signer refused it, as the evaluation is no longer this
				// attempt's, and nothing of it landed in the cache or the database.
				open := t.TempDir()
				if err := os.WriteFile(filepath.Join(open, g.name), []byte("x"), 0o644); err != nil {
					t.Fatal(err)
				}
				gated := runNixEnv(t, nil, "nix-instantiate", filepath.Join(repo.Dir, "ci.nix"), "-A", "zgated",
					"-I", "hci-old-node=/", "-I", "hci-test-gates="+open)
				present, err := h.client.CacheLookup(h.ctx(), []string{gated})
				if err != nil {
					t.Fatal(err)
				}
				if len(present) != 0 {
					t.Errorf("the signer published %s for an attempt that no longer holds its evaluation", gated)
				}
				if n := h.queryInt(`SELECT count(*) FROM derivations WHERE drv_path = $1`, gated); n != 0 {
					t.Error("the old attempt's late batch was ingested")
				}
			}

			after := h.get(e.ID)
			if after.Status != status.EvalSucceeded || after.Attempt != 2 || after.ClaimedBy != "ev-new" || after.Error != "" ||
				after.FinishedAt == nil || !after.FinishedAt.Equal(*done.FinishedAt) {
				t.Errorf("the old evaluator changed the evaluation: %+v, was %+v", after, done)
			}
			if got := slices.Sorted(maps.Keys(h.attrs(e.ID))); !slices.Equal(got, []string{"a", "b"}) || !maps.EqualFunc(attrs, h.attrs(e.ID), func(x, y evaluation.AttrResult) bool { return x.DrvPath == y.DrvPath }) {
				t.Errorf("attributes %q after the second attempt, want a and b", got)
			}
			for _, id := range h.queryStrings(`SELECT id::text FROM eval_attrs WHERE eval_id = $1`, e.ID) {
				if slices.Contains(firstAttrs, id) {
					t.Errorf("eval_attrs row %s of the first attempt remains", id)
				}
			}
		})
	}
}

// runCmd runs a command and returns its combined output.
func runCmd(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}

// outcomeSeries reads an outcome's harmonia_ci_evaluations_finished_total and the sample count of
// its harmonia_ci_evaluation_duration_seconds.
func outcomeSeries(t *testing.T, reg *prometheus.Registry, outcome string) (finished float64, timed uint64) {
	t.Helper()
	return metricstest.Value(t, reg, "harmonia_ci_evaluations_finished_total", "outcome", outcome),
		uint64(metricstest.Value(t, reg, "harmonia_ci_evaluation_duration_seconds", "outcome", outcome))
}

// TestFlakeWithLocalInputs: a flake whose flake.lock locks an input inside its own repository
// (path:./lib), as `nix flake lock` of the Nix at hand wrote it, is evaluated with that input.
func TestFlakeWithLocalInputs(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.startEvaluator("ev-1")
	sys := nixSystem(t)
	repo, _ := h.newProject("locked", map[string]string{
		"lib/flake.nix": fmt.Sprintf(`{ outputs = { self }: { greeting = "hello from lib %s"; }; }`, h.salt),
		"flake.nix": fmt.Sprintf(`{
  inputs.lib.url = "path:./lib";
  outputs = { self, lib }: {
    checks.%[1]s.greet = builtins.derivation { name = "greet"; system = %[1]q; builder = "/bin/sh";
      args = [ "-c" "echo ${lib.greeting} > $out" ]; };
  };
}`, sys),
	})
	commit := repo.LockFlake()
	if _, ok, err := (&gitrepo.Mirror{Dir: filepath.Join(repo.Dir, ".git")}).ReadFile(h.ctx(), commit, "flake.lock"); err != nil || !ok {
		t.Fatalf("flake.lock not committed: %v", err)
	}
	e, _ := h.trigger("locked", "", commit)
	h.waitSucceeded(e.ID)
	a := h.attrs(e.ID)["checks."+sys+".greet"]
	if a.DrvPath == "" {
		t.Fatalf("checks.%s.greet: %+v, want a derivation", sys, a)
	}
	d, err := nix.ReadDerivation("", a.DrvPath)
	if err != nil {
		t.Fatal(err)
	}
	if want := "hello from lib " + h.salt; !strings.Contains(strings.Join(d.Args, " "), want) {
		t.Errorf("the derivation's builder says %q, not the locked input's %q", d.Args, want)
	}
}
