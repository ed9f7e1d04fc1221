package queuebench

import (
	"fmt"
	"math/rand/v2"

	"github.com/harmonia-ci/harmonia-ci/internal/bench"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
)

// DAGShape describes a synthetic package set.
type DAGShape struct {
	Jobs     int
	Projects int
	Seed     uint64
}

// Workload is a generated package set: one enqueue per project, in order (each project's jobs
// depend only on the shared base, enqueued first, and on its own earlier jobs).
type Workload struct {
	Enqueues []queue.EnqueueParams
	Shares   []int // scheduling shares of project i (project ids are assigned at insert)
	Jobs     int
}

// storeHash derives a deterministic 32-character nix-base32 hash for job i of a run.
func storeHash(run uint64, i int) string {
	r := rand.New(rand.NewPCG(run, uint64(i)))
	b := make([]byte, 32)
	for k := range b {
		b[k] = bench.NixBase32[r.IntN(32)]
	}
	return string(b)
}

// GenerateDAG builds a package set shaped like nixpkgs: a bootstrap chain (think stdenv
// stages), a few hubs that depend on it and that most packages depend on, a long spine of
// packages each depending on the previous, many leaves with no inputs, and the rest depending
// on a hub and on up to two earlier packages of the same project. At the start almost every job
// is blocked behind the bootstrap chain, as a real evaluation's jobs are behind stdenv.
func GenerateDAG(s DAGShape, system string) Workload {
	if s.Projects < 1 {
		s.Projects = 1
	}
	rng := rand.New(rand.NewPCG(s.Seed, 0x5eed))
	var w Workload
	id := 0
	mk := func(name string, inputs ...string) queue.Derivation {
		id++
		path := fmt.Sprintf("/nix/store/%s-%s.drv", storeHash(s.Seed, id), name)
		d := queue.Derivation{DrvPath: path, Name: name, System: system, NarHash: "sha256:" + storeHash(s.Seed^1, id), NarSize: 1024,
			Outputs: []queue.Output{{Name: "out", Path: fmt.Sprintf("/nix/store/%s-%s", storeHash(s.Seed^2, id), name)}}}
		for _, in := range inputs {
			d.Inputs = append(d.Inputs, queue.Input{DrvPath: in, Outputs: []string{"out"}})
		}
		return d
	}

	// The shared base: bootstrap chain, hubs, spine. Charged to the first project.
	var base []queue.Derivation
	bootstrap := min(10, max(1, s.Jobs/100))
	prev := ""
	for i := 0; i < bootstrap; i++ {
		var d queue.Derivation
		if prev == "" {
			d = mk(fmt.Sprintf("bootstrap-%d", i))
		} else {
			d = mk(fmt.Sprintf("bootstrap-%d", i), prev)
		}
		base, prev = append(base, d), d.DrvPath
	}
	hubs := make([]string, min(5, max(1, s.Jobs/200)))
	for i := range hubs {
		d := mk(fmt.Sprintf("hub-%d", i), prev)
		base, hubs[i] = append(base, d), d.DrvPath
	}
	spineLen := min(500, max(1, s.Jobs/50))
	prev = hubs[0]
	for i := 0; i < spineLen && len(base) < s.Jobs; i++ {
		d := mk(fmt.Sprintf("spine-%d", i), prev, hubs[0])
		base, prev = append(base, d), d.DrvPath
	}

	perProject := make([][]queue.Derivation, s.Projects)
	perProject[0] = base
	remaining := s.Jobs - len(base)
	for i := 0; i < remaining; i++ {
		p := i % s.Projects
		own := perProject[p]
		name := fmt.Sprintf("p%d-pkg-%d", p, i)
		switch {
		case rng.Float64() < 0.10: // leaves: ready at once
			perProject[p] = append(own, mk(name))
		default:
			inputs := []string{hubs[rng.IntN(len(hubs))]}
			start := 0
			if p == 0 {
				start = len(base)
			}
			for k := rng.IntN(3); k > 0 && len(own) > start; k-- {
				inputs = append(inputs, own[start+rng.IntN(len(own)-start)].DrvPath)
			}
			perProject[p] = append(own, mk(name, dedup(inputs)...))
		}
	}
	for p := range perProject {
		w.Enqueues = append(w.Enqueues, queue.EnqueueParams{Derivations: perProject[p]})
		w.Shares = append(w.Shares, 100*(p+1))
	}
	w.Jobs = s.Jobs
	return w
}

func dedup(xs []string) []string {
	seen := map[string]bool{}
	out := xs[:0]
	for _, x := range xs {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

// Chain builds n derivations, each depending on the previous (the wake-latency probe).
func Chain(n int, seed uint64, system string) []queue.Derivation {
	ds := make([]queue.Derivation, n)
	for i := range ds {
		name := fmt.Sprintf("wake-%d", i)
		ds[i] = queue.Derivation{
			DrvPath: fmt.Sprintf("/nix/store/%s-%s.drv", storeHash(seed, i), name), Name: name, System: system,
			NarHash: "sha256:" + storeHash(seed^1, i), NarSize: 1024,
		}
		if i > 0 {
			ds[i].Inputs = []queue.Input{{DrvPath: ds[i-1].DrvPath, Outputs: []string{"out"}}}
		}
	}
	return ds
}
