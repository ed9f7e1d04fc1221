package eval_test

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/eval"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// A new commit on a branch cancels the evaluation still running there, and the pending jobs
// only it needed; jobs the new evaluation needs too stay. Merge-queue commits never supersede
// each other.
func TestSupersede(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	var children pids
	h.startEvaluator("ev-1", func(c *eval.Config) { c.Runner = &eval.NixRunner{OnStart: children.onStart} })
	g := newGate(t)
	repo, c1 := h.newProject("super", map[string]string{"ci.nix": h.lib() + `{
  common = mk "common" [ ];
  onlyA = mk "only-a" [ ];
  zgated = ` + g.drv("gated", h.salt) + `;
}`})
	a, _ := h.trigger("super", "", c1)
	h.waitAttrs(a.ID, 2)
	pidA := children.last()
	before := h.attrs(a.ID)
	common, onlyA := before["common"], before["onlyA"]
	for _, x := range []evaluation.AttrResult{common, onlyA} {
		if x.JobStatus != status.JobPending {
			t.Fatalf("%s: %+v, want a pending job", x.Attr, x)
		}
	}

	c2 := repo.Commit("next", map[string]string{"ci.nix": h.lib() + `{
  common = mk "common" [ ];
  onlyB = mk "only-b" [ ];
}`})
	b, created := h.trigger("super", "", c2)
	if !created || b.Status != status.EvalQueued {
		t.Fatalf("the new commit's evaluation: %+v created=%v, want a new queued one", b, created)
	}
	got := h.get(a.ID)
	if want := fmt.Sprintf("superseded by evaluation %d", b.ID); got.Status != status.EvalCancelled || got.Error != want || got.FinishedAt == nil {
		t.Fatalf("the superseded evaluation: status %s, error %q, finished %v; want cancelled, %q, finished", got.Status, got.Error, got.FinishedAt, want)
	}
	if s := h.jobStatus(onlyA.DrvPath); s != status.JobCancelled {
		t.Errorf("only A needed only-a, whose job is %s, want cancelled", s)
	}
	waitNixGone(t, pidA)

	h.waitSucceeded(b.ID)
	after := h.attrs(b.ID)
	if after["common"].DrvPath != common.DrvPath || after["common"].JobID != common.JobID || after["common"].JobStatus != status.JobPending {
		t.Errorf("common after B: %+v, want A's job %d, pending", after["common"], common.JobID)
	}
	if after["onlyB"].JobStatus != status.JobPending {
		t.Errorf("onlyB: %+v, want a pending job", after["onlyB"])
	}
	if s := h.jobStatus(onlyA.DrvPath); s != status.JobCancelled {
		t.Errorf("only-a's job is %s after B, want cancelled", s)
	}
	if n := h.queryInt(`SELECT count(*) FROM eval_attrs WHERE eval_id = $1`, a.ID); n != 0 {
		t.Errorf("%d attributes of the superseded evaluation left", n)
	}
	if got := h.get(a.ID); got.Status != status.EvalCancelled {
		t.Errorf("the superseded evaluation is %s now", got.Status)
	}

	// A merge queue tests each of its commits: the second does not cancel the first.
	mq := "gh-readonly-queue/main/pr-1-0123456789abcdef"
	repo.Git("checkout", "-q", "-b", mq)
	var ids []int64
	for i := range 2 {
		commit := repo.Commit(fmt.Sprintf("queued %d", i), map[string]string{"ci.nix": h.lib() + fmt.Sprintf(`{
  common = mk "common" [ ];
  candidate = mk "candidate-%d" [ ];
}`, i)})
		e, created := h.trigger("super", mq, commit)
		if !created {
			t.Fatalf("merge-queue commit %d: not created", i)
		}
		ids = append(ids, e.ID)
	}
	if first := h.get(ids[0]); first.Status == status.EvalCancelled {
		t.Fatalf("the first merge-queue evaluation was superseded: %+v", first)
	}
	for _, id := range ids {
		h.waitSucceeded(id)
	}
}

