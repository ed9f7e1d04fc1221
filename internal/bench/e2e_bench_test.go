package bench

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
