package e2ebench

import (
	"fmt"
	"log/slog"
	"slices"

	"github.com/harmonia-ci/harmonia-ci/internal/bench"
)

// E2E workloads.
const (
	E2ETrivial = "trivial"
	E2ESleep   = "sleep"
	E2EBoth    = "both" // trivial and sleep: the default
	// E2EDeep is several evaluations at once, each a chain behind many leaves, built once per
	// queue order (FIFO and critical path).
	E2EDeep = "deep"
	E2EAll  = "all" // trivial, sleep and deep
)

// E2EOptions configures `harmonia-ci bench e2e`.
type E2EOptions struct {
	Derivations  int     // default 200
	Width        int     // derivations per layer; default 20
	Builders     int     // builder nodes; default 3
	Slots        int     // build slots per builder (node.max_jobs); default 2
	Workload     string  // trivial, sleep, both (default), deep or all
	Rounds       int     // each side runs this often per workload with fresh salts; the best is kept; default 1
	SleepSeconds float64 // what each build of the sleep workload sleeps; default 1
	// The deep workload: DeepProjects projects evaluated at once (default 3), each DeepLeaves
	// independent leaves (default 50) and a chain of DeepChain (default 30), every build
	// sleeping DeepSleep seconds (default 0.5).
	DeepProjects int
	DeepLeaves   int
	DeepChain    int
	DeepSleep    float64
	// Samples is how many derivations plain Nix builds one nix-store --realise each (the Nix
	// build itself), and how many jobs the uncontended probe replays; default 10, <0 skips both.
	Samples int
	// TraceNix puts logging wrappers of nix and nix-store first on PATH, to count and time every
	// Nix process the builders run (each costs a bash start besides).
	TraceNix bool
	Keep     bool // keep the temporary directory
	Logger   *slog.Logger
	// NodeLogger receives the in-process nodes' logs; default discard.
	NodeLogger *slog.Logger
}

func (o *E2EOptions) defaults() error {
	o.Derivations = bench.Positive(o.Derivations, 200)
	o.Width = bench.Positive(o.Width, 20)
	if o.Width > o.Derivations {
		o.Width = o.Derivations
	}
	o.Derivations -= o.Derivations % o.Width // whole layers
	o.Builders = bench.Positive(o.Builders, 3)
	o.Slots = bench.Positive(o.Slots, 2)
	o.Rounds = bench.Positive(o.Rounds, 1)
	o.SleepSeconds = bench.Positive(o.SleepSeconds, 1)
	if o.Samples == 0 {
		o.Samples = 10
	}
	o.DeepProjects = bench.Positive(o.DeepProjects, 3)
	o.DeepLeaves = bench.Positive(o.DeepLeaves, 50)
	o.DeepChain = bench.Positive(o.DeepChain, 30)
	o.DeepSleep = bench.Positive(o.DeepSleep, 0.5)
	if o.Workload == "" {
		o.Workload = E2EBoth
	}
	if !slices.Contains([]string{E2ETrivial, E2ESleep, E2EBoth, E2EDeep, E2EAll}, o.Workload) {
		return fmt.Errorf("bench e2e: workload: want trivial, sleep, both, deep or all, got %q", o.Workload)
	}
	o.Logger = bench.Logger(o.Logger)
	o.NodeLogger = bench.Logger(o.NodeLogger)
	return nil
}

// runs reports whether the options' workload includes name.
func (o *E2EOptions) runs(name string) bool {
	switch o.Workload {
	case E2EAll:
		return true
	case E2EBoth:
		return name == E2ETrivial || name == E2ESleep
	}
	return o.Workload == name
}
