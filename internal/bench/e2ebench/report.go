package e2ebench

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/harmonia-ci/harmonia-ci/internal/bench"
)

// The targets (the builder on the worker protocol).
const (
	E2ETargetOverheadMs   = 50.0 // median per-job overhead beyond the build step, trivial builds
	E2ETargetTrivialRatio = 3.0  // cluster wall ÷ plain Nix wall, trivial builds
	E2ETargetRatio        = 1.1  // cluster wall ÷ plain Nix wall, sleeping builds
)

// E2EReport is what `bench e2e` measured.
type E2EReport struct {
	Date        string `json:"date"`
	Machine     string `json:"machine"`
	Nix         string `json:"nix"`
	Postgres    string `json:"postgres"`
	Derivations int    `json:"derivations"`
	Width       int    `json:"width"`
	Builders    int    `json:"builders"`
	Slots       int    `json:"slots"`
	Rounds      int    `json:"rounds"`
	TraceNix    bool   `json:"trace_nix"`
	Dir         string `json:"dir,omitempty"` // kept with --keep
	// BuildCgroup is the cgroup the builders' daemons and builds ran in ([build] cgroup), ""
	// when this machine has no writable one: then builds and nodes share the CPU by session.
	BuildCgroup string  `json:"build_cgroup"`
	TargetMs    float64 `json:"target_overhead_ms"`
	TargetRatio float64 `json:"target_ratio"`
	// TargetTrivialRatio is the trivial workload's cluster ÷ plain Nix target.
	TargetTrivialRatio float64 `json:"target_trivial_ratio"`

	Trivial *E2EWorkload     `json:"trivial,omitempty"`
	Sleep   *E2EWorkload     `json:"sleep,omitempty"`
	Deep    *E2EDeepWorkload `json:"deep,omitempty"`
}

// E2EWorkload is one workload's figures: wall times are the best of the rounds, per-job figures
// pool every round.
type E2EWorkload struct {
	Name         string  `json:"name"`
	SleepSeconds float64 `json:"sleep_seconds,omitempty"`
	Jobs         int     `json:"jobs"` // per round
	// NixSeconds is plain nix-store --realise -jN of the DAG into a fresh store (the realise only).
	NixSeconds []float64 `json:"nix_seconds"`
	// ClusterSeconds runs from the first claim to the last success (database clock); the builders
	// start once the evaluation has succeeded.
	ClusterSeconds []float64 `json:"cluster_seconds"`
	// FromStartSeconds runs from the builders' start (node.Run) to the last success.
	FromStartSeconds []float64 `json:"from_start_seconds"`
	EvalSeconds      []float64 `json:"eval_seconds"`
	BestNix          float64   `json:"best_nix_seconds"`
	BestCluster      float64   `json:"best_cluster_seconds"`
	Ratio            float64   `json:"ratio_cluster_to_nix"`
	// NixCPU and ClusterCPU are the machine's busy CPU time (/proc/stat, every process: Nix,
	// PostgreSQL, the nodes, and anything else running) during each side, seconds, best round.
	NixCPU     float64 `json:"nix_cpu_seconds"`
	ClusterCPU float64 `json:"cluster_cpu_seconds"`
	// NixCPUOwn is plain Nix's own share: nix-store and its builds.
	NixCPUOwn float64 `json:"nix_cpu_own_seconds"`
	// The cluster's share of it: the Nix processes the builders ran (with their builds), this
	// process (the nodes), PostgreSQL, and the rest (anything else on the machine).
	ClusterCPUNix float64 `json:"cluster_cpu_nix_seconds"`
	// ClusterCPUBuilds is the builds' own share of ClusterCPUNix (the daemons' reaped children);
	// the rest of the cluster's CPU is spent outside the builds.
	ClusterCPUBuilds float64 `json:"cluster_cpu_builds_seconds"`
	ClusterCPUGo     float64 `json:"cluster_cpu_nodes_seconds"`
	ClusterCPUPG     float64 `json:"cluster_cpu_postgres_seconds"`
	ClusterCPURest   float64 `json:"cluster_cpu_rest_seconds"`
	// LowerBound is ⌈jobs ÷ slots⌉ × sleep (sleep workload): no overhead at all.
	LowerBound float64 `json:"lower_bound_seconds,omitempty"`
	// Utilisation is Σ(claim → succeeded) ÷ (cluster wall × slots), best round.
	Utilisation float64        `json:"slot_utilisation"`
	PerBuilder  map[string]int `json:"jobs_per_builder"` // best round
	Retries     int            `json:"retries"`          // jobs claimed more than once, all rounds
	Claims      int            `json:"claims"`           // claim statements, all rounds
	EmptyClaims int            `json:"empty_claims"`     // of which returned no job
	// FailedAttempts are the builders' "build failed" and "build abandoned" log lines (attempts
	// that were retried), all rounds; Failures quotes the first few.
	FailedAttempts int      `json:"failed_attempts"`
	Failures       []string `json:"failures,omitempty"`

	Steps E2ESteps `json:"steps_ms"`
	// PlainBuild is one nix-store --realise of one trivial derivation of the second layer (its
	// two inputs present), ms: the Nix build itself, as a builder runs it, alone on the machine.
	PlainBuild bench.Stat `json:"plain_nix_build_ms"`
	// PlainSlotMs is plain Nix's wall × jobs-at-once ÷ derivations: slot time per derivation.
	PlainSlotMs float64 `json:"plain_nix_slot_ms_per_drv"`
	// OverheadVsBuild is claim → succeeded minus the builder's build step, per job.
	OverheadVsBuild bench.Stat `json:"overhead_vs_build_step_ms"`
	// OverheadVsPlain is claim → succeeded minus PlainBuild's median, per job.
	OverheadVsPlain bench.Stat `json:"overhead_vs_plain_nix_ms"`

	Probe []ProbeStep `json:"probe,omitempty"`
	Trace []TraceStep `json:"nix_processes,omitempty"`
}

