package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/harmonia-ci/harmonia-ci/internal/bench/cachebench"
	"github.com/harmonia-ci/harmonia-ci/internal/bench/e2ebench"
	"github.com/harmonia-ci/harmonia-ci/internal/bench/evalbench"
	"github.com/harmonia-ci/harmonia-ci/internal/bench/gcbench"
	"github.com/harmonia-ci/harmonia-ci/internal/bench/queuebench"
	"github.com/harmonia-ci/harmonia-ci/internal/bench/webhookbench"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
)

func newBench(g *globalFlags) *cobra.Command {
	c := &cobra.Command{Use: "bench", Short: "Run benchmarks against a real PostgreSQL"}
	c.AddCommand(newBenchQueue(g), newBenchWorker(g), newBenchCache(), newBenchEval(), newBenchE2E(), newBenchWebhook(), newBenchGC(g))
	return c
}

func newBenchQueue(g *globalFlags) *cobra.Command {
	var o queuebench.QueueOptions
	var asJSON bool
	var form string
	cmd := &cobra.Command{
		Use:   "queue",
		Short: "Drain a synthetic package set with no-op workers; report jobs/s, claim and wake latency against pgbench",
		Long: `queue generates a DAG shaped like a package set (a bootstrap chain, hubs most packages depend
on, a long spine, many leaves; several projects with shares 100, 200, ...), drains it with
--workers concurrent no-op workers of one build slot each, then measures wake-up latency on a
chain. pgbench -N runs first against the same server for reference.

Without --database-url it starts a private PostgreSQL (fsync off) in a temporary directory.
With one, the database must hold no build jobs.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch form {
			case "ready":
				o.Form = queue.ClaimReady
			case "not-exists":
				o.Form = queue.ClaimNotExists
			default:
				return fmt.Errorf("--claim-form: want ready or not-exists, got %q", form)
			}
			o.DatabaseURL = g.databaseURL
			o.Logger = benchLogger(cmd.ErrOrStderr())
			// Ctrl-C must still stop the private server the benchmark started.
			ctx, _, stop := signalContext()
			defer stop()
			r, err := queuebench.Queue(ctx, o)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), r)
			}
			printQueueReport(cmd.OutOrStdout(), r)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Jobs, "jobs", 100000, "synthetic jobs")
	f.IntVar(&o.Workers, "workers", 4, "concurrent no-op workers, one build slot each")
	f.IntVar(&o.Projects, "projects", 4, "projects (shares 100, 200, ...)")
	f.IntVar(&o.PgbenchSeconds, "pgbench-seconds", 10, "duration of the pgbench -N reference (0 skips it)")
	f.IntVar(&o.WakeLinks, "wake-links", 200, "chain length for the wake-latency probe (0 skips it)")
	f.Uint64Var(&o.Seed, "seed", 0, "DAG seed (default: time)")
	f.StringVar(&form, "claim-form", "ready", "claim statement: ready (maintained readiness) or not-exists (readiness checked per candidate)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newBenchWorker(g *globalFlags) *cobra.Command {
	var o queuebench.WorkerOptions
	var systems string
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run a builder node whose builds do nothing, to load a queue from another process",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.DatabaseURL, o.NodeID = g.databaseURL, g.nodeID
			if o.NodeID == "" {
				o.NodeID, _ = os.Hostname()
			}
			o.Systems = strings.Split(systems, ",")
			o.Logger = benchLogger(cmd.ErrOrStderr())
			ctx, _, stop := signalContext()
			defer stop()
			n, err := queuebench.Worker(ctx, o)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "bench worker %s built %d jobs\n", o.NodeID, n)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Slots, "workers", 4, "build slots")
	f.BoolVar(&o.UntilEmpty, "until-empty", false, "exit once no job is pending or in progress")
	f.StringVar(&systems, "systems", "x86_64-linux", "comma-separated systems to build for")
	return cmd
}

func printQueueReport(w io.Writer, r queuebench.QueueReport) {
	fmt.Fprintf(w, "harmonia-ci bench queue — %s, PostgreSQL %s, %s, claim form %s\n", r.Machine, r.Postgres, r.Date, r.ClaimForm)
	fmt.Fprintf(w, "  jobs %d (%d blocked at start), workers %d, projects %d\n", r.Jobs, r.BlockedAtStart, r.Workers, r.Projects)
	fmt.Fprintf(w, "  enqueue            %.1f s\n", r.EnqueueSeconds)
	fmt.Fprintf(w, "  drain              %.1f s  = %.0f jobs/s\n", r.RunSeconds, r.JobsPerSecond)
	fmt.Fprintf(w, "  claim latency      p50 %.2f ms  p99 %.2f ms  (p99 while over half unclaimed: %.2f ms)\n", r.ClaimP50Ms, r.ClaimP99Ms, r.ClaimP99FullMs)
	fmt.Fprintf(w, "                     (a claim made with the success before it counts the round trip of both)\n")
	fmt.Fprintf(w, "  claim alone        p50 %.2f ms  p99 %.2f ms  (a probe claiming one job 10 times a second through the drain)\n", r.ClaimAloneP50Ms, r.ClaimAloneP99Ms)
	fmt.Fprintf(w, "  wake latency       p50 %.2f ms  p99 %.2f ms  (successes recorded apart, as a signer records a builder's)\n", r.WakeP50Ms, r.WakeP99Ms)
	if r.PgbenchTPS > 0 {
		fmt.Fprintf(w, "  pgbench -N         %.0f TPS (8 clients, 2 threads, same server)\n", r.PgbenchTPS)
		fmt.Fprintf(w, "  jobs/s ÷ TPS       %.2f\n", r.RatioToPgbench)
	}
}

func newBenchEval() *cobra.Command {
	var o evalbench.EvalOptions
	var asJSON bool
	var shape, workerMemory string
	cmd := &cobra.Command{
		Use:   "eval",
		Short: "Evaluate a generated 10,000-derivation project against bare nix-instantiate",
		Long: `eval generates two projects of the same shape (layers of --width derivations, each depending
on two of the layer below) with different salts, so both runs write new .drv files. It times bare
nix-instantiate of one, then an evaluation of the other by a node running the frontend, evaluator,
signer and cache roles in this process (private PostgreSQL, local cache): from the request to the
evaluation's success, including ingestion and publication of the .drv closure. Needs nix-bin.

--shape packages generates instead a set shaped like nixpkgs (--derivations defaults to
100,000): a bootstrap chain, low-level libraries with deep chains, packages with fixed-output
sources, nested recurseForDerivations sets and a few attributes that throw. It reports, in one
run, bare single-process nix-instantiate (of the set without the throwing attributes), an
evaluation with one walker and one with --workers: wall time, CPU seconds of Nix, the node and
PostgreSQL, the largest walker's peak memory, and the parallel efficiency (the one-walker
run's CPU time ÷ (wall time × workers)). With --max-memory-per-worker, a fourth run bounds each
of the --workers walkers to that size: set below the one walker's peak, it shows restarts and
whether the results stay those of the unbounded runs.

--nodes 2 (layered shape) runs a second evaluator node in the process, on the same database,
which walks units of the first node's evaluations (help_others): the report gives the units
each node walked and whether the results are those of a single walker.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Logger = benchLogger(cmd.ErrOrStderr())
			ctx, _, stop := signalContext()
			defer stop()
			switch shape {
			case "layered":
			case "packages":
				if o.Nodes > 1 {
					return errors.New("--nodes: only with --shape layered")
				}
				if workerMemory != "" {
					var b config.ByteSize
					if err := b.UnmarshalText([]byte(workerMemory)); err != nil || b == 0 {
						return usageError{fmt.Errorf("--max-memory-per-worker %q: want a size such as 300MiB", workerMemory)}
					}
					o.WorkerMemory = int64(b)
				}
				if !cmd.Flags().Changed("derivations") {
					o.Derivations = 100_000
				}
				r, err := evalbench.Scale(ctx, o)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), r)
				}
				printScaleReport(cmd.OutOrStdout(), r)
				return nil
			default:
				return fmt.Errorf("--shape %q: want layered or packages", shape)
			}
			r, err := evalbench.Eval(ctx, o)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), r)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "harmonia-ci bench eval — %s, %s, PostgreSQL %s, %s\n", r.Machine, r.Nix, r.Postgres, r.Date)
			fmt.Fprintf(cmd.OutOrStdout(), "  %d derivations (layers of %d), best of %d rounds, %d workers\n", r.Derivations, r.Width, r.Rounds, r.Workers)
			fmt.Fprintf(cmd.OutOrStdout(), "  nix-instantiate   %.2f s\n", r.NixSeconds)
			fmt.Fprintf(cmd.OutOrStdout(), "  harmonia-ci eval  %.2f s   ratio %.2f\n", r.EvalSeconds, r.Ratio)
			fmt.Fprintf(cmd.OutOrStdout(), "  ingested %d rows = %.0f rows/s; %d jobs; %d narinfos published\n", r.Rows, r.RowsPerSecond, r.Jobs, r.Published)
			if r.Nodes > 1 {
				fmt.Fprintf(cmd.OutOrStdout(), "  %d evaluator nodes; units walked by node %v; identical results: %v\n", r.Nodes, r.UnitsByNode, r.Identical)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Derivations, "derivations", 10000, "derivations in the generated project")
	f.IntVar(&o.Width, "width", 100, "derivations per layer")
	f.IntVar(&o.Rounds, "rounds", 2, "runs per side, each with fresh derivations; the best is kept")
	f.IntVar(&o.Workers, "workers", 0, "walker processes per evaluation ([eval] workers); 0: the default (half the cores), or the cores with --shape packages")
	f.IntVar(&o.Nodes, "nodes", 1, "evaluator nodes taking part in each evaluation (layered shape)")
	f.StringVar(&shape, "shape", "layered", "the generated project: layered, or packages (shaped like nixpkgs)")
	f.StringVar(&workerMemory, "max-memory-per-worker", "", "with --shape packages, also run --workers walkers each bounded to this size (e.g. 300MiB), below what one walker needs")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printScaleReport(w io.Writer, r evalbench.ScaleReport) {
	fmt.Fprintf(w, "harmonia-ci bench eval --shape packages — %s, %s, PostgreSQL %s, %s\n", r.Machine, r.Nix, r.Postgres, r.Date)
	fmt.Fprintf(w, "  %d derivations shaped like nixpkgs\n", r.Derivations)
	fmt.Fprintf(w, "  %-22s %8s %7s %9s %9s %9s %9s %8s %6s %5s %8s\n", "", "wall s", "ratio", "Nix cpu", "node cpu", "pg cpu", "peak MB", "attrs", "errors", "jobs", "restarts")
	for _, row := range []struct {
		name string
		run  evalbench.ScaleRun
	}{{"bare nix-instantiate", r.Bare}, {"harmonia-ci, 1 worker", r.One}, {fmt.Sprintf("harmonia-ci, %d workers", r.Workers), r.Many}} {
		fmt.Fprintf(w, "  %-22s %8.2f %7.2f %9.2f %9.2f %9.2f %9.0f %8d %6d %5d %8d\n", row.name, row.run.Seconds, row.run.Ratio,
			row.run.NixCPU, row.run.NodeCPU, row.run.PostgresCPU, row.run.PeakWorkerMB, row.run.Attributes, row.run.EvalErrors,
			row.run.Jobs, row.run.Restarts)
	}
	if r.Bounded != nil {
		b := *r.Bounded
		fmt.Fprintf(w, "  %-22s %8.2f %7.2f %9.2f %9.2f %9.2f %9.0f %8d %6d %5d %8d\n", fmt.Sprintf("%d workers ≤ %.0f MB", r.Workers, r.WorkerMemoryMB),
			b.Seconds, b.Ratio, b.NixCPU, b.NodeCPU, b.PostgresCPU, b.PeakWorkerMB, b.Attributes, b.EvalErrors, b.Jobs, b.Restarts)
	}
	fmt.Fprintf(w, "  parallel efficiency %.2f (1-worker CPU %.1f s ÷ (%.1f s × %d)); identical results: %v\n",
		r.Efficiency, r.One.CPU(), r.Many.Seconds, r.Workers, r.Identical)
	if r.Bounded != nil {
		fmt.Fprintf(w, "  bounded to %.0f MB per walker (one walker peaked at %.0f MB): %d restarts; the same attributes, errors and jobs as unbounded: %v\n",
			r.WorkerMemoryMB, r.One.PeakWorkerMB, r.Bounded.Restarts, r.BoundedIdentical)
	}
}

