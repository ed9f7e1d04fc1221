// Package gcbench is `harmonia-ci bench gc`: mark and sweep of a synthetic cache on the local
// store and S3, extrapolated to a million objects.
package gcbench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/harmonia-ci/harmonia-ci/internal/bench"
	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/gc"
	"github.com/harmonia-ci/harmonia-ci/internal/minioserver"
)

const (
	// gcTarget is the cache size the report extrapolates to: about nixpkgs' closure.
	gcTarget = 1_000_000
	// gcGrace is the collector's grace period; the benchmark waits it out (and the second of
	// S3 timestamps) before collecting, so every object is a candidate.
	gcGrace = 10 * time.Millisecond
	// gcWellUnder is what "well under an hour" means in the verdict.
	gcWellUnder = 30 * time.Minute
)

// GCOptions configures `harmonia-ci bench gc`.
type GCOptions struct {
	Objects      int     // cache objects of the larger run, half narinfos and half NARs; default 100000
	LiveFraction float64 // share of the store paths the database keeps; default 0.5
	// Unbuilt is the share of the derivations whose build failed: the database keeps their
	// output path but the cache has no narinfo for it, which the sweep reads again before each
	// round of deletions. Default 0.
	Unbuilt  float64
	Backends []string // "local", "s3"; default both
	// DatabaseURL of a database without derivations or evaluations; "" starts a private server.
	DatabaseURL string
	// S3 is an empty bucket to use instead of a private MinIO (Endpoint and Bucket set); the
	// benchmark empties it again after each run.
	S3      blob.S3Config
	Workers int    // the collector's parallel reads and deletions (gc.Config.Workers); default 32
	Writers int    // parallel writes while filling the cache; default 32
	Seed    uint64 // default: time
	Logger  *slog.Logger
}

// GCReport is what the benchmark measured: a run per size and backend, and the extrapolation
// per backend.
type GCReport struct {
	Date         string  `json:"date"`
	Machine      string  `json:"machine"`
	Postgres     string  `json:"postgres"`
	MinIO        string  `json:"minio,omitempty"`
	Objects      int     `json:"objects"`
	LiveFraction float64 `json:"live_fraction"`
	Unbuilt      float64 `json:"unbuilt"`
	Workers      int     `json:"workers"`
	Seed         uint64  `json:"seed"`
	// The machine's one-minute load average before and after: other work on it slows every
	// phase.
	LoadBefore     float64           `json:"load_before"`
	LoadAfter      float64           `json:"load_after"`
	Runs           []GCRun           `json:"runs"` // the smaller size first
	Extrapolations []GCExtrapolation `json:"extrapolations"`
}

// GCRun is one collection of a filled cache.
type GCRun struct {
	Backend     string `json:"backend"`
	Objects     int    `json:"objects"`    // narinfos and NARs written, besides nix-cache-info
	LivePaths   int    `json:"live_paths"` // with a narinfo and a NAR
	Unbuilt     int    `json:"unbuilt"`    // derivations whose output the cache does not have
	DeadPaths   int    `json:"dead_paths"`
	Derivations int    `json:"derivations"`
	Roots       int    `json:"roots"` // evaluation attributes; the rest is live through inputs

	FillSeconds float64 `json:"fill_seconds"` // writing the objects, not part of the collection

	Scanned          int64   `json:"scanned"`
	Seconds          float64 `json:"seconds"` // Collector.Run
	ScannedPerSecond float64 `json:"scanned_per_second"`
	ListSeconds      float64 `json:"list_seconds"`
	ListPerSecond    float64 `json:"list_per_second"`
	MarkSeconds      float64 `json:"mark_seconds"`
	NarInfoReads     int64   `json:"narinfo_reads"`
	ReadsPerSecond   float64 `json:"narinfo_reads_per_second"`
	SweepSeconds     float64 `json:"sweep_seconds"`
	Deleted          int64   `json:"deleted"`
	DeletedPerSecond float64 `json:"deleted_per_second"`
	LiveSetQueryMs   float64 `json:"live_set_query_ms"`
	// OtherSeconds is the rest of the run: the database step, the publication lock, the live
	// logs query and recording the run.
	OtherSeconds float64 `json:"other_seconds"`

	Kept int `json:"kept"` // live objects present afterwards (all of them, or the run failed)
	Gone int `json:"gone"` // dead objects absent afterwards
}