// E2ESteps splits claim → succeeded per job (ms).
type E2ESteps struct {
	Claim  bench.Stat `json:"claim"`  // the claim statement, as the worker timed it
	Fetch  bench.Stat `json:"fetch"`  // .drv closure and inputs (builder.Timings.Fetch)
	Build  bench.Stat `json:"build"`  // builder.Timings.Build: input check, nix-store --realise, output check
	Upload bench.Stat `json:"upload"` // NAR dump, compression, PUT
	Sign   bench.Stat `json:"sign"`   // build-complete at the signer, which records the success
	Other  bench.Stat `json:"other"`  // the rest: dispatch, log tail, GC roots, status update, path infos
	Total  bench.Stat `json:"total"`  // claimed_at → finished_at (database clock)
}

// ProbeStep is one step of the uncontended replay: builder.Store's calls on one job at a time in
// a fresh chroot store, from the cluster's cache, after the cluster has finished.
type ProbeStep struct {
	Step string     `json:"step"`
	Stat bench.Stat `json:"ms"`
}

// TraceStep is one kind of Nix process the builders ran (--trace-nix).
type TraceStep struct {
	Kind     string     `json:"kind"`
	Count    int        `json:"count"`
	PerJob   float64    `json:"per_job"`
	Stat     bench.Stat `json:"ms"`
	MsPerJob float64    `json:"ms_per_job"` // their summed time ÷ jobs
	// CPUMs is the mean CPU time of one (user and system, with what it waited for: sandboxed
	// builders included), 10 ms resolution; CPUMsPerJob sums it per job.
	CPUMs       float64 `json:"cpu_ms"`
	CPUMsPerJob float64 `json:"cpu_ms_per_job"`
}

// Print writes the report for people.
func (r E2EReport) Print(w io.Writer) {
	fmt.Fprintf(w, "harmonia-ci bench e2e — %s, %s, PostgreSQL %s, %s\n", r.Machine, r.Nix, r.Postgres, r.Date)
	if r.Dir != "" {
		fmt.Fprintf(w, "  kept: %s\n", r.Dir)
	}
	if r.Trivial != nil || r.Sleep != nil {
		r.printLayered(w)
	}
	if r.Deep != nil {
		r.Deep.print(w, r.Builders, r.Slots, r.Rounds)
	}
}

