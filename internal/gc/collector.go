// Package gc collects garbage: evaluations past their retention, the jobs and derivations only
// they needed, expired build logs, old webhook deliveries, and every binary cache object nothing
// live points at.
//
// A collection has two steps. The database step deletes in one transaction (fenced by the GC
// leader's term). The cache step is a mark and sweep: the live set is every store path the
// database still keeps (derivations, their outputs, their sources) and, through the narinfos'
// references, the runtime closure of each; every other object older than the grace period is
// deleted. The .drv objects kept in the database (blob.Derivations) are listed, marked and
// deleted with the rest. Writers that trust what the cache holds take the publication lock
// (publication.Hold) and the sweep rechecks under it before it deletes, so a collection racing an
// evaluation that publishes the same paths loses nothing.
package gc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/publication"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

const (
	defaultWorkers = 32
	// roundSize bounds the deletions made under one hold of the publication lock, so that
	// evaluators and the signer wait at most one round.
	roundSize = 10_000
)

// Config configures a Collector.
type Config struct {
	Store        blob.Store
	Retention    time.Duration // evaluations without a retention of their own
	MaxRetention time.Duration // the longest an evaluation's own retention counts for; 0: no ceiling
	LogRetention time.Duration
	Grace        time.Duration // objects younger than this are never deleted
	Workers      int           // parallel narinfo reads and deletions; default 32
	Logger       *slog.Logger
	Metrics      *Metrics // nil: none
}

// Collector collects garbage in the database and the cache.
type Collector struct {
	cfg  Config
	pool *pgxpool.Pool
	drvs *blob.Derivations

	// afterMark, if set, runs between the mark and the sweep: tests race an evaluation there.
	afterMark func(ctx context.Context)
}

// maxRetention is the ceiling on an evaluation's own retention in seconds, nil for none. The
// evaluator cuts a longer one too; this holds for rows written otherwise (an older ceiling, or an
// evaluator's login writing directly).
func (c *Collector) maxRetention() any {
	if c.cfg.MaxRetention <= 0 {
		return nil
	}
	return seconds(c.cfg.MaxRetention)
}

// New returns a collector over pool and cfg.Store.
func New(cfg Config, pool *pgxpool.Pool) (*Collector, error) {
	if cfg.Store == nil {
		return nil, errors.New("gc: no blob store")
	}
	if cfg.Retention <= 0 || cfg.LogRetention <= 0 || cfg.Grace <= 0 {
		return nil, errors.New("gc: retention, log retention and grace must be positive")
	}
	if cfg.Workers <= 0 {
		cfg.Workers = defaultWorkers
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Logger = cfg.Logger.With("service", "gc")
	return &Collector{cfg: cfg, pool: pool, drvs: blob.NewDerivations(pool)}, nil
}

// Fence runs fn in a transaction that commits only if the caller may still write: the GC
// leader's term (cluster.Term.RunFenced).
type Fence func(ctx context.Context, fn func(tx pgx.Tx) error) error

// RunOptions identify who runs a collection.
type RunOptions struct {
	Fence  Fence       // required
	Valid  func() bool // checked before each round of deletions; nil: always
	NodeID string      // recorded in gc_runs
	Epoch  int64
}

// Run collects once: the database step, then the cache step, recorded in gc_runs.
func (c *Collector) Run(ctx context.Context, o RunOptions) (rep *Report, err error) {
	start := time.Now()
	rep = &Report{}
	defer func() {
		rep.Duration = time.Since(start)
		c.cfg.Metrics.observe(rep, err)
	}()
	var runID int64
	err = o.Fence(ctx, func(tx pgx.Tx) error {
		if err := c.databaseStep(ctx, tx, rep); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlTakeRequests); err != nil {
			return fmt.Errorf("take gc requests: %w", err)
		}
		// Only the GC leader collects: a run still "running" is one a lost term interrupted.
		if _, err := tx.Exec(ctx, sqlInterrupted); err != nil {
			return fmt.Errorf("close interrupted runs: %w", err)
		}
		return tx.QueryRow(ctx, sqlStartRun, o.NodeID, o.Epoch, rep.Evaluations, rep.Jobs,
			rep.Derivations, rep.LogsExpired, rep.Deliveries).Scan(&runID, &rep.Started)
	})
	if err != nil {
		return rep, fmt.Errorf("gc database step: %w", err)
	}
	c.cfg.Logger.Info("gc: database step done", "evaluations", rep.Evaluations, "jobs", rep.Jobs,
		"derivations", rep.Derivations, "logs_expired", rep.LogsExpired, "deliveries", rep.Deliveries)

	sweepErr := c.sweep(ctx, rep, o.Valid)
	st, msg := status.GCSucceeded, ""
	if sweepErr != nil {
		st, msg = status.GCFailed, sweepErr.Error()
	}
	o2 := rep.Objects()
	// Recorded even when the run was cancelled (a shutdown), as long as the term holds.
	fctx := context.WithoutCancel(ctx)
	err = o.Fence(fctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(fctx, sqlFinishRun, runID, st, msg, rep.Scanned, o2.Objects, o2.Bytes)
		return err
	})
	if sweepErr != nil {
		return rep, fmt.Errorf("gc cache step: %w", sweepErr)
	}
	if err != nil {
		return rep, fmt.Errorf("gc: record the run: %w", err)
	}
	c.cfg.Logger.Info("gc: cache step done", "scanned", rep.Scanned, "deleted", o2.Objects,
		"bytes", o2.Bytes, "live_paths", rep.LivePaths, "duration", time.Since(start).Round(time.Millisecond).String())
	return rep, nil
}

