package gcbench

import (
	"context"
	"math"
	"os"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/minioserver"
)

// TestGCSmoke runs `bench gc` on a tiny cache: the collection scans every object, deletes
// exactly the dead ones and keeps the live ones (also beside derivations that were never built), on the local store and, if MinIO is
// installed (always in CI), on S3. It checks that the benchmark works, not the figures.
func TestGCSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and MinIO")
	}
	backends := []string{"local", "s3"}
	if _, err := minioserver.Find(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI installs MinIO: %v", err)
		}
		t.Logf("local backend only: %v", err)
		backends = backends[:1]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const objects = 2000
	r, err := GC(ctx, GCOptions{Objects: objects, LiveFraction: 0.4, Unbuilt: 0.05, Backends: backends, Workers: 8, Writers: 8, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(r.Runs), 2*len(backends); got != want {
		t.Fatalf("%d runs, want %d (two sizes per backend)", got, want)
	}
	for _, x := range r.Runs {
		if n := x.Objects + 2*x.Unbuilt; n != objects && n != objects/4 {
			t.Errorf("%s: a run of %d objects and %d unbuilt outputs, want %d or %d in all", x.Backend, x.Objects, x.Unbuilt, objects/4, objects)
		}
		if x.Objects != 2*(x.LivePaths+x.DeadPaths) || x.LivePaths+x.Unbuilt != 2*x.Derivations || x.Unbuilt == 0 {
			t.Errorf("%s %d: %d live and %d dead paths, %d derivations, %d unbuilt; want two objects per path, two paths per derivation but the unbuilt",
				x.Backend, x.Objects, x.LivePaths, x.DeadPaths, x.Derivations, x.Unbuilt)
		}
		if x.Scanned != int64(x.Objects+1) {
			t.Errorf("%s %d: scanned %d, want the objects and nix-cache-info", x.Backend, x.Objects, x.Scanned)
		}
		if x.Deleted != int64(2*x.DeadPaths) || x.Gone != 2*x.DeadPaths {
			t.Errorf("%s %d: deleted %d, %d gone; want the %d dead objects", x.Backend, x.Objects, x.Deleted, x.Gone, 2*x.DeadPaths)
		}
		if x.Kept != 2*x.LivePaths {
			t.Errorf("%s %d: %d live objects kept, want %d", x.Backend, x.Objects, x.Kept, 2*x.LivePaths)
		}
		if x.NarInfoReads != int64(x.LivePaths) {
			t.Errorf("%s %d: %d narinfos read, want one per live path (%d)", x.Backend, x.Objects, x.NarInfoReads, x.LivePaths)
		}
		if x.Seconds <= 0 || x.ScannedPerSecond <= 0 || x.LiveSetQueryMs <= 0 || x.Roots == 0 {
			t.Errorf("%s %d: missing figures: %+v", x.Backend, x.Objects, x)
		}
	}
	if len(r.Extrapolations) != len(backends) {
		t.Fatalf("%d extrapolations, want one per backend", len(r.Extrapolations))
	}
	for _, e := range r.Extrapolations {
		parts := e.ListSeconds + e.MarkSeconds + e.SweepSeconds + e.LiveSetQuery + e.OtherSeconds
		if e.Objects != gcTarget || e.TotalSeconds <= 0 || e.TotalSeconds != parts || e.Method == "" {
			t.Errorf("%s: extrapolation %+v", e.Backend, e)
		}
	}
}

func TestExtrapolateGC(t *testing.T) {
	small := GCRun{Backend: "local", Objects: 250, Seconds: 5, ListSeconds: 1, MarkSeconds: 1, SweepSeconds: 1, LiveSetQueryMs: 10, OtherSeconds: 1}
	large := GCRun{Backend: "local", Objects: 1000, Seconds: 40, ListSeconds: 4, MarkSeconds: 2, SweepSeconds: 8, LiveSetQueryMs: 160, OtherSeconds: 2}
	e := extrapolateGC(small, large, 10000)
	// Phases ×10; the query grew as n² (k = 2), so ×100; the rest grew as n^0.5, taken as linear.
	if e.ListSeconds != 40 || e.MarkSeconds != 20 || e.SweepSeconds != 80 {
		t.Errorf("phases %v %v %v, want 40 20 80", e.ListSeconds, e.MarkSeconds, e.SweepSeconds)
	}
	if d := e.LiveSetQuery - 16; d < -1e-9 || d > 1e-9 || e.LiveSetExponent < 1.999 || e.LiveSetExponent > 2.001 {
		t.Errorf("live-set query %v s (k %v), want 16 s (k 2)", e.LiveSetQuery, e.LiveSetExponent)
	}
	if d := e.OtherSeconds - 20; d < -1e-9 || d > 1e-9 {
		t.Errorf("rest %v s (k %v), want 20 s (linear at least)", e.OtherSeconds, e.OtherExponent)
	}
	// The whole run grew as n^1.5: 40 s × 10^1.5.
	if d := e.RunGrowthSeconds - 40*math.Pow(10, 1.5); d < -1e-6 || d > 1e-6 {
		t.Errorf("whole run %v s (k %v), want %v s (k 1.5)", e.RunGrowthSeconds, e.RunExponent, 40*math.Pow(10, 1.5))
	}
	if !e.WellUnderAnHour {
		t.Errorf("%v s is well under an hour", e.TotalSeconds)
	}
}