func newBenchCache() *cobra.Command {
	var o cachebench.CacheOptions
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "cache",
		Short: "Serve the same files with the cache role and nginx under wrk; time the upload pipeline against nix copy",
		Long: `cache adds a large store path and a closure of small ones (random and text content) with
nix-store --add, publishes them into a local blob directory, then serves that directory with the
cache role and with nginx, alternately driven by wrk: narinfo requests/s (cycling through every
narinfo) and the large NAR's MB/s. Narinfos are also served by a cache role with its visibility
check, on a private PostgreSQL holding a private project (so no path takes the all-public fast
path). Finally it times the upload pipeline (CompressNAR and a signed
narinfo per path) against nix copy --to 'file://DIR?compression=zstd' on the same paths.
Needs nginx, wrk and nix-bin (scripts/deps.sh bench). The store paths are deleted afterwards.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Logger = benchLogger(cmd.ErrOrStderr())
			ctx, _, stop := signalContext()
			defer stop()
			r, err := cachebench.Cache(ctx, o)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), r)
			}
			printCacheReport(cmd.OutOrStdout(), r)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Duration, "duration", 10, "seconds per wrk run")
	f.IntVar(&o.Connections, "connections", 32, "wrk connections")
	f.IntVar(&o.Threads, "threads", 2, "wrk threads")
	f.IntVar(&o.Rounds, "rounds", 2, "runs per server and kind, and per pipeline side; the best is kept")
	f.IntVar(&o.NarMB, "nar-mb", 64, "content of the large store path, MB")
	f.IntVar(&o.Closure, "closure", 50, "small store paths besides the large one")
	f.IntVar(&o.ClosureMB, "closure-mb", 192, "total content of the small store paths, MB")
	f.Uint64Var(&o.Seed, "seed", 0, "content seed (default: time)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printCacheReport(w io.Writer, r cachebench.CacheReport) {
	fmt.Fprintf(w, "harmonia-ci bench cache — %s, %s, %s, %s, %s\n", r.Machine, r.Nginx, r.Wrk, r.Nix, r.Date)
	fmt.Fprintf(w, "  wrk: %d threads, %d connections, %d s per run, best of %d\n", r.Threads, r.Connections, r.Duration, r.Rounds)
	fmt.Fprintf(w, "  narinfo (%d, cycled)   cache %.0f req/s   nginx %.0f req/s   ratio %.2f\n", r.Narinfos, r.CacheNarinfoRPS, r.NginxNarinfoRPS, r.NarinfoRatio)
	fmt.Fprintf(w, "  narinfo, visibility on  cache %.0f req/s   ratio %.2f   (PostgreSQL %s, a private project: every path looked up)\n", r.VisibleNarinfoRPS, r.VisibleNarinfoRatio, r.Database)
	fmt.Fprintf(w, "  NAR (%.1f MB .nar.zst)  cache %.0f MB/s   nginx %.0f MB/s   ratio %.2f\n", r.NarFileMB, r.CacheNarMBps, r.NginxNarMBps, r.NarRatio)
	fmt.Fprintf(w, "  upload, %d paths, %.0f MB NAR:\n", r.ClosurePaths, r.ClosureNarMB)
	fmt.Fprintf(w, "    pipeline (%d workers)  %.2f s = %.0f MB/s   (%.0f MB zstd)\n", r.PipelineWorkers, r.PipelineSeconds, r.PipelineMBps, r.PipelineFileMB)
	fmt.Fprintf(w, "    nix copy               %.2f s = %.0f MB/s   (%.0f MB zstd)\n", r.NixCopySeconds, r.NixCopyMBps, r.NixCopyFileMB)
	fmt.Fprintf(w, "    ratio                  %.2f\n", r.PipelineRatio)
	if r.WrkSocketErrors != "" {
		fmt.Fprintf(w, "  wrk socket errors: %s\n", r.WrkSocketErrors)
	}
}

func newBenchE2E() *cobra.Command {
	var o e2ebench.E2EOptions
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "e2e",
		Short: "Build a generated DAG on an in-process cluster against plain nix-store --realise; report per-job overhead and wall-time ratio",
		Long: `e2e starts a private PostgreSQL and, in this process, a node with the frontend, evaluator,
signer and cache roles (local cache, generated key and token) and --builders builder nodes of
--slots slots, each with its own chroot store, all on loopback. For each workload it generates a
DAG of --derivations derivations (layers of --width, each depending on two of the layer below)
with a fresh salt, builds it with plain nix-store --realise --max-jobs builders×slots into a
fresh chroot store (sandboxed like the builders; only the realise is timed), then evaluates the
same derivations with harmonia-ci and, once the evaluation has succeeded, starts the builders:
the cluster's wall time runs from the first claim to the last success (database clock).

Workloads: trivial (report the per-job overhead: claim to succeeded minus the Nix build, split into
claim, fetch inputs, build, upload, sign; targets: median ≤ 50 ms, cluster ÷ plain Nix ≤ 3) and
sleep (each build sleeps 1 s; target cluster ÷ plain Nix ≤ 1.1). It also reports the machine's CPU time per job (Nix, the
nodes, PostgreSQL), and replays a few jobs one at a time with the builder's store steps
(--samples); --trace-nix counts and times every Nix process the builders run.