// DryRun reports what Run would delete now and deletes nothing: the database step runs in a
// transaction that is rolled back, after the live set was read from inside it.
func (c *Collector) DryRun(ctx context.Context) (rep *Report, err error) {
	start := time.Now()
	rep = &Report{DryRun: true}
	defer func() { rep.Duration = time.Since(start) }()
	var paths, logs []string
	var t0 time.Time
	err = pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		if err := c.databaseStep(ctx, tx, rep); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, sqlNow).Scan(&t0); err != nil {
			return err
		}
		var err error
		if paths, logs, err = c.liveFromDB(ctx, tx, rep); err != nil {
			return err
		}
		return errDryRun
	})
	if !errors.Is(err, errDryRun) {
		return rep, fmt.Errorf("gc dry run: %w", err)
	}
	objects, live, err := c.mark(ctx, rep, paths, logs)
	if err != nil {
		return rep, fmt.Errorf("gc dry run: %w", err)
	}
	for _, ob := range c.candidates(objects, live, t0) {
		if live.isLive(ob.key) {
			continue
		}
		rep.count(ob.key, ob.size)
		rep.Keys = append(rep.Keys, blob.Info{Key: ob.key, Size: ob.size, ModTime: time.Unix(0, ob.mod)})
	}
	return rep, nil
}

var errDryRun = errors.New("dry run: rolled back")

// databaseStep deletes expired evaluations, then the jobs and derivations nothing live needs,
// and expires old logs and webhook deliveries, in tx.
func (c *Collector) databaseStep(ctx context.Context, tx pgx.Tx, rep *Report) error {
	// Evaluators wait while this runs: none is between its cache lookups and its commit.
	if err := publication.HoldExclusiveTx(ctx, tx); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, sqlNeedLock, db.LockClass, db.LockJobNeed); err != nil {
		return fmt.Errorf("take the job-need lock: %w", err)
	}
	exec := func(what string, n *int64, sql string, args ...any) error {
		tag, err := tx.Exec(ctx, sql, args...)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if n != nil {
			*n = tag.RowsAffected()
		}
		return nil
	}
	var attemptLogs int64
	steps := []struct {
		what string
		n    *int64
		sql  string
		args []any
	}{
		{"delete expired evaluations", &rep.Evaluations, sqlDeleteEvaluations, []any{seconds(c.cfg.Retention), c.maxRetention()}},
		{"create the live set", nil, sqlCreateLive, nil},
		{"fill the live set", nil, sqlFillLive, []any{seconds(c.cfg.Grace)}},
		{"analyze the live set", nil, sqlAnalyzeLive, nil},
		{"delete unneeded jobs", &rep.Jobs, sqlDeleteJobs, nil},
		{"delete unneeded derivations", &rep.Derivations, sqlDeleteDerivations, nil},
		{"expire logs", &rep.LogsExpired, sqlExpireLogs, []any{seconds(c.cfg.LogRetention)}},
		{"expire attempt logs", &attemptLogs, sqlExpireAttemptLogs, []any{seconds(c.cfg.LogRetention)}},
		{"delete webhook deliveries", &rep.Deliveries, sqlDeleteDeliveries, []any{seconds(c.cfg.LogRetention)}},
	}
	for _, s := range steps {
		if err := exec(s.what, s.n, s.sql, s.args...); err != nil {
			return err
		}
	}
	rep.LogsExpired += attemptLogs
	return nil
}

