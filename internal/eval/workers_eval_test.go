package eval_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/eval"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/metricstest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

// evaluated is what an evaluation left in the database: its attributes (name: derivation or
// error, job status), and every derivation and build job (with its readiness and chain).
type evaluated struct {
	attrs       map[string]string
	derivations []string
	jobs        []string
}

func (h *harness) evaluated(id int64) evaluated {
	h.t.Helper()
	out := evaluated{attrs: map[string]string{}}
	for n, a := range h.attrs(id) {
		out.attrs[n] = fmt.Sprintf("drv %s error %q job %s", a.DrvPath, a.Error, a.JobStatus)
	}
	out.derivations = sorted(h.queryStrings(`SELECT drv_path FROM derivations`))
	out.jobs = sorted(h.queryStrings(`SELECT drv_path || ' ' || status || ' ' || blocked_inputs || ' ' || dependent_chain FROM build_jobs`))
	return out
}

// An evaluation with 1, 2 or 4 workers records the same attributes, derivations, jobs and
// errors: each runs on a database of its own, on a project with throwing and uncatchable
// attributes, nested sets (large ones cut into units) and shared dependencies.
func TestWorkersIdenticalResults(t *testing.T) {
	t.Parallel()
	salt := salt(t)
	var first evaluated
	for _, workers := range []int{1, 2, 4} {
		h := newHarness(t)
		h.salt = salt
		h.startEvaluator("ev-1", func(c *eval.Config) {
			c.Workers = workers
			c.Runner = &eval.NixRunner{SplitAbove: 5}
		})
		_, commit := h.newProject("many", map[string]string{"ci.nix": eval.WorkersProject(salt)})
		e, _ := h.trigger("many", "", commit)
		h.waitSucceeded(e.ID)
		got := h.evaluated(e.ID)
		if workers == 1 {
			first = got
			if len(got.attrs) != 50 || !strings.Contains(got.attrs["big.inner.inner7"], "aborted 7") {
				t.Fatalf("one worker: %d attributes %v", len(got.attrs), got.attrs)
			}
			continue
		}
		for _, n := range slices.Sorted(maps.Keys(first.attrs)) {
			if got.attrs[n] != first.attrs[n] {
				t.Errorf("%d workers: %s: %s, one worker: %s", workers, n, got.attrs[n], first.attrs[n])
			}
		}
		if len(got.attrs) != len(first.attrs) {
			t.Errorf("%d workers: %d attributes, one worker %d", workers, len(got.attrs), len(first.attrs))
		}
		if !slices.Equal(got.derivations, first.derivations) {
			t.Errorf("%d workers: derivations %v, one worker %v", workers, got.derivations, first.derivations)
		}
		if !slices.Equal(got.jobs, first.jobs) {
			t.Errorf("%d workers: jobs %v, one worker %v", workers, got.jobs, first.jobs)
		}
	}
}

// A worker past eval.max_memory_per_worker is killed and restarted; the attribute it was on is
// retried alone, and fails with the limit's message when it goes past it again. The rest of the
// evaluation completes, and both restarts are counted.
func TestWorkerMemoryLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	reg := prometheus.NewRegistry()
	h.startEvaluator("ev-1", func(c *eval.Config) {
		c.Workers = 2
		c.Confinement.MaxMemoryPerWorker = 200 << 20
		c.Registerer = reg
	})
	_, commit := h.newProject("greedy", map[string]string{"ci.nix": h.lib() + `
let a = mk "a" [ ]; in {
  inherit a;
  greedy = mk (toString (builtins.length (builtins.genList (i: "item ${toString i}") 20000000))) [ ];
  z = mk "z" [ a ];
  set = { recurseForDerivations = true; c = mk "c" [ a ]; d = mk "d" [ ]; };
}`})
	e, _ := h.trigger("greedy", "", commit)
	h.waitSucceeded(e.ID)
	attrs := h.attrs(e.ID)
	if got := attrs["greedy"]; got.DrvPath != "" || !strings.Contains(got.Error, "exceeds eval.max_memory_per_worker (200 MiB)") {
		t.Errorf("greedy: %+v, want the per-worker limit's error", got)
	}
	for _, n := range []string{"a", "z", "set.c", "set.d"} {
		if a := attrs[n]; !strings.HasSuffix(a.DrvPath, ".drv") || a.JobStatus != status.JobPending {
			t.Errorf("%s: %+v, want a derivation with a pending job", n, a)
		}
	}
	if len(attrs) != 5 {
		t.Errorf("attributes %v, want 5", slices.Sorted(maps.Keys(attrs)))
	}
	if n := metricstest.Value(t, reg, "harmonia_ci_eval_worker_restarts_total"); n != 2 {
		t.Errorf("%v restarts counted, want 2: the walk, then greedy alone", n)
	}
	if n := h.queryInt(`SELECT worker_restarts FROM evaluations WHERE id = $1`, e.ID); n != 2 {
		t.Errorf("%d restarts recorded on the evaluation, want 2", n)
	}
	if n := h.queryInt(`SELECT workers * worker_memory FROM evaluations WHERE id = $1`, e.ID); n != 2*200<<20 {
		t.Errorf("workers × worker_memory %d recorded, want 2 × 200 MiB", n)
	}
}

