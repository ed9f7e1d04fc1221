package builder

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
)

// gcRetryAfter is how long a collection that failed or could not free MinFree is not repeated,
// unless a job ended since (dropping its roots): another pass over the whole store would most
// likely end the same.
const gcRetryAfter = 10 * time.Minute

// storeGC keeps the builder's store within MinFree and MaxFree, as Nix's min-free and max-free
// do for one build: when the free space of the store's file system is below MinFree, it runs
// `nix-store --gc --max-freed MaxFree-free`, which deletes what neither a GC root (a running
// job's, see Builder.handle, or anyone else's) nor a temp root (a running Nix's) keeps. Builds
// go on meanwhile; jobs wait only to add their roots (see addRoots).
type storeGC struct {
	store            Store
	minFree, maxFree int64 // minFree <= 0: never collect
	logger           *slog.Logger
	clock            clock.Clock
	metrics          *storeGCMetrics // nil without a registerer

	// freeFunc returns the bytes available in dir's file system (tests replace statfs).
	freeFunc func(dir string) (int64, error)
	// beforeCollect, if set, runs before each collection, when no job adds roots: the builder
	// closes its idle daemon sessions, whose temporary roots would keep garbage alive.
	beforeCollect func()

	// roots orders roots and collections: a job holds one unit of it while it adds roots, a
	// collection all of them. Nix reads the roots once, when it starts: a root added during a
	// collection would not keep a path that was valid, and garbage, then. (A semaphore, not
	// an RWMutex: a job that is cancelled stops waiting.)
	roots *semaphore.Weighted
	// busy holds a token while a collection runs: one at a time.
	busy chan struct{}
	// wg counts the collections started in the background.
	wg sync.WaitGroup

	mu       sync.Mutex
	shortAt  time.Time // when the last collection failed or left less than minFree free; else zero
	jobEnded bool      // a job ended since shortAt
}

func newStoreGC(store Store, minFree, maxFree int64, logger *slog.Logger, clk clock.Clock, reg prometheus.Registerer) *storeGC {
	return &storeGC{
		store: store, minFree: minFree, maxFree: max(maxFree, minFree), logger: logger, clock: clk,
		metrics: newStoreGCMetrics(reg), freeFunc: statfsFree, busy: make(chan struct{}, 1),
		roots: semaphore.NewWeighted(rootsWeight),
	}
}

// rootsWeight is the weight of storeGC.roots: more than jobs ever add roots at once.
const rootsWeight = 1 << 30

// addRoots is store.AddRoots, never while a collection runs.
func (g *storeGC) addRoots(ctx context.Context, store Store, name string, paths []string) (remove func(), err error) {
	if err := g.roots.Acquire(ctx, 1); err != nil {
		return nil, fmt.Errorf("add gc roots: %w", context.Cause(ctx))
	}
	defer g.roots.Release(1)
	return store.AddRoots(name, paths)
}

// jobDone notes that a job ended: its paths may be garbage now.
func (g *storeGC) jobDone() {
	g.mu.Lock()
	g.jobEnded = true
	g.mu.Unlock()
}

// check measures the free space and, when it is below minFree, starts a collection in the
// background unless one runs. It is cheap (one statfs): the builder calls it before each job
// and at each claim check.
func (g *storeGC) check(ctx context.Context) {
	select {
	case g.busy <- struct{}{}:
	default:
		return
	}
	free, due := g.due(false)
	if !due {
		<-g.busy
		return
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		defer func() { <-g.busy }()
		_ = g.collect(ctx, free)
	}()
}