// GCExtrapolation estimates a collection of gcTarget objects on one backend from two runs.
type GCExtrapolation struct {
	Backend         string  `json:"backend"`
	Objects         int     `json:"objects"`
	FromObjects     []int   `json:"from_objects"` // the smaller and the larger run
	ListSeconds     float64 `json:"list_seconds"`
	MarkSeconds     float64 `json:"mark_seconds"`
	SweepSeconds    float64 `json:"sweep_seconds"`
	LiveSetQuery    float64 `json:"live_set_query_seconds"`
	LiveSetExponent float64 `json:"live_set_exponent"` // measured growth, time ∝ objects^k
	OtherSeconds    float64 `json:"other_seconds"`
	OtherExponent   float64 `json:"other_exponent"`
	TotalSeconds    float64 `json:"total_seconds"`
	// The whole collection's measured growth, and its time at the target if that growth went
	// on: a check on the per-phase sum when objects/s fell between the sizes.
	RunExponent      float64 `json:"run_exponent"`
	RunGrowthSeconds float64 `json:"run_growth_seconds"`
	WellUnderAnHour  bool    `json:"well_under_an_hour"` // both estimates at most half an hour
	Method           string  `json:"method"`
}

func (o *GCOptions) defaults() error {
	o.Objects = bench.Positive(o.Objects, 100000)
	if o.Objects < 40 {
		return fmt.Errorf("bench gc: %d objects is too few (at least 40)", o.Objects)
	}
	if o.LiveFraction == 0 {
		o.LiveFraction = 0.5
	}
	if o.LiveFraction < 0 || o.LiveFraction > 1 {
		return fmt.Errorf("bench gc: live fraction %v is not between 0 and 1", o.LiveFraction)
	}
	if o.Unbuilt < 0 || o.Unbuilt > 1 {
		return fmt.Errorf("bench gc: unbuilt share %v is not between 0 and 1", o.Unbuilt)
	}
	if len(o.Backends) == 0 {
		o.Backends = []string{"local", "s3"}
	}
	for _, b := range o.Backends {
		if b != "local" && b != "s3" {
			return fmt.Errorf("bench gc: backend %q: want local or s3", b)
		}
	}
	if o.S3.Endpoint != "" && o.S3.Bucket == "" {
		return errors.New("bench gc: an S3 endpoint needs a bucket")
	}
	o.Workers = bench.Positive(o.Workers, 32)
	o.Writers = bench.Positive(o.Writers, 32)
	o.Seed = bench.Seed(o.Seed)
	o.Logger = bench.Logger(o.Logger)
	return nil
}

// GC runs the garbage collection benchmark: for a quarter of o.Objects and for o.Objects, it
// fills the database and each backend's cache with a synthetic package set (live store paths
// the database keeps, dead ones only in the cache), collects once per backend, checks that
// exactly the dead objects went, and extrapolates each backend's phases to gcTarget objects.
func GC(ctx context.Context, o GCOptions) (r GCReport, err error) {
	if err := o.defaults(); err != nil {
		return r, err
	}
	r = GCReport{
		Date: time.Now().UTC().Format(time.RFC3339), Objects: o.Objects, LiveFraction: o.LiveFraction, Unbuilt: o.Unbuilt,
		Workers: o.Workers, Seed: o.Seed,
		Machine:    bench.Machine(),
		LoadBefore: bench.LoadAverage(),
	}
	defer func() { r.LoadAfter = bench.LoadAverage() }()
	dir, err := os.MkdirTemp("", "hci-bench-gc-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil { // the embedded server runs as postgres when root
		return r, err
	}
	b := &gcBench{o: o, dir: dir}
	if err := b.open(ctx, &r); err != nil {
		return r, err
	}
	defer b.close()

	sizes := []int{o.Objects / 4 &^ 1, o.Objects &^ 1}
	for _, n := range sizes {
		runs, err := b.size(ctx, n)
		if err != nil {
			return r, err
		}
		r.Runs = append(r.Runs, runs...)
	}
	// The live-set query is the same on every backend's run of a size: its best time there is
	// the least disturbed by other work on the machine.
	best := map[int]float64{}
	for _, x := range r.Runs {
		if q, ok := best[x.Objects]; !ok || x.LiveSetQueryMs < q {
			best[x.Objects] = x.LiveSetQueryMs
		}
	}
	for i := range o.Backends {
		// Runs are by size, then backend.
		small, large := r.Runs[i], r.Runs[len(o.Backends)+i]
		small.LiveSetQueryMs, large.LiveSetQueryMs = best[small.Objects], best[large.Objects]
		r.Extrapolations = append(r.Extrapolations, extrapolateGC(small, large, gcTarget))
	}
	return r, nil
}