// liveFromDB reads the live store paths (hash parts) and live log basenames.
func (c *Collector) liveFromDB(ctx context.Context, q db.DBTX, rep *Report) (paths, logs []string, err error) {
	start := time.Now()
	if paths, err = collectStrings(q.Query(ctx, sqlLivePaths)); err != nil {
		return nil, nil, fmt.Errorf("read the live paths: %w", err)
	}
	rep.LiveSetQuery = time.Since(start)
	if logs, err = collectStrings(q.Query(ctx, sqlLiveLogs, seconds(c.cfg.LogRetention))); err != nil {
		return nil, nil, fmt.Errorf("read the live logs: %w", err)
	}
	return paths, logs, nil
}

func collectStrings(rows pgx.Rows, err error) ([]string, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

func seconds(d time.Duration) float64 { return d.Seconds() }

// object is one listed cache object, kept small: a million of them fit in about 100 MB.
type object struct {
	key  string
	size int64
	mod  int64 // unix nanoseconds
	drv  bool  // a .drv object in the database, not in the blob store
}

// mark lists the cache and marks what paths and logs keep.
func (c *Collector) mark(ctx context.Context, rep *Report, paths, logs []string) ([]object, *liveSet, error) {
	var objects []object
	exists := map[string]bool{}
	start := time.Now()
	err := c.cfg.Store.List(ctx, "", func(info blob.Info) error {
		objects = append(objects, object{key: info.Key, size: info.Size, mod: info.ModTime.UnixNano()})
		if h, ok := strings.CutSuffix(info.Key, ".narinfo"); ok {
			exists[h] = true
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("list the cache: %w", err)
	}
	inDB := map[string]bool{}
	err = c.drvs.List(ctx, func(d blob.DrvInfo) error {
		mod := d.Created.UnixNano()
		objects = append(objects, object{key: d.NarInfoKey(), size: d.NarInfoSize, mod: mod, drv: true},
			object{key: d.NarKey, size: d.NarSize, mod: mod, drv: true})
		exists[d.Hash], inDB[d.Hash] = true, true
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("list the cache: %w", err)
	}
	rep.Scanned = int64(len(objects))
	rep.ListDuration = time.Since(start)
	start = time.Now()
	live := newLiveSet(c.cfg.Store, c.drvs, inDB, c.cfg.Workers, c.cfg.Logger)
	for _, l := range logs {
		live.addKey("log/" + l)
	}
	unique := dedup(paths)
	rep.LivePaths = len(unique)
	if err := live.mark(ctx, unique, exists, true); err != nil {
		return nil, nil, fmt.Errorf("mark: %w", err)
	}
	rep.NarInfoReads = live.reads.Load()
	rep.MarkDuration = time.Since(start)
	return objects, live, nil
}

// candidates returns the objects not live when marked and older than the grace period before t0.
func (c *Collector) candidates(objects []object, live *liveSet, t0 time.Time) []object {
	cutoff := t0.Add(-c.cfg.Grace).UnixNano()
	var out []object
	for _, ob := range objects {
		if ob.mod < cutoff && !live.isLive(ob.key) {
			out = append(out, ob)
		}
	}
	return out
}

// sweep marks, then deletes the candidates in rounds, each after a recheck under the
// publication lock.
func (c *Collector) sweep(ctx context.Context, rep *Report, valid func() bool) error {
	// The start time, read once every writer that held the lock has committed: anything the
	// mark's query misses was created after it.
	release, err := publication.HoldExclusive(ctx, c.pool)
	if err != nil {
		return err
	}
	var t0 time.Time
	err = c.pool.QueryRow(ctx, sqlNow).Scan(&t0)
	release()
	if err != nil {
		return fmt.Errorf("read the start time: %w", err)
	}
	paths, logs, err := c.liveFromDB(ctx, c.pool, rep)
	if err != nil {
		return err
	}
	objects, live, err := c.mark(ctx, rep, paths, logs)
	if err != nil {
		return err
	}
	if c.afterMark != nil {
		c.afterMark(ctx)
	}
	start := time.Now()
	defer func() { rep.SweepDuration = time.Since(start) }()
	cands := c.candidates(objects, live, t0)
	for len(cands) > 0 {
		if valid != nil && !valid() {
			return cluster.ErrNotLeader
		}
		n := min(roundSize, len(cands))
		if err := c.round(ctx, rep, live, t0, cands[:n]); err != nil {
			return err
		}
		cands = cands[n:]
	}
	rep.NarInfoReads = live.reads.Load()
	return nil
}

// round rechecks what was published since t0 and deletes the candidates still not live, all
// under the publication lock.
func (c *Collector) round(ctx context.Context, rep *Report, live *liveSet, t0 time.Time, cands []object) error {
	release, err := publication.HoldExclusive(ctx, c.pool)
	if err != nil {
		return err
	}
	defer release()
	fresh, err := collectStrings(c.pool.Query(ctx, sqlNewPaths, t0))
	if err != nil {
		return fmt.Errorf("recheck new paths: %w", err)
	}
	if err := live.mark(ctx, dedup(fresh), nil, true); err != nil {
		return fmt.Errorf("recheck new paths: %w", err)
	}
	if unresolved := live.takeUnresolved(); len(unresolved) > 0 {
		published, err := collectStrings(c.pool.Query(ctx, sqlPublishedOf, unresolved))
		if err != nil {
			return fmt.Errorf("recheck unpublished paths: %w", err)
		}
		live.keepUnresolved(missing(unresolved, published))
		if err := live.recheck(ctx, published); err != nil {
			return fmt.Errorf("recheck unpublished paths: %w", err)
		}
	}
	var logBases []string
	for _, ob := range cands {
		if base, ok := strings.CutPrefix(ob.key, "log/"); ok {
			logBases = append(logBases, base)
		}
	}
	if len(logBases) > 0 {
		kept, err := collectStrings(c.pool.Query(ctx, sqlLiveLogsOf, logBases, seconds(c.cfg.LogRetention)))
		if err != nil {
			return fmt.Errorf("recheck logs: %w", err)
		}
		for _, base := range kept {
			live.addKey("log/" + base)
		}
	}

	var doomed []object
	for _, ob := range cands {
		if !live.isLive(ob.key) {
			doomed = append(doomed, ob)
		}
	}
	deleted, err := c.remove(ctx, doomed)
	for i, ob := range doomed {
		if deleted[i] {
			rep.count(ob.key, ob.size)
		}
	}
	return err
}

// batchWorkers is how many batch deletions run at once; each takes up to blob.MaxBatchDelete keys.
const batchWorkers = 4

// remove deletes obs, in batches where the store takes them (S3), and reports which it deleted.
func (c *Collector) remove(ctx context.Context, obs []object) ([]bool, error) {
	var blobs []object
	var blobIndex []int
	var hashes []string
	for i, ob := range obs {
		if !ob.drv {
			blobs, blobIndex = append(blobs, ob), append(blobIndex, i)
		} else if h, ok := strings.CutSuffix(ob.key, ".narinfo"); ok {
			hashes = append(hashes, h)
		}
	}
	deleted := make([]bool, len(obs))
	if len(hashes) > 0 {
		// A .drv's row holds its narinfo and its NAR: both go with it.
		gone, err := c.drvs.Delete(ctx, hashes)
		if err != nil {
			return deleted, err
		}
		rows := make(map[string]bool, len(gone))
		for _, h := range gone {
			rows[h] = true
		}
		for i, ob := range obs {
			if h, ok := strings.CutSuffix(ob.key, ".narinfo"); ob.drv && ok {
				deleted[i] = rows[h]
			} else if ob.drv {
				deleted[i] = true
			}
		}
	}
	done, err := c.removeBlobs(ctx, blobs)
	for j, i := range blobIndex {
		deleted[i] = done[j]
	}
	return deleted, err
}

// removeBlobs deletes obs from the blob store, in batches where it takes them (S3).
func (c *Collector) removeBlobs(ctx context.Context, obs []object) ([]bool, error) {
	deleted := make([]bool, len(obs))
	g, gctx := errgroup.WithContext(ctx)
	bd, batched := c.cfg.Store.(blob.BatchDeleter)
	if !batched {
		g.SetLimit(c.cfg.Workers)
		for i, ob := range obs {
			g.Go(func() error {
				if err := c.cfg.Store.Delete(gctx, ob.key); err != nil {
					return fmt.Errorf("delete %s: %w", ob.key, err)
				}
				deleted[i] = true
				return nil
			})
		}
		return deleted, g.Wait()
	}
	g.SetLimit(batchWorkers)
	for start := 0; start < len(obs); start += blob.MaxBatchDelete {
		end := min(start+blob.MaxBatchDelete, len(obs))
		g.Go(func() error {
			keys := make([]string, 0, end-start)
			for _, ob := range obs[start:end] {
				keys = append(keys, ob.key)
			}
			failed, err := bd.DeleteMany(gctx, keys)
			notDeleted := make(map[string]bool, len(failed))
			for _, k := range failed {
				notDeleted[k] = true
			}
			for i := start; i < end; i++ {
				deleted[i] = !notDeleted[obs[i].key]
			}
			return err
		})
	}
	return deleted, g.Wait()
}

// missing returns the elements of all not in have.
func missing(all, have []string) []string {
	h := make(map[string]bool, len(have))
	for _, v := range have {
		h[v] = true
	}
	var out []string
	for _, v := range all {
		if !h[v] {
			out = append(out, v)
		}
	}
	return out
}

func dedup(s []string) []string {
	seen := make(map[string]bool, len(s))
	out := s[:0:0]
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}
