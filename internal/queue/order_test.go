package queue_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	qt "github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// enqueueOrdered enqueues ds for project in the given order.
func enqueueOrdered(t *testing.T, pool *pgxpool.Pool, project int64, order queue.Order, ds ...queue.Derivation) {
	t.Helper()
	_, err := queue.Enqueue(qt.Ctx(t, 30*time.Second), pool, queue.EnqueueParams{ProjectID: &project, Derivations: ds, Order: order})
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
}

// chainOf is the recorded dependent chain of the job of name.
func chainOf(t *testing.T, pool *pgxpool.Pool, name string) int64 {
	t.Helper()
	return qt.QueryInt(t, pool, `SELECT dependent_chain FROM build_jobs WHERE drv_path = $1`, qt.DrvPath(name))
}

// deepAndWide is leaves leaf-0..leaf-{n-1}, then a chain link-0 ← link-1 ← ... ← link-{depth-1}
// (link-0 is the base), enqueued leaves first.
func deepAndWide(leaves, depth int) []queue.Derivation {
	var ds []queue.Derivation
	for i := range leaves {
		ds = append(ds, qt.Drv(fmt.Sprintf("leaf-%d", i), sys))
	}
	for i := range depth {
		var in []string
		if i > 0 {
			in = []string{fmt.Sprintf("link-%d", i-1)}
		}
		ds = append(ds, qt.Drv(fmt.Sprintf("link-%d", i), sys, in...))
	}
	return ds
}

// TestClaimOrder: among a project's ready jobs of one priority, critical-path order claims the
// base of the longest chain of dependents first; fifo claims in enqueue order. Priority still
// comes first in both.
func TestClaimOrder(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		order queue.Order
		// bump raises one job's priority before claiming ("" for none).
		bump string
		want []string // the first claims, in order
	}{
		{"critical path", queue.OrderCriticalPath, "", []string{"link-0", "leaf-0", "leaf-1"}},
		{"fifo", queue.OrderFIFO, "", []string{"leaf-0", "leaf-1", "leaf-2"}},
		{"priority before the chain", queue.OrderCriticalPath, "leaf-2", []string{"leaf-2", "link-0", "leaf-0"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := dbtest.NewPool(t)
			project := qt.NewProject(t, pool, "p", 100)
			enqueueOrdered(t, pool, project, tc.order, deepAndWide(3, 4)...)
			if tc.bump != "" {
				qt.Exec(t, pool, `UPDATE build_jobs SET priority = 10 WHERE drv_path = $1`, qt.DrvPath(tc.bump))
			}
			var got []string
			for range tc.want {
				got = append(got, qt.NameOf(claimOne(t, pool, claimer("b")).DrvPath))
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("claimed %v, want %v", got, tc.want)
			}
		})
	}
}

// TestDependentChains: the chain a job records is the longest chain of jobs above it, within
// one enqueue and across enqueues that add dependents later (the evaluator enqueues in batches
// of attributes), and a job already built is no longer raised.
func TestDependentChains(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	project := qt.NewProject(t, pool, "p", 100)
	cp := queue.OrderCriticalPath
	// base ← mid ← top, and base ← side.
	enqueueOrdered(t, pool, project, cp,
		qt.Drv("base", sys), qt.Drv("mid", sys, "base"), qt.Drv("top", sys, "mid"), qt.Drv("side", sys, "base"))
	want := map[string]int64{"base": 2, "mid": 1, "top": 0, "side": 0}
	for name, n := range want {
		if got := chainOf(t, pool, name); got != n {
			t.Errorf("after one enqueue: %s has chain %d, want %d", name, got, n)
		}
	}
	// A later enqueue puts two more above side (side ← s1 ← s2), and re-sends mid, whose
	// job exists: base must now count the longer chain through side.
	enqueueOrdered(t, pool, project, cp,
		qt.Drv("mid", sys, "base"), qt.Drv("s1", sys, "side"), qt.Drv("s2", sys, "s1"))
	want = map[string]int64{"base": 3, "mid": 1, "top": 0, "side": 2, "s1": 1, "s2": 0}
	for name, n := range want {
		if got := chainOf(t, pool, name); got != n {
			t.Errorf("after a second enqueue: %s has chain %d, want %d", name, got, n)
		}
	}
	// Once base is built, it is not pending: a third enqueue above the chain raises only what
	// still waits.
	succeed(t, pool, claimOne(t, pool, claimer("b")))
	enqueueOrdered(t, pool, project, cp, qt.Drv("s3", sys, "s2"), qt.Drv("s4", sys, "s3"))
	want = map[string]int64{"base": 3, "side": 4, "s1": 3, "s2": 2, "s3": 1, "s4": 0}
	for name, n := range want {
		if got := chainOf(t, pool, name); got != n {
			t.Errorf("after a third enqueue: %s has chain %d, want %d", name, got, n)
		}
	}
	// With fifo nothing is recorded.
	enqueueOrdered(t, pool, project, queue.OrderFIFO, qt.Drv("f0", sys), qt.Drv("f1", sys, "f0"))
	if got := chainOf(t, pool, "f0"); got != 0 {
		t.Errorf("fifo enqueue: f0 has chain %d, want 0", got)
	}
}

