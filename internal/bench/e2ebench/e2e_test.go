package e2ebench

import (
	"context"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
)

// TestE2ESmoke runs `bench e2e` on a tiny DAG: every job is built by the cluster and accounted
// for. It checks that the benchmark works, not the figures.
func TestE2ESmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a cluster and real derivations")
	}
	nixtest.RequireNix(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := E2E(ctx, E2EOptions{Derivations: 12, Width: 6, Builders: 2, Slots: 1, Workload: E2ETrivial, Samples: 2})
	if err != nil {
		t.Fatal(err)
	}
	w := r.Trivial
	if w == nil || r.Sleep != nil {
		t.Fatalf("workloads: trivial %v, sleep %v; want only trivial", w, r.Sleep)
	}
	if w.Jobs != 12 || w.Steps.Total.N != 12 || w.Steps.Build.N != 12 {
		t.Errorf("jobs %d, timed %d, with build timings %d; want 12", w.Jobs, w.Steps.Total.N, w.Steps.Build.N)
	}
	if w.BestNix <= 0 || w.BestCluster <= 0 || w.PlainBuild.N != 2 || len(w.Probe) == 0 {
		t.Errorf("missing figures: plain %.2f s, cluster %.2f s, plain builds %d, probe %d steps",
			w.BestNix, w.BestCluster, w.PlainBuild.N, len(w.Probe))
	}
	var built int
	for _, n := range w.PerBuilder {
		built += n
	}
	if built != 12 {
		t.Errorf("jobs per builder %v: want 12 in all", w.PerBuilder)
	}
}

// TestE2EDeepSmoke runs the deep workload small: one run per queue order, every job accounted
// for in the lower bound. It checks that the comparison works, not the figures.
func TestE2EDeepSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two clusters and real derivations")
	}
	nixtest.RequireNix(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	r, err := E2E(ctx, E2EOptions{Builders: 2, Slots: 1, Workload: E2EDeep, DeepProjects: 2, DeepLeaves: 3, DeepChain: 3, DeepSleep: 0.1})
	if err != nil {
		t.Fatal(err)
	}
	w := r.Deep
	if w == nil || r.Trivial != nil || r.Sleep != nil {
		t.Fatalf("workloads: deep %v, trivial %v, sleep %v; want only deep", w, r.Trivial, r.Sleep)
	}
	if len(w.Runs) != 2 || w.FIFO == nil || w.CriticalPath == nil || w.CriticalPathToFIFO <= 0 {
		t.Fatalf("runs %+v; want one per order and their comparison", w.Runs)
	}
	for _, run := range w.Runs {
		// Three links of at least 0.1 s each; the work of 12 jobs over 2 slots.
		if run.CriticalPathSeconds < 0.3 || run.WorkPerSlotSeconds < 0.6 || run.LowerBoundSeconds < run.CriticalPathSeconds ||
			run.MakespanSeconds < run.LowerBoundSeconds || run.Ratio < 1 {
			t.Errorf("%s: makespan %.2f s, critical path %.2f s, work ÷ slots %.2f s, bound %.2f s, ratio %.2f: inconsistent",
				run.Order, run.MakespanSeconds, run.CriticalPathSeconds, run.WorkPerSlotSeconds, run.LowerBoundSeconds, run.Ratio)
		}
	}
}