// collectNow is check in the foreground: it waits for a running collection to end, and does not
// wait out gcRetryAfter. It reports whether it collected.
func (g *storeGC) collectNow(ctx context.Context) (bool, error) {
	select {
	case g.busy <- struct{}{}:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	defer func() { <-g.busy }()
	free, due := g.due(true)
	if !due {
		return false, nil
	}
	return true, g.collect(ctx, free)
}

// wait waits for the collections started in the background; the builder stops them with ctx.
func (g *storeGC) wait() { g.wg.Wait() }

// due measures the free space and reports whether a collection is due.
func (g *storeGC) due(force bool) (free int64, due bool) {
	free, err := g.free()
	if err != nil {
		g.logger.Warn("could not measure the store's free space", "error", err)
		return 0, false
	}
	if g.minFree <= 0 || free >= g.minFree {
		return free, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return free, force || g.shortAt.IsZero() || g.jobEnded || g.clock.Now().Sub(g.shortAt) >= gcRetryAfter
}

// free returns the bytes available to the builder in its store's file system.
func (g *storeGC) free() (int64, error) {
	free, err := g.freeFunc(filepath.Join(g.store.rootDir(), "nix/store"))
	if err != nil {
		return 0, err
	}
	if g.metrics != nil {
		g.metrics.free.Set(float64(free))
	}
	return free, nil
}

// gcResult is what one collection did.
type gcResult struct {
	paths      int   // store paths deleted
	freed      int64 // bytes freed, as Nix counts them; -1 if its output did not say
	freeBefore int64
	freeAfter  int64
	duration   time.Duration
}

// collect runs `nix-store --gc` until MaxFree is free, in the builder's store with the options
// of its other Nix calls, and logs and counts what it freed. The caller holds busy.
func (g *storeGC) collect(ctx context.Context, free int64) error {
	res := gcResult{freeBefore: free, freed: -1}
	want := g.maxFree - free
	g.logger.Info("the store's free space is below min_free: collecting garbage",
		"free_bytes", free, "min_free", g.minFree, "max_freed", want)

	start := time.Now()
	if err := g.roots.Acquire(ctx, rootsWeight); err != nil {
		return fmt.Errorf("collect garbage in %s: %w", g.store.rootDir(), context.Cause(ctx))
	}
	if g.beforeCollect != nil {
		g.beforeCollect()
	}
	args := append([]string{"--gc", "--max-freed", strconv.FormatInt(want, 10)}, g.store.options(nil)...)
	out, err := g.store.run(ctx, "nix-store", args...)
	g.roots.Release(rootsWeight)
	res.duration = time.Since(start)
	if err != nil {
		if ctx.Err() == nil {
			g.logger.Error("garbage collection of the store failed", "error", err, "duration", res.duration.String())
			g.count("error", res)
			g.pause(true)
		}
		return fmt.Errorf("collect garbage in %s: %w", g.store.rootDir(), err)
	}
	res.paths, res.freed = parseGCOutput(out)
	res.freeAfter = free
	if after, err := g.free(); err == nil {
		res.freeAfter = after
	}
	short := res.freeAfter < g.minFree
	g.pause(short)

	attrs := []any{"deleted_paths", res.paths, "freed_bytes", res.freed, "duration", res.duration.String(),
		"free_bytes_before", res.freeBefore, "free_bytes_after", res.freeAfter}
	if short {
		// Building goes on: what is left is rooted by running jobs, whose ends free it anyway,
		// or by someone else (the operator's to decide); a job that finds the disk full fails
		// as a transient failure and is retried, here or on another builder.
		g.logger.Warn("garbage collection could not free min_free: the rest of the store is rooted; building goes on",
			append(attrs, "min_free", g.minFree)...)
		g.count("short", res)
	} else {
		g.logger.Info("collected garbage in the store", attrs...)
		g.count("ok", res)
	}
	return nil
}

// pause records whether the next collections wait for a job's end or gcRetryAfter.
func (g *storeGC) pause(pause bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.shortAt, g.jobEnded = time.Time{}, false
	if pause {
		g.shortAt = g.clock.Now()
	}
}

func (g *storeGC) count(result string, res gcResult) {
	if g.metrics == nil {
		return
	}
	g.metrics.runs.WithLabelValues(result).Inc()
	if res.freed > 0 {
		g.metrics.freed.Add(float64(res.freed))
	}
}

// gcSummary is nix-store --gc's last line: "2 store paths deleted, 1.50 MiB freed" (Nix 2.8
// always says MiB; later versions pick the unit).
var gcSummary = regexp.MustCompile(`(\d+) store paths deleted, ([0-9.]+) (bytes|KiB|MiB|GiB|TiB) freed`)

// parseGCOutput returns the paths deleted and bytes freed nix-store --gc reports; -1 bytes if
// it reports none.
func parseGCOutput(out string) (paths int, freed int64) {
	m := gcSummary.FindStringSubmatch(out)
	if m == nil {
		return 0, -1
	}
	paths, _ = strconv.Atoi(m[1])
	f, err := strconv.ParseFloat(m[2], 64)
	if err != nil {
		return paths, -1
	}
	shift := map[string]uint{"bytes": 0, "KiB": 10, "MiB": 20, "GiB": 30, "TiB": 40}[m[3]]
	return paths, int64(f * float64(int64(1)<<shift))
}

// statfsFree returns the bytes available to unprivileged users in dir's file system, as Nix
// measures min-free.
func statfsFree(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return int64(st.Bavail) * st.Bsize, nil
}

// storeGCMetrics are the store GC's series.
type storeGCMetrics struct {
	free  prometheus.Gauge
	runs  *prometheus.CounterVec
	freed prometheus.Counter
}

func newStoreGCMetrics(reg prometheus.Registerer) *storeGCMetrics {
	if reg == nil {
		return nil
	}
	m := &storeGCMetrics{
		free: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "harmonia_ci_builder_store_free_bytes",
			Help: "Free space of the file system holding this builder's Nix store, at the last check.",
		}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "harmonia_ci_builder_store_gc_total",
			Help: "Garbage collections of this builder's Nix store, by result: ok, short (min_free still not free: the rest is rooted), error.",
		}, []string{"result"}),
		freed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "harmonia_ci_builder_store_gc_freed_bytes_total",
			Help: "Bytes the garbage collections of this builder's Nix store freed, as Nix counts them.",
		}),
	}
	for _, r := range []string{"ok", "short", "error"} {
		m.runs.WithLabelValues(r)
	}
	reg.MustRegister(m.free, m.runs, m.freed)
	return m
}
