package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/eval"
	"github.com/harmonia-ci/harmonia-ci/internal/nixgen"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// unitsProject is a project large enough to be cut into units at a split threshold of 10: three
// recurseForDerivations sets of 40 members and 20 top-level attributes, each member slow to
// evaluate (a fold over a long list), a few throwing, all on shared dependencies.
func unitsProject(salt string) string {
	return nixgen.Lib(salt) + `
let
  slow = i: builtins.foldl' (a: b: a + b) i (builtins.genList (x: x) 150000);
  shared = builtins.genList (i: mk "shared-${toString i}" [ ]) 4;
  member = set: i:
    if i == 17 then throw "${set} ${toString i} is broken"
    else mk "${set}-${toString i}-${toString (slow i)}" [ (builtins.elemAt shared (i - (i / 4) * 4)) ];
  set = name: n: builtins.listToAttrs (builtins.genList (i: { name = "m${toString i}"; value = member name i; }) n)
    // { recurseForDerivations = true; };
in builtins.listToAttrs (builtins.genList (i: { name = "top${toString i}"; value = member "top" i; }) 20) // {
  alpha = set "alpha" 40;
  beta = set "beta" 40;
  gamma = set "gamma" 40;
}`
}

// Two evaluator processes on one evaluation: the units its claimant's walk splits off are
// claimed by both, and the evaluation's attributes, derivations and jobs are those a single
// walker finds, each attribute recorded once. Killed with SIGKILL while it walks a unit, the
// helping node's units are put back by the reaper once it is dead and walked by the claimant;
// the evaluation still succeeds, at its first attempt, with the same results.
func TestTwoEvaluatorNodesOneEvaluation(t *testing.T) {
	requireNix(t)
	nixtest.RequireNix(t)
	t.Parallel()
	salt := fmt.Sprint(time.Now().UnixNano())
	want := walkAlone(t, unitsProject(salt))
	for _, kill := range []bool{false, true} {
		name := "both walk"
		if kill {
			name = "helper killed"
		}
		t.Run(name, func(t *testing.T) { twoEvaluatorNodes(t, salt, want, kill) })
	}
}