--workload deep (not part of the default; "all" runs the three) compares queue orders: for
queue.order fifo and then critical-path, each on a fresh database and cluster, the builders start
and --deep-projects evaluations are triggered at once, each of --deep-leaves independent leaves
and a chain of --deep-chain derivations that the walk reaches after the leaves (so FIFO builds
the chain last); every build sleeps --deep-sleep seconds. Per order it reports the makespan
(first enqueue to last finish, database clock), the lower bound max(critical path, work ÷ slots)
from each job's measured started → finished, and makespan ÷ bound. No plain Nix side.

It reports; it exits 0 whether targets are met or not. Needs nix-bin and git.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Logger = benchLogger(cmd.ErrOrStderr())
			o.NodeLogger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			ctx, _, stop := signalContext()
			defer stop()
			r, err := e2ebench.E2E(ctx, o)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), r)
			}
			r.Print(cmd.OutOrStdout())
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Derivations, "derivations", 200, "derivations in the generated DAG (whole layers)")
	f.IntVar(&o.Width, "width", 20, "derivations per layer")
	f.IntVar(&o.Builders, "builders", 3, "builder nodes")
	f.IntVar(&o.Slots, "slots", 2, "build slots per builder")
	f.StringVar(&o.Workload, "workload", "both", "trivial, sleep, both (trivial and sleep), deep (FIFO against critical-path order) or all")
	f.IntVar(&o.Rounds, "rounds", 1, "runs per side and workload, each with fresh derivations; the best is kept")
	f.Float64Var(&o.SleepSeconds, "sleep", 1, "seconds each build of the sleep workload sleeps")
	f.IntVar(&o.DeepProjects, "deep-projects", 3, "deep workload: projects evaluated at once")
	f.IntVar(&o.DeepLeaves, "deep-leaves", 50, "deep workload: independent leaves per project, walked before the chain")
	f.IntVar(&o.DeepChain, "deep-chain", 30, "deep workload: derivations in each project's chain")
	f.Float64Var(&o.DeepSleep, "deep-sleep", 0.5, "deep workload: seconds each build sleeps")
	f.IntVar(&o.Samples, "samples", 10, "single-derivation plain Nix builds and replayed jobs (-1 skips both)")
	f.BoolVar(&o.TraceNix, "trace-nix", false, "count and time the builders' Nix processes through logging wrappers (adds a bash start to each)")
	f.BoolVar(&o.Keep, "keep", false, "keep the temporary directory")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newBenchWebhook() *cobra.Command {
	var o webhookbench.WebhookOptions
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "webhook",
		Short: "Measure webhook deliveries accepted per second and build-to-status latency",
		Long: `webhook runs a frontend's forge side on a private PostgreSQL. It posts --deliveries signed push
deliveries in a real Gitea 1.26 delivery's format (spread over --repos projects, --concurrency at a
time) to one webhook receiver over loopback HTTP: each is verified, written as an evaluation
(superseding the branch's previous one) and answered 202. Then it finishes --statuses builds one
at a time, each the last build of an evaluation, with the notification the queue sends, and times
each from the notification's arrival to the commit status call leaving the node (no debounce),
against a forge that answers at once.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Logger = benchLogger(cmd.ErrOrStderr())
			ctx, _, stop := signalContext()
			defer stop()
			r, err := webhookbench.Webhook(ctx, o)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), r)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "harmonia-ci bench webhook — %s, PostgreSQL %s, %s\n", r.Machine, r.Postgres, r.Date)
			fmt.Fprintf(w, "  %d push deliveries over %d projects, %d at a time\n", r.Deliveries, r.Repos, r.Concurrency)
			fmt.Fprintf(w, "  accepted %.0f deliveries/s (%.0f/min)   p50 %.1f ms   p99 %.1f ms\n",
				r.DeliveriesPerSecond, r.DeliveriesPerSecond*60, r.DeliveryP50Ms, r.DeliveryP99Ms)
			fmt.Fprintf(w, "  build notification → status call: %d statuses   p50 %.1f ms   p99 %.1f ms   max %.1f ms\n",
				r.Statuses, r.StatusP50Ms, r.StatusP99Ms, r.StatusMaxMs)
			fmt.Fprintf(w, "  forge calls %d, exact repeats %d\n", r.ForgeCalls, r.DuplicateCalls)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Deliveries, "deliveries", 5000, "push deliveries to post")
	f.IntVar(&o.Concurrency, "concurrency", 16, "deliveries in flight at once")
	f.IntVar(&o.Repos, "repos", 50, "projects the pushes spread over")
	f.IntVar(&o.Statuses, "statuses", 500, "finished builds timed to their status call")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newBenchGC(g *globalFlags) *cobra.Command {
	var o gcbench.GCOptions
	var asJSON bool
	var backends, secretFile string
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Mark and sweep a synthetic cache on the local store and MinIO; report objects scanned/s, the live-set query, and an extrapolation to a million objects",
		Long: `gc fills a private PostgreSQL (fsync off) with a synthetic package set and a cache with its
objects: --objects/2 store paths, each a narinfo and a NAR of random bytes. A share
--live-fraction of the paths are derivations the database keeps (a .drv and an output each,
published, with inputs forming a DAG and a succeeded evaluation whose attributes are the
derivations nothing else uses); the others are only in the cache. --unbuilt leaves the outputs of
a share of the derivations out of the cache, as failed builds do. It then runs the garbage
collector once per backend (--backends: the local store and a private MinIO, or the bucket of
--s3-endpoint and --s3-bucket, which must be empty) and checks that exactly the dead objects
went. It does this for a quarter of --objects and for --objects, and extrapolates each phase to
1,000,000 objects: list, mark and sweep linearly from the larger run, the live-set query and the
database step by their measured growth.

With --database-url the database must hold no derivations or evaluations.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.DatabaseURL = g.databaseURL
			o.Backends = strings.Split(backends, ",")
			if secretFile != "" {
				b, err := os.ReadFile(secretFile)
				if err != nil {
					return fmt.Errorf("--s3-secret-key-file: %w", err)
				}
				o.S3.SecretKey = strings.TrimSpace(string(b))
			}
			o.S3.PathStyle = true
			o.Logger = benchLogger(cmd.ErrOrStderr())
			ctx, _, stop := signalContext()
			defer stop()
			r, err := gcbench.GC(ctx, o)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), r)
			}
			printGCReport(cmd.OutOrStdout(), r)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Objects, "objects", 100000, "cache objects of the larger run (half narinfos, half NARs)")
	f.Float64Var(&o.LiveFraction, "live-fraction", 0.5, "share of the store paths the database keeps")
	f.Float64Var(&o.Unbuilt, "unbuilt", 0, "share of the derivations whose build failed (the cache has only their .drv)")
	f.StringVar(&backends, "backends", "local,s3", "comma-separated backends: local, s3")
	f.IntVar(&o.Workers, "workers", 32, "the collector's parallel narinfo reads and deletions")
	f.IntVar(&o.Writers, "writers", 32, "parallel writes while filling the cache")
	f.Uint64Var(&o.Seed, "seed", 0, "package set seed (default: time)")
	f.StringVar(&o.S3.Endpoint, "s3-endpoint", "", "an S3 server (host:port) to use instead of a private MinIO")
	f.StringVar(&o.S3.Bucket, "s3-bucket", "", "an empty bucket on --s3-endpoint; emptied again after each run")
	f.StringVar(&o.S3.Region, "s3-region", "us-east-1", "region of --s3-endpoint")
	f.StringVar(&o.S3.AccessKey, "s3-access-key", "", "access key of --s3-endpoint")
	f.StringVar(&secretFile, "s3-secret-key-file", "", "file holding the secret key of --s3-endpoint")
	f.BoolVar(&o.S3.UseTLS, "s3-tls", false, "use HTTPS for --s3-endpoint")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printGCReport(w io.Writer, r gcbench.GCReport) {
	fmt.Fprintf(w, "harmonia-ci bench gc — %s, PostgreSQL %s, %s, %s\n", r.Machine, r.Postgres, r.MinIO, r.Date)
	fmt.Fprintf(w, "  live fraction %.2f, unbuilt %.2f, %d workers, seed %d; load average %.1f before, %.1f after\n",
		r.LiveFraction, r.Unbuilt, r.Workers, r.Seed, r.LoadBefore, r.LoadAfter)
	for _, x := range r.Runs {
		fmt.Fprintf(w, "  %-5s %d objects: %d live paths, %d dead; %d derivations (%d unbuilt), %d roots; filled in %.1f s\n",
			x.Backend, x.Objects, x.LivePaths, x.DeadPaths, x.Derivations, x.Unbuilt, x.Roots, x.FillSeconds)
		fmt.Fprintf(w, "        collection     %.2f s = %.0f scanned/s\n", x.Seconds, x.ScannedPerSecond)
		fmt.Fprintf(w, "        list           %.2f s = %.0f objects/s\n", x.ListSeconds, x.ListPerSecond)
		fmt.Fprintf(w, "        mark           %.2f s = %.0f narinfo reads/s (%d)\n", x.MarkSeconds, x.ReadsPerSecond, x.NarInfoReads)
		fmt.Fprintf(w, "        sweep          %.2f s = %.0f deleted/s (%d)\n", x.SweepSeconds, x.DeletedPerSecond, x.Deleted)
		fmt.Fprintf(w, "        live-set query %.1f ms; database step and locks %.2f s\n", x.LiveSetQueryMs, x.OtherSeconds)
		fmt.Fprintf(w, "        checked        %d live objects kept, %d dead gone\n", x.Kept, x.Gone)
	}
	for _, e := range r.Extrapolations {
		verdict := "NOT well under an hour"
		if e.WellUnderAnHour {
			verdict = "well under an hour"
		}
		fmt.Fprintf(w, "  %s at %d objects: list %.0f s + mark %.0f s + sweep %.0f s + live-set query %.2f s (k %.2f) + database step %.1f s (k %.2f) = %.1f min: %s\n",
			e.Backend, e.Objects, e.ListSeconds, e.MarkSeconds, e.SweepSeconds, e.LiveSetQuery, e.LiveSetExponent,
			e.OtherSeconds, e.OtherExponent, e.TotalSeconds/60, verdict)
		fmt.Fprintf(w, "        check: the whole collection grew with k %.2f; at that growth %.1f min\n", e.RunExponent, e.RunGrowthSeconds/60)
	}
	if len(r.Extrapolations) > 0 {
		fmt.Fprintf(w, "  extrapolation: %s\n", r.Extrapolations[0].Method)
	}
}