// triggerGated triggers an evaluation of a project whose attributes a and b evaluate at once and
// whose set gated has eight members, each blocked on g; it returns once a and b are ingested.
func (h *harness) triggerGated(g *gate) evaluation.Evaluation {
	h.t.Helper()
	gated := make([]string, 8)
	for i := range gated {
		gated[i] = fmt.Sprintf("g%d = %s;", i, g.drv(fmt.Sprintf("gated-%d", i), h.salt))
	}
	_, commit := h.newProject("gated", map[string]string{"ci.nix": h.lib() + `
let a = mk "a" [ ]; in {
  inherit a;
  b = mk "b" [ a ];
  gated = { recurseForDerivations = true; ` + strings.Join(gated, "\n") + ` };
}`})
	e, _ := h.trigger("gated", "", commit)
	h.waitAttrs(e.ID, 2)
	return e
}

// An evaluation cancelled while several workers walk: every walker process stops and nothing
// more is ingested.
func TestCancelStopsEveryWorker(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	var children pids
	ev := h.startEvaluator("ev-1", func(c *eval.Config) {
		c.Workers = 4
		c.Runner = &eval.NixRunner{SplitAbove: 2, OnStart: children.onStart}
	})
	e := h.triggerGated(newGate(t))
	// Four walkers, each stuck on the gated member its unit starts with.
	var walking []int
	waittest.For(t, finishTimeout, func() bool {
		walking = children.alive()
		return len(walking) == 4
	}, "four walkers to run")
	h.cancelStopsAll(e.ID, walking, []*eval.Evaluator{ev}, &children)
}

// cancelStopsAll cancels evaluation id while walking (the walker processes of evs) walk it, and
// checks that they stop, every evaluator lets go, and nothing is left ingested.
func (h *harness) cancelStopsAll(id int64, walking []int, evs []*eval.Evaluator, children ...*pids) {
	t := h.t
	t.Helper()
	if err := evaluation.Cancel(h.ctx(), h.pool, id, "cancelled by the test"); err != nil {
		t.Fatal(err)
	}
	for _, p := range walking {
		waitNixGone(t, p)
	}
	for _, ev := range evs {
		waittest.For(t, 10*time.Second, func() bool { return ev.Running() == 0 }, "the evaluators to let go of the evaluation")
	}
	if got := h.get(id); got.Status != status.EvalCancelled {
		t.Errorf("status %s, want cancelled", got.Status)
	}
	if n := h.queryInt(`SELECT count(*) FROM eval_attrs WHERE eval_id = $1`, id); n != 0 {
		t.Errorf("%d attributes left", n)
	}
	if n := h.queryInt(`SELECT count(*) FROM derivations WHERE name LIKE 'gated-%'`); n != 0 {
		t.Errorf("%d gated derivations ingested", n)
	}
	for _, c := range children {
		for _, p := range c.alive() {
			t.Errorf("walker %d still runs", p)
		}
	}
}

// liveEvaluators registers ids as live evaluator nodes, as their heartbeats would: a claimant
// shares its units only when another evaluator is there to take them.
func (h *harness) liveEvaluators(ids ...string) {
	h.t.Helper()
	for _, id := range ids {
		h.exec(`INSERT INTO nodes (id, roles, endpoint, incarnation, last_seen)
VALUES ($1, '{evaluator}', 'http://127.0.0.1:1', gen_random_uuid(), now() + interval '1 hour')`, id)
	}
}

