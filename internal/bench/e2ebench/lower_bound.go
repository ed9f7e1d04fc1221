package e2ebench

import (
	"fmt"
	"slices"
)

// dagJob is one job of a measured run: its derivation, its input derivations and its measured
// durations.
type dagJob struct {
	Drv    string
	Inputs []string // inputs that are not jobs of the run are ignored
	// Latency is from its start to its success: its dependents cannot start sooner.
	Latency float64
	// Busy is how long it held a build slot (less than Latency: the upload runs off the slot).
	Busy float64
}

// lowerBound is what no schedule of the run on slots slots can beat, from the jobs' measured
// durations.
type lowerBound struct {
	CriticalPath float64 // the longest path through the DAG, weighted by latency
	Work         float64 // the sum of the slot times (Busy)
	Slots        int
	Bound        float64 // max(CriticalPath, Work ÷ Slots)
	// Tails holds, per derivation, the longest latency path from the job through everything
	// that depends on it, itself included: what critical-path order ranks by.
	Tails map[string]float64
}

// computeLowerBound measures the DAG of jobs; it fails on a cycle or a derivation listed twice.
func computeLowerBound(jobs []dagJob, slots int) (lowerBound, error) {
	if slots < 1 {
		return lowerBound{}, fmt.Errorf("lower bound: %d slots", slots)
	}
	lb := lowerBound{Slots: slots, Tails: make(map[string]float64, len(jobs))}
	index := make(map[string]int, len(jobs))
	for i, j := range jobs {
		if _, dup := index[j.Drv]; dup {
			return lowerBound{}, fmt.Errorf("lower bound: %s listed twice", j.Drv)
		}
		index[j.Drv] = i
		lb.Work += j.Busy
	}
	// Kahn's algorithm from the sinks: a job's tail is known once all its dependents' are.
	dependents := make([][]int, len(jobs))
	inputs := make([][]int, len(jobs))
	for i, j := range jobs {
		for _, in := range j.Inputs {
			if k, ok := index[in]; ok && !slices.Contains(inputs[i], k) {
				inputs[i] = append(inputs[i], k)
				dependents[k] = append(dependents[k], i)
			}
		}
	}
	waiting := make([]int, len(jobs)) // dependents whose tail is still unknown
	var ready []int
	for i := range jobs {
		if waiting[i] = len(dependents[i]); waiting[i] == 0 {
			ready = append(ready, i)
		}
	}
	tails := make([]float64, len(jobs))
	done := 0
	for len(ready) > 0 {
		i := ready[len(ready)-1]
		ready = ready[:len(ready)-1]
		done++
		var longest float64
		for _, d := range dependents[i] {
			longest = max(longest, tails[d])
		}
		tails[i] = jobs[i].Latency + longest
		lb.CriticalPath = max(lb.CriticalPath, tails[i])
		lb.Tails[jobs[i].Drv] = tails[i]
		for _, k := range inputs[i] {
			if waiting[k]--; waiting[k] == 0 {
				ready = append(ready, k)
			}
		}
	}
	if done != len(jobs) {
		return lowerBound{}, fmt.Errorf("lower bound: the DAG has a cycle through %d jobs", len(jobs)-done)
	}
	lb.Bound = max(lb.CriticalPath, lb.Work/float64(slots))
	return lb, nil
}