// TestSucceedAndClaim: a success and the next claim in one transaction. The claim sees the
// dependents the success readied; a success whose claim no longer holds records nothing, and
// the jobs claimed with it are still returned, claimed by the node.
func TestSucceedAndClaim(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	project := qt.NewProject(t, pool, "p", 100)
	qt.Enqueue(t, pool, &project, qt.Drv("a", sys), qt.Drv("b", sys, "a"), qt.Drv("c", sys))
	a := claimOne(t, pool, claimer("n1"))
	c := claimOne(t, pool, claimer("n2"))
	if qt.NameOf(a.DrvPath) != "a" || qt.NameOf(c.DrvPath) != "c" {
		t.Fatalf("claimed %s and %s, want a and c", qt.NameOf(a.DrvPath), qt.NameOf(c.DrvPath))
	}
	out, next, err := queue.SucceedAndClaim(qt.Ctx(t, 30*time.Second), pool, a.Claim(), claimer("n1"), 2)
	if err != nil {
		t.Fatalf("SucceedAndClaim(a): %v", err)
	}
	if out.Status != status.JobSucceeded || qt.NameOf(out.DrvPath) != "a" || out.ProjectID == nil || *out.ProjectID != project {
		t.Fatalf("outcome %+v, want a succeeded for project %d", out, project)
	}
	if got := qt.Names(next); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("claimed with the success: %v, want [b] (readied by it)", got)
	}
	if j := qt.Job(t, pool, "b"); j.Status != status.JobBuilding || j.ClaimedBy == nil || *j.ClaimedBy != "n1" {
		t.Fatalf("b is %s, want building by n1", j)
	}
	// A stale success (n1 never held c) changes nothing and still claims for n1.
	qt.Enqueue(t, pool, &project, qt.Drv("d", sys))
	stale := c.Claim()
	stale.NodeID = "n1"
	_, next, err = queue.SucceedAndClaim(qt.Ctx(t, 30*time.Second), pool, stale, claimer("n1"), 1)
	if !qt.IsStale(err) {
		t.Fatalf("SucceedAndClaim with n2's claim as n1: %v, want ErrStale", err)
	}
	if got := qt.Names(next); !slices.Equal(got, []string{"d"}) {
		t.Fatalf("claimed with a stale success: %v, want [d]", got)
	}
	if s := qt.Status(t, pool, "c"); s != status.JobBuilding {
		t.Fatalf("c is %s after a stale success, want building", s)
	}
}