// gcBench holds what the runs of one benchmark share.
type gcBench struct {
	o         GCOptions
	dir       string
	db        *bench.Database
	minio     *minioserver.Server
	projectID int64
}

func (b *gcBench) open(ctx context.Context, r *GCReport) error {
	var err error
	b.db, err = bench.OpenDatabase(ctx, bench.DatabaseOptions{URL: b.o.DatabaseURL, Dir: filepath.Join(b.dir, "pg"), MaxServerConns: 100, App: "harmonia-ci bench gc", PoolConns: 8, Logger: b.o.Logger})
	if err != nil {
		return err
	}
	r.Postgres = b.db.Version
	var n int64
	err = b.db.Pool.QueryRow(ctx, sqlDerivationsAndEvals).Scan(&n)
	if err != nil {
		return err
	}
	if n > 0 {
		// The collector would delete real evaluations past their retention, and the cleanup
		// between runs deletes derivations.
		return fmt.Errorf("bench gc: the database already has %d derivations and evaluations; use an empty one", n)
	}
	ids, err := bench.CreateProjects(ctx, b.db.Pool, b.o.Seed, []int{100})
	if err != nil {
		return err
	}
	b.projectID = ids[0]
	if slices.Contains(b.o.Backends, "s3") {
		if b.o.S3.Endpoint != "" {
			store, err := blob.NewS3(b.o.S3)
			if err != nil {
				return err
			}
			if err := store.List(ctx, "", func(blob.Info) error { return errNotEmpty }); err != nil {
				if errors.Is(err, errNotEmpty) {
					return fmt.Errorf("bench gc: bucket %s is not empty", b.o.S3.Bucket)
				}
				return err
			}
			r.MinIO = "given bucket " + b.o.S3.Bucket
		} else {
			bin, err := minioserver.Find()
			if err != nil {
				return fmt.Errorf("bench gc: %w", err)
			}
			if b.minio, err = minioserver.Start(ctx, bin, filepath.Join(b.dir, "minio")); err != nil {
				return fmt.Errorf("bench gc: %w", err)
			}
			r.MinIO = b.minio.Version
		}
	}
	return nil
}

var errNotEmpty = errors.New("not empty")

func (b *gcBench) close() {
	if b.minio != nil {
		b.minio.Stop()
	}
	if b.db != nil {
		b.db.Close()
	}
}

// size fills the database for objects cache objects, then fills, collects and checks each
// backend in turn, and removes the package set again.
func (b *gcBench) size(ctx context.Context, objects int) ([]GCRun, error) {
	w, err := generateGCWorld(objects, b.o.LiveFraction, b.o.Unbuilt, b.o.Seed)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := w.record(ctx, b.db.Pool, b.projectID); err != nil {
		return nil, err
	}
	b.o.Logger.Info("bench gc: database filled", "objects", objects, "derivations", len(w.derivations),
		"roots", len(w.roots), "seconds", time.Since(start).Seconds())
	var runs []GCRun
	for _, backend := range b.o.Backends {
		run, err := b.collect(ctx, w, backend)
		if err != nil {
			return nil, err
		}
		runs = append(runs, run)
	}
	return runs, w.forget(ctx, b.db.Pool, b.projectID)
}

