package builder

import (
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/metricstest"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
)

// TestParseGCOutput: the deleted paths and freed bytes come from nix-store --gc's summary line,
// in whichever unit Nix chose.
func TestParseGCOutput(t *testing.T) {
	t.Parallel()
	tests := []struct {
		out   string
		paths int
		freed int64
	}{
		{out: "1 store paths deleted, 0.00 MiB freed\n", paths: 1, freed: 0},
		{out: "12 store paths deleted, 1.50 MiB freed\n", paths: 12, freed: 3 << 19},
		{out: "3 store paths deleted, 2.00 GiB freed\n", paths: 3, freed: 2 << 30},
		{out: "0 store paths deleted, 0 bytes freed\n", paths: 0, freed: 0},
		{out: "", paths: 0, freed: -1},
	}
	for _, tt := range tests {
		if paths, freed := parseGCOutput(tt.out); paths != tt.paths || freed != tt.freed {
			t.Errorf("parseGCOutput(%q) = %d, %d; want %d, %d", tt.out, paths, freed, tt.paths, tt.freed)
		}
	}
}

// stepClock is a clock tests move by hand.
type stepClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) After(time.Duration) <-chan time.Time { return nil }

func (c *stepClock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestStoreGCPause: a collection that leaves the store short of min_free is not repeated at
// every check, only after a job ended or gcRetryAfter.
func TestStoreGCPause(t *testing.T) {
	t.Parallel()
	nixtest.RequireNix(t)
	clk := &stepClock{now: time.Now()}
	reg := prometheus.NewRegistry()
	g := newStoreGC(Store{Root: t.TempDir()}, 1<<30, 2<<30, queuetest.TestLogger(t), clk, reg)
	g.freeFunc = func(string) (int64, error) { return 0, nil }
	steps := []struct {
		name string
		step func()
		runs int // collections so far
	}{
		{name: "first check", runs: 1},
		{name: "next check", runs: 1},
		{name: "a job ended", step: g.jobDone, runs: 2},
		{name: "next check", runs: 2},
		{name: "just before the retry", step: func() { clk.add(gcRetryAfter - time.Second) }, runs: 2},
		{name: "at the retry", step: func() { clk.add(time.Second) }, runs: 3},
	}
	for _, s := range steps {
		if s.step != nil {
			s.step()
		}
		g.check(storeTestCtx(t))
		g.wait()
		if runs := metricstest.Value(t, reg, "harmonia_ci_builder_store_gc_total", "result", "short"); runs != float64(s.runs) {
			t.Fatalf("%s: %v collections short of min_free, want %d", s.name, runs, s.runs)
		}
	}
}