// printLayered writes the trivial and sleep workloads' figures.
func (r E2EReport) printLayered(w io.Writer) {
	jobs := r.Builders * r.Slots
	fmt.Fprintf(w, "  %d derivations in layers of %d (each depends on two of the layer below); %d builders × %d slots,\n", r.Derivations, r.Width, r.Builders, r.Slots)
	fmt.Fprintf(w, "  each its own chroot store; frontend, evaluator, signer and cache on one node; loopback; best of %d round(s)\n", r.Rounds)
	fmt.Fprintf(w, "  plain Nix: nix-store --realise <all .drv> --max-jobs %d into a fresh chroot store, sandboxed; the realise only\n", jobs)
	fmt.Fprintf(w, "  cluster:   first claim → last succeeded (database clock); builders start once the evaluation has succeeded\n")
	if r.BuildCgroup != "" {
		fmt.Fprintf(w, "  builds:    nice 10, in cgroup %s (a tenth of the default CPU weight)\n", r.BuildCgroup)
	} else {
		fmt.Fprintf(w, "  builds:    nice 10, no writable cgroup here: builds and nodes share the CPU by session\n")
	}
	pass := func(ok bool) string {
		if ok {
			return "PASS"
		}
		return "MISS"
	}
	secs := func(xs []float64) string {
		if len(xs) < 2 {
			return ""
		}
		parts := make([]string, len(xs))
		for i, x := range xs {
			parts[i] = fmt.Sprintf("%.2f", x)
		}
		return "  (rounds: " + strings.Join(parts, ", ") + ")"
	}
	row := func(name string, s bench.Stat) {
		fmt.Fprintf(w, "      %-48s %8.1f %8.1f %8.1f\n", name, s.P50, s.P90, s.Mean)
	}
	for _, wl := range []*E2EWorkload{r.Trivial, r.Sleep} {
		if wl == nil {
			continue
		}
		fmt.Fprintln(w)
		if wl.Name == E2ESleep {
			fmt.Fprintf(w, "  sleep builds (each sleeps %g s)\n", wl.SleepSeconds)
		} else {
			fmt.Fprintf(w, "  trivial builds\n")
		}
		fmt.Fprintf(w, "    plain Nix -j%-3d   %8.2f s   (%.0f ms of slot time per derivation)%s\n", jobs, wl.BestNix, wl.PlainSlotMs, secs(wl.NixSeconds))
		fmt.Fprintf(w, "    cluster          %8.2f s   ratio %.2f", wl.BestCluster, wl.Ratio)
		target := r.TargetTrivialRatio
		if wl.Name == E2ESleep {
			target = r.TargetRatio
		}
		fmt.Fprintf(w, "   target ≤ %.1f: %s", target, pass(wl.Ratio <= target))
		fmt.Fprintf(w, "%s\n", secs(wl.ClusterSeconds))
		fmt.Fprintf(w, "    builders' start → last succeeded %.2f s; evaluation %.2f s; slot utilisation %.0f %%\n",
			bench.MinOf(wl.FromStartSeconds), bench.MinOf(wl.EvalSeconds), 100*wl.Utilisation)
		perJob := func(s float64) float64 { return 1000 * s / float64(wl.Jobs) }
		fmt.Fprintf(w, "    busy CPU, whole machine, per derivation: plain Nix %.0f ms (nix-store and builds %.0f ms); cluster %.0f ms =\n",
			perJob(wl.NixCPU), perJob(wl.NixCPUOwn), perJob(wl.ClusterCPU))
		fmt.Fprintf(w, "      Nix daemons and builds %.0f ms + nodes (Go) %.0f ms + PostgreSQL %.0f ms + rest (anything else) %.0f ms\n",
			perJob(wl.ClusterCPUNix), perJob(wl.ClusterCPUGo), perJob(wl.ClusterCPUPG), perJob(wl.ClusterCPURest))
		fmt.Fprintf(w, "    CPU outside the build itself, per job: %.0f ms (the cluster's busy CPU but the builds' own %.0f ms, which the daemons reaped)\n",
			perJob(wl.ClusterCPU-wl.ClusterCPUBuilds), perJob(wl.ClusterCPUBuilds))
		if wl.LowerBound > 0 {
			fmt.Fprintf(w, "    lower bound ⌈%d jobs ÷ %d slots⌉ × %g s = %.1f s (plain Nix ÷ bound %.2f, cluster ÷ bound %.2f)\n",
				wl.Jobs, jobs, wl.SleepSeconds, wl.LowerBound, wl.BestNix/wl.LowerBound, wl.BestCluster/wl.LowerBound)
		}
		var per []string
		for id, n := range wl.PerBuilder {
			per = append(per, fmt.Sprintf("%s %d", id, n))
		}
		slices.Sort(per)
		fmt.Fprintf(w, "    jobs per builder: %s; %d retried; %d claims, %d empty\n", strings.Join(per, ", "), wl.Retries, wl.Claims, wl.EmptyClaims)
		if wl.FailedAttempts > 0 {
			fmt.Fprintf(w, "    failed attempts (retried): %d\n", wl.FailedAttempts)
			for _, f := range wl.Failures {
				fmt.Fprintf(w, "      %s\n", f)
			}
		}
		fmt.Fprintf(w, "    per job (%d jobs), ms                                   p50      p90     mean\n", wl.Steps.Total.N)
		row("claim", wl.Steps.Claim)
		row("fetch inputs", wl.Steps.Fetch)
		row("build", wl.Steps.Build)
		row("upload", wl.Steps.Upload)
		row("sign", wl.Steps.Sign)
		row("other (unaccounted)", wl.Steps.Other)
		row("claim → succeeded", wl.Steps.Total)
		row("overhead: total − build step", wl.OverheadVsBuild)
		if wl.PlainBuild.N > 0 {
			row("overhead: total − plain Nix build", wl.OverheadVsPlain)
			fmt.Fprintf(w, "    plain Nix build of one derivation (one nix-store --realise, inputs present, alone): p50 %.1f ms, p90 %.1f ms (%d samples)\n",
				wl.PlainBuild.P50, wl.PlainBuild.P90, wl.PlainBuild.N)
		}
		if wl.Name == E2ETrivial {
			fmt.Fprintf(w, "    target: median overhead ≤ %.0f ms: %s against the build step (%.1f ms), %s against plain Nix (%.1f ms)\n",
				r.TargetMs, pass(wl.OverheadVsBuild.P50 <= r.TargetMs), wl.OverheadVsBuild.P50,
				pass(wl.PlainBuild.N > 0 && wl.OverheadVsPlain.P50 <= r.TargetMs), wl.OverheadVsPlain.P50)
		}
		if len(wl.Probe) > 0 {
			fmt.Fprintf(w, "    uncontended replay (one builder.Session, one job at a time, fresh store, inputs from the cache), ms\n")
			for _, p := range wl.Probe {
				row(p.Step, p.Stat)
			}
		}
		if r.TraceNix && len(wl.Trace) == 0 {
			fmt.Fprintf(w, "    Nix processes on the builders (--trace-nix, round 1): none (nix and nix-store; the daemon sessions are not traced)\n")
		}
		if len(wl.Trace) > 0 {
			fmt.Fprintf(w, "    Nix processes on the builders (--trace-nix, round 1)   per job   p50 ms   p90 ms   ms/job   CPU ms  CPU ms/job\n")
			for _, t := range wl.Trace {
				fmt.Fprintf(w, "      %-50s %5.2f %8.1f %8.1f %8.1f %8.1f %8.1f\n", t.Kind, t.PerJob, t.Stat.P50, t.Stat.P90, t.MsPerJob, t.CPUMs, t.CPUMsPerJob)
			}
		}
	}
}