// walkAlone walks project with one walker, outside any node: its attributes, as
// "drv <path> error <message>" by name.
func walkAlone(t *testing.T, project string) map[string]string {
	t.Helper()
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "ci.nix"), []byte(project), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	got := map[string]string{}
	r := &eval.NixRunner{Home: t.TempDir(), Workers: 1}
	err := r.Walk(ctx, eval.Spec{Source: src, Mode: "file", File: "ci.nix", Roots: [][]string{{}}, Force: 1}, func(a eval.Attr) error {
		got[a.Name] = fmt.Sprintf("drv %s error %q", a.DrvPath, a.Error)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func twoEvaluatorNodes(t *testing.T, salt string, want map[string]string, kill bool) {
	dir := t.TempDir()
	cfg, env, _ := signerConfig(t, dir, "e2e-units-1", "local")
	base, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg = proctest.WriteFile(t, "units-node.toml", string(base)+
		"[queue]\nreap_interval = \"500ms\"\n[eval]\npoll_interval = \"200ms\"\nworkers = 1\nsplit_above = 10\nhelp_others = true\n")
	f := newFixture(t, "")
	nodes := map[string]string{"infra": "frontend,signer,cache", "eval-1": "evaluator", "eval-2": "evaluator"}
	for id, roles := range nodes {
		f.procs[id] = proctest.Start(t, id, nodeEnv(t, env, id, roles), "serve", "--config", cfg, "--database-url", f.dbURL, "--node-id", id,
			"--roles", roles, "--listen", "127.0.0.1:0", "--state-dir", filepath.Join(stateDir(t), id))
	}
	for id := range nodes {
		proctest.WaitFor(t, 30*time.Second, id+" active", func() bool { return f.nodeStatus(id) == status.NodeActive })
	}
	cli := newCLI(t, f)
	repo := nixtest.NewRepo(t)
	repo.Commit("init", map[string]string{"ci.nix": unitsProject(salt)})
	cli.ok("project", "add", "units", "--repo", repo.Dir)
	id := evalID(t, cli.ok("eval", "units"))

	ctx := context.Background()
	queryInt := func(sql string, args ...any) int {
		t.Helper()
		var n int
		if err := f.pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	var owner string
	proctest.WaitFor(t, 60*time.Second, "the evaluation claimed", func() bool {
		return f.pool.QueryRow(ctx, `SELECT claimed_by FROM evaluations WHERE id = $1 AND status = 'running'`, id).Scan(&owner) == nil
	})
	helper := "eval-1"
	if owner == helper {
		helper = "eval-2"
	}
	if kill {
		// Killed while it walks a unit, after it committed attributes of one.
		proctest.WaitFor(t, 90*time.Second, helper+" walking a unit with attributes committed", func() bool {
			return queryInt(`SELECT count(*) FROM eval_units u WHERE u.eval_id = $1 AND u.claimed_by = $2 AND u.status = 'running'`, id, helper) > 0 &&
				queryInt(`SELECT count(*) FROM eval_attrs a JOIN eval_units u ON u.id = a.unit_id WHERE a.eval_id = $1 AND u.claimed_by = $2`, id, helper) > 0
		})
		f.procs[helper].Signal(t, syscall.SIGKILL)
		f.procs[helper].Wait(t, 10*time.Second)
	}
	proctest.WaitFor(t, 3*time.Minute, "the evaluation to end", func() bool {
		if p := f.procs[owner]; p.Exited() {
			t.Fatalf("%s exited:\n%s", owner, p.Logs())
		}
		var st status.EvalStatus
		if err := f.pool.QueryRow(ctx, `SELECT status FROM evaluations WHERE id = $1`, id).Scan(&st); err != nil {
			t.Fatal(err)
		}
		return st.Terminal()
	})
	var st status.EvalStatus
	var attempt int
	var evalErr string
	if err := f.pool.QueryRow(ctx, `SELECT status, attempt, COALESCE(error, '') FROM evaluations WHERE id = $1`, id).Scan(&st, &attempt, &evalErr); err != nil {
		t.Fatal(err)
	}
	if st != status.EvalSucceeded || attempt != 1 {
		t.Fatalf("evaluation %s at attempt %d (error %q), want succeeded at attempt 1\n%s:\n%s", st, attempt, evalErr, owner, f.procs[owner].Logs())
	}

	// The same attributes as one walker's, each once (eval_attrs is keyed by name: a second
	// report would be dropped, so every unit's attributes are counted against the walk's).
	rows, err := f.pool.Query(ctx, `SELECT attr, COALESCE(drv_path, ''), COALESCE(error, '') FROM eval_attrs WHERE eval_id = $1`, id)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for rows.Next() {
		var name, drv, msg string
		if err := rows.Scan(&name, &drv, &msg); err != nil {
			t.Fatal(err)
		}
		got[name] = fmt.Sprintf("drv %s error %q", drv, msg)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, n := range slices.Sorted(maps.Keys(want)) {
		if got[n] != want[n] {
			t.Errorf("%s: %s, one walker: %s", n, got[n], want[n])
		}
	}
	if len(got) != len(want) || len(want) != 20+3*40 {
		t.Errorf("%d attributes, one walker %d, want %d", len(got), len(want), 20+3*40)
	}
	// Every derivation the attributes reach, and a job for each, once.
	var drvs []string
	for _, a := range want {
		if p, _, _ := strings.Cut(strings.TrimPrefix(a, "drv "), " "); p != "" {
			drvs = append(drvs, p)
		}
	}
	closure := drvClosureOf(t, drvs)
	if n := queryInt(`SELECT count(*) FROM derivations WHERE drv_path = ANY($1)`, closure); n != len(closure) || queryInt(`SELECT count(*) FROM derivations`) != len(closure) {
		t.Errorf("%d derivations recorded, %d of the %d of the attributes' closure", queryInt(`SELECT count(*) FROM derivations`), n, len(closure))
	}
	if n, distinct := queryInt(`SELECT count(*) FROM build_jobs`), queryInt(`SELECT count(DISTINCT drv_path) FROM build_jobs`); n != len(closure) || distinct != n {
		t.Errorf("%d build jobs (%d derivations), want one for each of the %d derivations", n, distinct, len(closure))
	}

	// Both nodes walked units; every unit is done.
	if n := queryInt(`SELECT count(*) FROM eval_units WHERE eval_id = $1 AND status <> 'done'`, id); n != 0 {
		t.Errorf("%d units not done", n)
	}
	if kill {
		if n := queryInt(`SELECT count(*) FROM eval_units WHERE eval_id = $1 AND attempt > 1 AND claimed_by = $2`, id, owner); n == 0 {
			t.Errorf("no unit of the killed %s reclaimed by %s", helper, owner)
		}
		if !strings.Contains(f.procs["infra"].Logs(), "put back the evaluation units of dead nodes") {
			t.Errorf("the reaper did not put back the killed node's units")
		}
		return
	}
	for _, node := range []string{owner, helper} {
		if n := queryInt(`SELECT count(*) FROM eval_units WHERE eval_id = $1 AND claimed_by = $2`, id, node); n == 0 {
			t.Errorf("%s walked no unit", node)
		}
	}
	// What each node ingested, as it logs it, adds up to the attributes: none sent twice (the
	// table would have dropped a second copy silently).
	ingested := 0
	for _, m := range ingestedRE.FindAllStringSubmatch(f.procs[owner].Logs()+f.procs[helper].Logs(), -1) {
		n, err := strconv.Atoi(m[1])
		if err != nil {
			t.Fatal(err)
		}
		ingested += n
	}
	if ingested != len(want) {
		t.Errorf("the nodes ingested %d attributes in all, want %d", ingested, len(want))
	}
}

// ingestedRE finds the attributes an evaluator node ingested for an evaluation, as its claimant
// or as a helper, in its log.
var ingestedRE = regexp.MustCompile(`msg="(?:evaluation succeeded|helped with the evaluation[^"]*)".* attrs=(\d+)`)

// drvClosureOf is the closure of drvs, as nix-store lists it.
func drvClosureOf(t *testing.T, drvs []string) []string {
	t.Helper()
	out := nixOut(t, "nix-store", append([]string{"-qR"}, drvs...)...)
	var closure []string
	for l := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		if strings.HasSuffix(l, ".drv") {
			closure = append(closure, l)
		}
	}
	return closure
}
