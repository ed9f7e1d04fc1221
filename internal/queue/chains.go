package queue

// chains holds, for one enqueue, each new job's dependent chain: how many jobs the longest
// chain of this enqueue's jobs above it holds. The claim prefers the longest (critical-path
// order): a deep chain of dependencies starts while the wide, shallow work fills the other
// slots, instead of after it.
type chains struct {
	chain map[string]int      // derivation → its chain; absent: 0
	jobs  map[string]bool     // the derivations that get a job
	edges map[string][]string // derivation → the inputs outside this enqueue it waits for
}

// chainsOf computes the chains of an enqueue's jobs (build) over its derivations' edges. With
// OrderFIFO every chain is 0 and the order is the enqueue's.
func chainsOf(order Order, ds []Derivation, build []string) chains {
	c := chains{chain: map[string]int{}, jobs: make(map[string]bool, len(build)), edges: map[string][]string{}}
	if order != OrderCriticalPath {
		return c
	}
	for _, b := range build {
		c.jobs[b] = true
	}
	inEnqueue := make(map[string]bool, len(ds))
	for _, d := range ds {
		inEnqueue[d.DrvPath] = true
	}
	// referrers[i] lists the derivations of this enqueue that have i as an input.
	referrers := map[string][]string{}
	for _, d := range ds {
		for _, in := range d.Inputs {
			if inEnqueue[in.DrvPath] {
				referrers[in.DrvPath] = append(referrers[in.DrvPath], d.DrvPath)
			} else if c.jobs[d.DrvPath] {
				c.edges[d.DrvPath] = append(c.edges[d.DrvPath], in.DrvPath)
			}
		}
	}
	// A derivation's chain is the longest of its referrers' chains, plus one for a referrer
	// that is a job. Iterative depth-first, so a deep chain cannot exhaust the stack;
	// derivation graphs are acyclic, and a cycle in bad input only ends the walk.
	const (
		unseen = iota
		open
		done
	)
	state := map[string]int{}
	for _, d := range ds {
		if state[d.DrvPath] != unseen {
			continue
		}
		stack := []string{d.DrvPath}
		for len(stack) > 0 {
			x := stack[len(stack)-1]
			if state[x] == unseen {
				state[x] = open
				for _, r := range referrers[x] {
					if state[r] == unseen {
						stack = append(stack, r)
					}
				}
				continue
			}
			stack = stack[:len(stack)-1]
			if state[x] == done {
				continue
			}
			state[x] = done
			best := 0
			for _, r := range referrers[x] {
				n := c.chain[r]
				if c.jobs[r] {
					n++
				}
				best = max(best, n)
			}
			if best > 0 {
				c.chain[x] = best
			}
		}
	}
	return c
}

func (c chains) of(drv string) int { return c.chain[drv] }

// raises lists what an enqueue asks of jobs that existed before it: a job of this enqueue
// that already existed (created lacks it) must reach its chain, and an input outside the
// enqueue one more than the job above it.
func (c chains) raises(created map[string]bool) (seeds []string, at []int32) {
	for drv := range c.jobs {
		n := c.chain[drv]
		if !created[drv] && n > 0 {
			seeds, at = append(seeds, drv), append(at, int32(n))
		}
		for _, in := range c.edges[drv] {
			seeds, at = append(seeds, in), append(at, int32(n+1))
		}
	}
	return seeds, at
}