// collect fills one backend with w's objects, collects, and checks what is left.
func (b *gcBench) collect(ctx context.Context, w *gcWorld, backend string) (GCRun, error) {
	run := GCRun{Backend: backend, Objects: len(w.objects), LivePaths: w.livePaths, Unbuilt: len(w.unbuilt), DeadPaths: w.deadPaths,
		Derivations: len(w.derivations), Roots: len(w.roots)}
	store, done, err := b.store(ctx, backend, len(w.objects))
	if err != nil {
		return run, err
	}
	defer done()

	start := time.Now()
	if err := w.write(ctx, store, b.o.Writers); err != nil {
		return run, err
	}
	run.FillSeconds = time.Since(start).Seconds()
	b.o.Logger.Info("bench gc: cache filled", "backend", backend, "objects", len(w.objects), "seconds", run.FillSeconds)
	// S3 timestamps may be whole seconds: wait until every object is past the grace period.
	time.Sleep(gcGrace + time.Second)

	c, err := gc.New(gc.Config{Store: store, Retention: 90 * 24 * time.Hour, LogRetention: 30 * 24 * time.Hour,
		Grace: gcGrace, Workers: b.o.Workers, Logger: b.o.Logger}, b.db.Pool)
	if err != nil {
		return run, err
	}
	pool := b.db.Pool
	rep, err := c.Run(ctx, gc.RunOptions{NodeID: "bench", Fence: func(ctx context.Context, fn func(pgx.Tx) error) error {
		return pgx.BeginFunc(ctx, pool, fn)
	}})
	if err != nil {
		return run, fmt.Errorf("bench gc: %s: %w", backend, err)
	}
	run.Scanned, run.NarInfoReads, run.Deleted = rep.Scanned, rep.NarInfoReads, rep.Objects().Objects
	run.Seconds = rep.Duration.Seconds()
	run.ListSeconds, run.MarkSeconds, run.SweepSeconds = rep.ListDuration.Seconds(), rep.MarkDuration.Seconds(), rep.SweepDuration.Seconds()
	run.LiveSetQueryMs = float64(rep.LiveSetQuery.Microseconds()) / 1000
	run.OtherSeconds = max(0, run.Seconds-run.ListSeconds-run.MarkSeconds-run.SweepSeconds-rep.LiveSetQuery.Seconds())
	run.ScannedPerSecond = bench.PerSecond(float64(run.Scanned), run.Seconds)
	run.ListPerSecond = bench.PerSecond(float64(run.Scanned), run.ListSeconds)
	run.ReadsPerSecond = bench.PerSecond(float64(run.NarInfoReads), run.MarkSeconds)
	run.DeletedPerSecond = bench.PerSecond(float64(run.Deleted), run.SweepSeconds)
	b.o.Logger.Info("bench gc: collected", "backend", backend, "objects", len(w.objects), "seconds", run.Seconds)

	if n := rep.Evaluations + rep.Jobs + rep.Derivations; n != 0 {
		return run, fmt.Errorf("bench gc: %s: the database step deleted %d rows of the live package set", backend, n)
	}
	if want := int64(len(w.objects) + 1); run.Scanned != want {
		return run, fmt.Errorf("bench gc: %s: scanned %d objects, want %d (the objects and nix-cache-info)", backend, run.Scanned, want)
	}
	if want := int64(2 * w.deadPaths); run.Deleted != want {
		return run, fmt.Errorf("bench gc: %s: deleted %d objects, want the %d dead ones", backend, run.Deleted, want)
	}
	if run.Kept, run.Gone, err = w.check(ctx, store); err != nil {
		return run, fmt.Errorf("bench gc: %s: %w", backend, err)
	}
	return run, nil
}

