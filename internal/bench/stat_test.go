package bench

import (
	"testing"
	"time"
)

func TestSummarize(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		ms   []float64
		want Stat
	}{
		{"none", nil, Stat{}},
		{"one", []float64{4}, Stat{N: 1, P50: 4, P90: 4, Mean: 4}},
		{"unsorted, interpolated", []float64{30, 10, 20, 40}, Stat{N: 4, P50: 25, P90: 37, Mean: 25}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := Summarize(tt.ms)
			if got.N != tt.want.N || !near(got.P50, tt.want.P50) || !near(got.P90, tt.want.P90) || !near(got.Mean, tt.want.Mean) {
				t.Fatalf("Summarize(%v) = %+v, want %+v", tt.ms, got, tt.want)
			}
		})
	}
}

func TestPercentileMs(t *testing.T) {
	t.Parallel()
	ds := []time.Duration{3 * time.Millisecond, time.Millisecond, 2 * time.Millisecond, 4500 * time.Microsecond}
	for _, tt := range []struct {
		p, want float64
	}{{0, 1}, {50, 2}, {99, 3}, {100, 4.5}} {
		if got := PercentileMs(ds, tt.p); got != tt.want {
			t.Errorf("PercentileMs(p%v) = %v, want %v", tt.p, got, tt.want)
		}
	}
	if got := PercentileMs(nil, 50); got != 0 {
		t.Errorf("PercentileMs(none) = %v, want 0", got)
	}
}

func TestPositive(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ v, def, want int }{{0, 7, 7}, {-1, 7, 7}, {3, 7, 3}} {
		if got := Positive(tt.v, tt.def); got != tt.want {
			t.Errorf("Positive(%d, %d) = %d, want %d", tt.v, tt.def, got, tt.want)
		}
	}
	if Seed(42) != 42 || Seed(0) == 0 {
		t.Errorf("Seed(42) = %d, Seed(0) = %d; want 42 and a clock seed", Seed(42), Seed(0))
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