// Two evaluator nodes on one evaluation: the units the claimant's walk splits off are walked
// by both, and the evaluation records the same attributes, derivations, jobs and errors as one
// node with one worker, each attribute once.
func TestTwoNodesIdenticalResults(t *testing.T) {
	t.Parallel()
	salt := salt(t)
	single := newHarness(t)
	single.salt = salt
	single.startEvaluator("ev-1", func(c *eval.Config) { c.Workers = 1 })
	_, commit := single.newProject("many", map[string]string{"ci.nix": eval.WorkersProject(salt)})
	e, _ := single.trigger("many", "", commit)
	single.waitSucceeded(e.ID)
	want := single.evaluated(e.ID)

	h := newHarness(t)
	h.salt = salt
	h.liveEvaluators("ev-1", "ev-2")
	for _, id := range []string{"ev-1", "ev-2"} {
		h.startEvaluator(id, func(c *eval.Config) {
			c.Workers = 1
			c.HelpOthers = true
			c.Runner = &eval.NixRunner{SplitAbove: 2}
		})
	}
	_, commit = h.newProject("many", map[string]string{"ci.nix": eval.WorkersProject(salt)})
	e, _ = h.trigger("many", "", commit)
	h.waitSucceeded(e.ID)
	got := h.evaluated(e.ID)
	for _, n := range slices.Sorted(maps.Keys(want.attrs)) {
		if got.attrs[n] != want.attrs[n] {
			t.Errorf("%s: two nodes %s, one %s", n, got.attrs[n], want.attrs[n])
		}
	}
	if len(got.attrs) != len(want.attrs) {
		t.Errorf("two nodes: %d attributes, one %d", len(got.attrs), len(want.attrs))
	}
	if !slices.Equal(got.derivations, want.derivations) {
		t.Errorf("two nodes: derivations %v, one %v", got.derivations, want.derivations)
	}
	if !slices.Equal(got.jobs, want.jobs) {
		t.Errorf("two nodes: jobs %v, one %v", got.jobs, want.jobs)
	}
	units := h.queryStrings(`SELECT claimed_by || ' ' || status FROM eval_units WHERE eval_id = $1`, e.ID)
	walkedBy := map[string]bool{}
	for _, u := range units {
		node, st, _ := strings.Cut(u, " ")
		walkedBy[node] = true
		if st != string(status.UnitDone) {
			t.Errorf("unit of %s left %s", node, st)
		}
	}
	if !walkedBy["ev-1"] || !walkedBy["ev-2"] {
		t.Errorf("units walked by %v, want both nodes: %q", slices.Sorted(maps.Keys(walkedBy)), units)
	}
	if n := h.queryInt(`SELECT count(*) FROM eval_attrs WHERE eval_id = $1 AND unit_id IS NOT NULL`, e.ID); n == 0 {
		t.Errorf("no attribute came from a unit")
	}
}

// eval.max_attrs bounds the evaluation, not each node's part of it: two nodes that each walk
// fewer attributes than the ceiling, together past it, fail the evaluation with its message.
func TestMaxAttrsAcrossNodes(t *testing.T) {
	t.Parallel()
	salt := salt(t)
	single := newHarness(t)
	single.salt = salt
	single.startEvaluator("ev-1", func(c *eval.Config) { c.Workers = 1 })
	_, commit := single.newProject("many", map[string]string{"ci.nix": eval.WorkersProject(salt)})
	e, _ := single.trigger("many", "", commit)
	single.waitSucceeded(e.ID)
	total := len(single.evaluated(e.ID).attrs)

	h := newHarness(t)
	h.salt = salt
	h.liveEvaluators("ev-1", "ev-2")
	for _, id := range []string{"ev-1", "ev-2"} {
		h.startEvaluator(id, func(c *eval.Config) {
			c.Workers, c.HelpOthers, c.MaxAttrs = 1, true, total-1
			c.Runner = &eval.NixRunner{SplitAbove: 2}
		})
	}
	_, commit = h.newProject("many", map[string]string{"ci.nix": eval.WorkersProject(salt)})
	e, _ = h.trigger("many", "", commit)
	got := h.waitStatus(e.ID, status.EvalFailed)
	if want := fmt.Sprintf("more than %d attributes (eval.max_attrs)", total-1); !strings.Contains(got.Error, want) {
		t.Errorf("error %q, want %q", got.Error, want)
	}
	t.Logf("units walked: %q", h.queryStrings(`SELECT claimed_by || ' ' || status FROM eval_units WHERE eval_id = $1`, e.ID))
}

// An evaluation cancelled while both nodes walk its units: every walker of both stops and
// nothing more is ingested.
func TestCancelStopsEveryNode(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.liveEvaluators("ev-1", "ev-2")
	var children [2]pids
	var evs []*eval.Evaluator
	for i, id := range []string{"ev-1", "ev-2"} {
		evs = append(evs, h.startEvaluator(id, func(c *eval.Config) {
			c.Workers = 2
			c.HelpOthers = true
			c.Runner = &eval.NixRunner{SplitAbove: 2, OnStart: children[i].onStart}
		}))
	}
	e := h.triggerGated(newGate(t))
	// Both nodes' walkers stuck on the gated members their units start with.
	waittest.For(t, finishTimeout, func() bool {
		return len(children[0].alive()) > 0 && len(children[1].alive()) > 0
	}, "walkers to run on both nodes")
	h.cancelStopsAll(e.ID, append(children[0].alive(), children[1].alive()...), evs, &children[0], &children[1])
}