// store opens an empty cache on backend for a run of objects; done releases it.
func (b *gcBench) store(ctx context.Context, backend string, objects int) (blob.Store, func(), error) {
	if backend == "local" {
		dir := filepath.Join(b.dir, "cache-"+strconv.Itoa(objects))
		store, err := blob.NewLocal(dir, "", []byte(bench.RandomHex(16)))
		if err != nil {
			return nil, nil, err
		}
		return store, func() { _ = store.Close(); _ = os.RemoveAll(dir) }, nil
	}
	cfg := b.o.S3
	if b.minio != nil {
		cfg = b.minio.Config
		cfg.Bucket = "bench-gc-" + strconv.Itoa(objects)
		if err := b.minio.CreateBucket(ctx, cfg.Bucket); err != nil {
			return nil, nil, err
		}
	}
	store, err := blob.NewS3(cfg)
	if err != nil {
		return nil, nil, err
	}
	if b.minio != nil {
		return store, func() {}, nil // its data directory goes with the server
	}
	return store, func() {
		if err := emptyStore(context.WithoutCancel(ctx), store, b.o.Workers); err != nil {
			b.o.Logger.Warn("bench gc: could not empty the bucket", "bucket", cfg.Bucket, "error", err)
		}
	}, nil
}

func emptyStore(ctx context.Context, store blob.Store, workers int) error {
	var keys []string
	if err := store.List(ctx, "", func(i blob.Info) error { keys = append(keys, i.Key); return nil }); err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	for _, k := range keys {
		g.Go(func() error { return store.Delete(gctx, k) })
	}
	return g.Wait()
}

// extrapolateGC estimates a collection of target objects from a smaller and a larger run. See
// Method.
func extrapolateGC(small, large GCRun, target int) GCExtrapolation {
	f := float64(target) / float64(large.Objects)
	growth := func(ts, tl float64) float64 {
		if ts <= 0 || tl <= 0 {
			return 1
		}
		return math.Log(tl/ts) / math.Log(float64(large.Objects)/float64(small.Objects))
	}
	e := GCExtrapolation{
		Backend: large.Backend, Objects: target, FromObjects: []int{small.Objects, large.Objects},
		ListSeconds: large.ListSeconds * f, MarkSeconds: large.MarkSeconds * f, SweepSeconds: large.SweepSeconds * f,
		LiveSetExponent: growth(small.LiveSetQueryMs, large.LiveSetQueryMs),
		OtherExponent:   growth(small.OtherSeconds, large.OtherSeconds),
	}
	e.LiveSetQuery = large.LiveSetQueryMs / 1000 * math.Pow(f, max(e.LiveSetExponent, 1))
	e.OtherSeconds = large.OtherSeconds * math.Pow(f, max(e.OtherExponent, 1))
	e.TotalSeconds = e.ListSeconds + e.MarkSeconds + e.SweepSeconds + e.LiveSetQuery + e.OtherSeconds
	e.RunExponent = growth(small.Seconds, large.Seconds)
	e.RunGrowthSeconds = large.Seconds * math.Pow(f, max(e.RunExponent, 1))
	e.WellUnderAnHour = max(e.TotalSeconds, e.RunGrowthSeconds) <= gcWellUnder.Seconds()
	e.Method = fmt.Sprintf("list, mark and sweep: the %d-object run's seconds × %d/%d (linear: at a fixed live "+
		"fraction each phase's work grows with the objects; compare its objects/s at both sizes); the "+
		"live-set query (the best of the backends' runs at each size: it is the same query) and the rest "+
		"(database step, locks): the %d-object run's seconds × (%d/%d)^max(k, 1), "+
		"k = ln(t%d/t%d)/ln(%d/%d) measured (never assumed below linear); total: their sum; "+
		"check: the whole collection's seconds × (%d/%d)^max(k, 1) with its own k; well under an hour: "+
		"both at most %s",
		large.Objects, target, large.Objects, large.Objects, target, large.Objects,
		large.Objects, small.Objects, large.Objects, small.Objects, target, large.Objects, gcWellUnder)
	return e
}
