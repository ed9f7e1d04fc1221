package e2ebench

import (
	"math"
	"testing"
)

func TestComputeLowerBound(t *testing.T) {
	t.Parallel()
	job := func(drv string, s float64, inputs ...string) dagJob {
		return dagJob{Drv: drv, Latency: s, Busy: s, Inputs: inputs}
	}
	tests := []struct {
		name      string
		jobs      []dagJob
		slots     int
		wantCP    float64
		wantWork  float64
		wantBound float64
		wantTails map[string]float64
		wantErr   bool
	}{
		{name: "empty", slots: 2, wantTails: map[string]float64{}},
		{name: "one job", jobs: []dagJob{job("a", 2)}, slots: 4,
			wantCP: 2, wantWork: 2, wantBound: 2, wantTails: map[string]float64{"a": 2}},
		{name: "a chain is its critical path", jobs: []dagJob{job("c", 3, "b"), job("a", 1), job("b", 2, "a")}, slots: 2,
			wantCP: 6, wantWork: 6, wantBound: 6, wantTails: map[string]float64{"a": 6, "b": 5, "c": 3}},
		{name: "wide work over few slots", jobs: []dagJob{job("a", 1), job("b", 1), job("c", 1), job("d", 1)}, slots: 2,
			wantCP: 1, wantWork: 4, wantBound: 2, wantTails: map[string]float64{"a": 1, "b": 1, "c": 1, "d": 1}},
		{name: "diamond takes the heavier side", jobs: []dagJob{job("top", 1, "l", "r"), job("l", 5, "base"), job("r", 2, "base"), job("base", 1)}, slots: 8,
			wantCP: 7, wantWork: 9, wantBound: 7, wantTails: map[string]float64{"base": 7, "l": 6, "r": 3, "top": 1}},
		{name: "a chain beside leaves", jobs: []dagJob{job("leaf-0", 1), job("leaf-1", 1), job("leaf-2", 1), job("leaf-3", 1),
			job("spine-0", 1), job("spine-1", 1, "spine-0"), job("spine-2", 1, "spine-1")}, slots: 2,
			wantCP: 3, wantWork: 7, wantBound: 3.5,
			wantTails: map[string]float64{"leaf-0": 1, "leaf-1": 1, "leaf-2": 1, "leaf-3": 1, "spine-0": 3, "spine-1": 2, "spine-2": 1}},
		{name: "inputs outside the run and repeated inputs are ignored", jobs: []dagJob{job("a", 1, "built-earlier"), job("b", 1, "a", "a")}, slots: 1,
			wantCP: 2, wantWork: 2, wantBound: 2, wantTails: map[string]float64{"a": 2, "b": 1}},
		{name: "work counts slot time, the critical path latency", jobs: []dagJob{{Drv: "a", Latency: 2, Busy: 1},
			{Drv: "b", Latency: 2, Busy: 1, Inputs: []string{"a"}}, {Drv: "c", Latency: 2, Busy: 1}}, slots: 1,
			wantCP: 4, wantWork: 3, wantBound: 4, wantTails: map[string]float64{"a": 4, "b": 2, "c": 2}},
		{name: "a cycle", jobs: []dagJob{job("a", 1, "b"), job("b", 1, "a"), job("c", 1)}, slots: 1, wantErr: true},
		{name: "a job twice", jobs: []dagJob{job("a", 1), job("a", 1)}, slots: 1, wantErr: true},
		{name: "no slots", jobs: []dagJob{job("a", 1)}, slots: 0, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			lb, err := computeLowerBound(tt.jobs, tt.slots)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("got %+v, want an error", lb)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
			if !near(lb.CriticalPath, tt.wantCP) || !near(lb.Work, tt.wantWork) || !near(lb.Bound, tt.wantBound) {
				t.Errorf("critical path %g, work %g, bound %g; want %g, %g, %g", lb.CriticalPath, lb.Work, lb.Bound, tt.wantCP, tt.wantWork, tt.wantBound)
			}
			if len(lb.Tails) != len(tt.wantTails) {
				t.Errorf("tails %v, want %v", lb.Tails, tt.wantTails)
			}
			for drv, want := range tt.wantTails {
				if got, ok := lb.Tails[drv]; !ok || !near(got, want) {
					t.Errorf("tail of %s: %g, want %g", drv, got, want)
				}
			}
		})
	}
}