// TestDeferredChainRaise: enqueues that defer the raise leave the jobs below them as they were,
// and one RaiseDeferred over them then gives every chain the value raising at each enqueue
// would have given, on a graph that arrives inputs first as an evaluation's does, and raises
// the jobs that were there before, below them.
func TestDeferredChainRaise(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	project := qt.NewProject(t, pool, "p", 100)
	ctx := qt.Ctx(t, 30*time.Second)
	// layers 0..4 of three derivations each; each depends on two of the layer below. One copy
	// raised at every enqueue, one deferred.
	layer := func(prefix string, l int) []queue.Derivation {
		var ds []queue.Derivation
		for i := range 3 {
			var ins []string
			if l > 0 {
				ins = []string{fmt.Sprintf("%s-%d-%d", prefix, l-1, i), fmt.Sprintf("%s-%d-%d", prefix, l-1, (i+1)%3)}
			}
			ds = append(ds, qt.Drv(fmt.Sprintf("%s-%d-%d", prefix, l, i), sys, ins...))
		}
		return ds
	}
	var deferred []queue.Derivation
	var jobs []string
	for l := range 5 {
		enqueueOrdered(t, pool, project, queue.OrderCriticalPath, layer("now", l)...)
		ds := layer("later", l)
		if _, err := queue.Enqueue(ctx, pool, queue.EnqueueParams{ProjectID: &project, Derivations: ds,
			Order: queue.OrderCriticalPath, DeferRaise: true}); err != nil {
			t.Fatal(err)
		}
		deferred = append(deferred, ds...)
		for _, d := range ds {
			jobs = append(jobs, d.DrvPath)
		}
	}
	if got := chainOf(t, pool, "later-0-0"); got != 0 {
		t.Fatalf("before the raise, later-0-0 has chain %d; want 0 (each enqueue was one layer)", got)
	}
	// A job that was there before, below the deferred ones, is raised too.
	enqueueOrdered(t, pool, project, queue.OrderCriticalPath, qt.Drv("before", sys))
	more := qt.Drv("later-0-extra", sys, "before")
	enqueueDeferred := func(ds ...queue.Derivation) {
		t.Helper()
		if _, err := queue.Enqueue(ctx, pool, queue.EnqueueParams{ProjectID: &project, Derivations: ds,
			Order: queue.OrderCriticalPath, DeferRaise: true}); err != nil {
			t.Fatal(err)
		}
	}
	enqueueDeferred(more)
	top := qt.Drv("later-5-0", sys, "later-4-0", "later-0-extra")
	enqueueDeferred(top)
	deferred, jobs = append(deferred, more, top), append(jobs, more.DrvPath, top.DrvPath)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n, err := queue.RaiseDeferred(ctx, tx, deferred, jobs)
	if err == nil {
		err = tx.Commit(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	// The oracle: the longest chain of jobs above each deferred job, by recursion over the
	// deferred graph (before has no job above it but those).
	referrers := map[string][]string{}
	for _, d := range deferred {
		for _, in := range d.Inputs {
			referrers[in.DrvPath] = append(referrers[in.DrvPath], d.DrvPath)
		}
	}
	var above func(drv string) int64
	above = func(drv string) int64 {
		var best int64
		for _, r := range referrers[drv] {
			best = max(best, above(r)+1)
		}
		return best
	}
	var positive int64
	for _, d := range deferred {
		want := above(d.DrvPath)
		if want > 0 {
			positive++
		}
		if got := chainOf(t, pool, qt.NameOf(d.DrvPath)); got != want {
			t.Errorf("deferred %s: chain %d; want %d", qt.NameOf(d.DrvPath), got, want)
		}
	}
	if n != positive {
		t.Errorf("RaiseDeferred raised %d of the deferred jobs; want %d (each enqueue saw one layer)", n, positive)
	}
	if got, want := chainOf(t, pool, "before"), above(qt.DrvPath("before")); got != want || want != 2 {
		t.Errorf("before (enqueued earlier, below the deferred jobs): chain %d; want %d (2)", got, want)
	}
	// The copy raised at each enqueue agrees with the oracle too.
	for l := range 5 {
		for i := range 3 {
			if got, want := chainOf(t, pool, fmt.Sprintf("now-%d-%d", l, i)), int64(4-l); got != want {
				t.Errorf("layer %d job %d raised at each enqueue: chain %d; want %d", l, i, got, want)
			}
		}
	}
	// A second raise finds nothing to do.
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if n, err := queue.RaiseDeferred(ctx, tx, deferred, jobs); err != nil || n != 0 {
		t.Errorf("a second RaiseDeferred = %d, %v; want 0", n, err)
	}
}