// A commit whose tree a succeeded evaluation of the project already evaluated is not evaluated
// again; requests are idempotent, also when they race.
func TestTreeHashDedup(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.startEvaluator("ev-1")
	repo, c0 := h.newProject("dedup", map[string]string{"ci.nix": h.lib() + `{ x = mk "x0" [ ]; }`})
	c1 := repo.Commit("change", map[string]string{"ci.nix": h.lib() + `{ x = mk "x1" [ ]; y = mk "y1" [ ]; bad = throw "no"; }`})
	e1, created := h.trigger("dedup", "", c1)
	if !created || e1.Status != status.EvalQueued || e1.TreeHash == "" {
		t.Fatalf("first evaluation: %+v created=%v", e1, created)
	}
	h.waitSucceeded(e1.ID)
	attrs1, err := evaluation.Attrs(h.ctx(), h.pool, e1.ID)
	if err != nil {
		t.Fatal(err)
	}

	// Same tree, other commits: amended with another message, and cherry-picked (-x changes
	// the message too) onto the same parent on another branch.
	repo.Git("commit", "-q", "--amend", "-m", "other message")
	amended := repo.Git("rev-parse", "HEAD")
	repo.Git("checkout", "-q", "-b", "feature", c0)
	repo.Git("cherry-pick", "-x", c1)
	picked := repo.Git("rev-parse", "HEAD")
	tree := repo.Git("rev-parse", c1+"^{tree}")
	for _, c := range []string{amended, picked} {
		if c == c1 || repo.Git("rev-parse", c+"^{tree}") != tree {
			t.Fatalf("commit %s: want a new commit with the tree %s of %s", c, tree, c1)
		}
	}
	for _, c := range []struct{ name, branch, commit string }{
		{"amended", "main", amended},
		{"cherry-picked", "feature", picked},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := h.sub(t)
			e, created := h.trigger("dedup", c.branch, c.commit)
			if !created || e.Status != status.EvalSkipped || e.SkippedReason != "tree_hash_hit" || e.ReusesEvalID == nil ||
				*e.ReusesEvalID != e1.ID || e.FinishedAt == nil || e.TreeHash != e1.TreeHash {
				t.Fatalf("%+v created=%v, want a new evaluation skipped as a tree hash hit reusing %d", e, created, e1.ID)
			}
			attrs, err := evaluation.Attrs(h.ctx(), h.pool, e.ID)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(attrs, attrs1, func(a, b evaluation.AttrResult) bool {
				return a.Attr == b.Attr && a.DrvPath == b.DrvPath && a.Error == b.Error && a.JobID == b.JobID
			}) {
				t.Errorf("attributes %+v, want a copy of %+v", attrs, attrs1)
			}
			again, created := h.trigger("dedup", c.branch, c.commit)
			if created || again.ID != e.ID {
				t.Errorf("the same request again: evaluation %d created=%v, want %d created=false", again.ID, created, e.ID)
			}
		})
	}

	// Another tree is evaluated; asking again changes nothing.
	repo.Git("checkout", "-q", "main")
	c2 := repo.Commit("another tree", map[string]string{"ci.nix": h.lib() + `{ x = mk "x2" [ ]; }`})
	e2, created := h.trigger("dedup", "", c2)
	if !created || e2.Status != status.EvalQueued || e2.ReusesEvalID != nil || e2.TreeHash == e1.TreeHash {
		t.Fatalf("another tree: %+v created=%v, want a new queued evaluation", e2, created)
	}
	again, created := h.trigger("dedup", "", c2)
	if created || again.ID != e2.ID {
		t.Fatalf("the same request again: evaluation %d created=%v, want %d created=false", again.ID, created, e2.ID)
	}
	h.waitSucceeded(e2.ID)
	if got := slices.Sorted(maps.Keys(h.attrs(e2.ID))); !slices.Equal(got, []string{"x"}) {
		t.Errorf("another tree: attributes %q", got)
	}

	// Racing requests for one commit make one evaluation.
	repo.Git("checkout", "-q", "-b", "racing", c0)
	c3 := repo.Commit("raced", map[string]string{"ci.nix": h.lib() + `{ x = mk "x3" [ ]; }`})
	const n = 8
	type result struct {
		e       evaluation.Evaluation
		created bool
		err     error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			e, created, err := eval.Trigger(h.ctx(), h.pool, eval.TriggerParams{Project: "dedup", Branch: "racing", Commit: c3, StateDir: h.triggerDir})
			results[i] = result{e, created, err}
		})
	}
	close(start)
	wg.Wait()
	createdN := 0
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("request %d: %v", i, r.err)
		}
		if r.e.ID != results[0].e.ID {
			t.Errorf("request %d: evaluation %d, request 0: %d", i, r.e.ID, results[0].e.ID)
		}
		if r.created {
			createdN++
		}
	}
	if createdN != 1 {
		t.Errorf("%d of %d racing requests created the evaluation, want 1", createdN, n)
	}
	if k := h.queryInt(`SELECT count(*) FROM evaluations WHERE commit_sha = $1`, c3); k != 1 {
		t.Errorf("%d evaluations of the raced commit, want 1", k)
	}
	h.waitSucceeded(results[0].e.ID)
}
