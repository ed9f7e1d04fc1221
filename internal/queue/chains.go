package queue

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/jackc/pgx/v5"
)

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

// RaiseDeferred gives the jobs of several enqueues made with DeferRaise (ds and build, all of
// them together) the chains one enqueue of everything would have given them, and raises the
// jobs below them that were there before: the chains are computed over the enqueues' own
// graph, so only the jobs outside it are walked in the database. It returns how many jobs of
// the enqueues it raised.
func RaiseDeferred(ctx context.Context, tx pgx.Tx, ds []Derivation, build []string) (int64, error) {
	c := chainsOf(OrderCriticalPath, ds, build)
	var drvs, seeds []string
	var at, seedAt []int32
	for _, drv := range slices.Sorted(maps.Keys(c.jobs)) {
		n := c.chain[drv]
		if n > 0 {
			drvs, at = append(drvs, drv), append(at, int32(n))
		}
		for _, in := range c.edges[drv] {
			seeds, seedAt = append(seeds, in), append(seedAt, int32(n+1))
		}
	}
	var raised int64
	if len(drvs) > 0 {
		tag, err := tx.Exec(ctx, sqlSetChains, drvs, at)
		if err != nil {
			return 0, fmt.Errorf("raise dependent chains: %w", err)
		}
		raised = tag.RowsAffected()
	}
	if len(seeds) > 0 {
		if _, err := tx.Exec(ctx, sqlRaiseChains, seeds, seedAt); err != nil {
			return raised, fmt.Errorf("raise dependent chains: %w", err)
		}
	}
	return raised, nil
}
