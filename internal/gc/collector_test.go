package gc_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/blobtest"
	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/gc"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/publication"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

// grace is short so that a test can make objects "old" by waiting for it, and long enough
// that an object made just before a collection (and its dry run) is young even on a loaded
// machine.
const grace = 5 * time.Second

var backends = []struct {
	name string
	open func(t *testing.T) blob.Store
}{
	{"local", func(t *testing.T) blob.Store {
		s, err := blob.NewLocal(t.TempDir(), "http://127.0.0.1:1", bytes.Repeat([]byte("k"), 32))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}},
	{"s3", func(t *testing.T) blob.Store {
		s, err := blob.NewS3(blobtest.StartMinIO(t))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}},
}

// world is a database and a cache holding synthetic evaluations, derivations and objects.
type world struct {
	t         *testing.T
	ctx       context.Context
	pool      *pgxpool.Pool
	store     blob.Store
	projectID int64
	nars      map[string]string // store path -> NAR key
}

func newWorld(t *testing.T, store blob.Store) *world {
	w := &world{t: t, ctx: context.Background(), pool: dbtest.NewPool(t), store: store, nars: map[string]string{}}
	var repo int64
	w.must(w.pool.QueryRow(w.ctx, `INSERT INTO repositories (forge, owner, name, full_name, clone_url, default_branch)
		VALUES ('local', 'o', 'r', 'o/r', '/srv/r', 'main') RETURNING id`).Scan(&repo))
	w.must(w.pool.QueryRow(w.ctx, `INSERT INTO projects (repo_id, name) VALUES ($1, 'p') RETURNING id`, repo).Scan(&w.projectID))
	w.put("nix-cache-info", []byte("StoreDir: /nix/store\n"))
	return w
}

func (w *world) must(err error) {
	w.t.Helper()
	if err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) collector() *gc.Collector {
	c, err := gc.New(gc.Config{Store: w.store, Retention: 90 * 24 * time.Hour, LogRetention: 30 * 24 * time.Hour,
		Grace: grace, Workers: 8, Logger: slog.New(slog.DiscardHandler)}, w.pool)
	w.must(err)
	return c
}

func (w *world) run(c *gc.Collector) *gc.Report {
	w.t.Helper()
	rep, err := c.Run(w.ctx, gc.RunOptions{NodeID: "test", Fence: func(ctx context.Context, fn func(pgx.Tx) error) error {
		return pgx.BeginFunc(ctx, w.pool, fn)
	}})
	w.must(err)
	return rep
}

const nix32 = "0123456789abcdfghijklmnpqrsvwxyz"

func storePath(name string) string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = nix32[int(b[i])%32]
	}
	return nix.StoreDir + "/" + string(b) + "-" + name
}

func hashOf(p string) string { return strings.TrimPrefix(p, nix.StoreDir+"/")[:32] }

func (w *world) put(key string, body []byte) {
	w.t.Helper()
	w.must(w.store.Put(w.ctx, key, bytes.NewReader(body), int64(len(body)), blob.PutOptions{}))
}

// newNAR puts a NAR with random content and returns its key.
func (w *world) newNAR() string {
	body := make([]byte, 64)
	_, _ = rand.Read(body)
	key := nix.NarURL(nix.FormatSHA256(sha256.Sum256(body)))
	w.put(key, body)
	return key
}

// publish puts p's narinfo (pointing at narKey, or at a new NAR) with references refs.
func (w *world) publish(p, narKey string, refs ...string) {
	w.t.Helper()
	if narKey == "" {
		narKey = w.newNAR()
	}
	fileHash := "sha256:" + strings.TrimSuffix(strings.TrimPrefix(narKey, "nar/"), ".nar.zst")
	var bases []string
	for _, r := range refs {
		bases = append(bases, strings.TrimPrefix(r, nix.StoreDir+"/"))
	}
	ni := &nix.NarInfo{StorePath: p, URL: narKey, Compression: "zstd", FileHash: fileHash, FileSize: 64,
		NarHash: fileHash, NarSize: 64, References: bases}
	text, err := ni.MarshalText()
	w.must(err)
	w.put(hashOf(p)+".narinfo", text)
	w.nars[p] = narKey
}

// publishDrv stores .drv p's objects in the database, as the signer publishes .drv files: a
// narinfo referring to refs and the NAR of a made-up text.
func (w *world) publishDrv(p string, refs ...string) {
	w.t.Helper()
	text := []byte("Derive(" + p + ")")
	nar := nix.FileNAR(text, false)
	sum := sha256.Sum256(nar)
	var bases []string
	for _, r := range refs {
		bases = append(bases, strings.TrimPrefix(r, nix.StoreDir+"/"))
	}
	ni := &nix.NarInfo{StorePath: p, URL: blob.DrvNARKey(sum), Compression: "none", FileHash: nix.FormatSHA256(sum),
		FileSize: int64(len(nar)), NarHash: nix.FormatSHA256(sum), NarSize: int64(len(nar)), References: bases}
	info, err := ni.MarshalText()
	w.must(err)
	_, err = blob.NewDerivations(w.pool).Put(w.ctx, []blob.Derivation{{StorePath: p, NarInfo: info, Text: text, NarHash: sum, NarSize: int64(len(nar))}})
	w.must(err)
	w.nars[p] = ni.URL
}

// derivation records a derivation named name with one output, its inputs and sources, and a
// succeeded job that finished age ago with a log; it returns the .drv and output paths.
func (w *world) derivation(name string, age time.Duration, inputs []string, srcs ...string) (drv, out string) {
	w.t.Helper()
	drv, out = storePath(name+".drv"), storePath(name)
	d := queue.Derivation{DrvPath: drv, Name: name, System: "x86_64-linux", NarHash: "sha256:" + strings.Repeat("0", 52),
		NarSize: 1, Outputs: []queue.Output{{Name: "out", Path: out}}, InputSrcs: srcs}
	if srcs == nil {
		d.InputSrcs = []string{}
	}
	for _, in := range inputs {
		d.Inputs = append(d.Inputs, queue.Input{DrvPath: in, Outputs: []string{"out"}})
	}
	_, err := queue.Enqueue(w.ctx, w.pool, queue.EnqueueParams{ProjectID: &w.projectID, Derivations: []queue.Derivation{d}})
	w.must(err)
	_, err = w.pool.Exec(w.ctx, `UPDATE build_jobs SET status = 'succeeded', finished_at = now() - $2 * interval '1 second',
		log_url = 'log/' || substring(drv_path FROM 12) WHERE drv_path = $1`, drv, age.Seconds())
	w.must(err)
	w.put("log/"+strings.TrimPrefix(drv, nix.StoreDir+"/"), []byte("build log of "+name))
	return drv, out
}

// evaluation records a succeeded evaluation of branch main created age ago with attrs.
func (w *world) evaluation(commit string, age time.Duration, drvs ...string) int64 {
	w.t.Helper()
	var id int64
	w.must(w.pool.QueryRow(w.ctx, `INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status, created_at)
		VALUES ($1, 'file:///srv/r', $2, 'main', 'succeeded', now() - $3 * interval '1 second') RETURNING id`,
		w.projectID, commit, age.Seconds()).Scan(&id))
	for i, d := range drvs {
		_, err := w.pool.Exec(w.ctx, `INSERT INTO eval_attrs (eval_id, attr, drv_path) VALUES ($1, $2, $3)`, id, fmt.Sprintf("a%d", i), d)
		w.must(err)
	}
	return id
}

// keys lists the cache: the blob store's objects and the .drv objects in the database.
func (w *world) keys() []string {
	w.t.Helper()
	var keys []string
	w.must(w.store.List(w.ctx, "", func(i blob.Info) error { keys = append(keys, i.Key); return nil }))
	w.must(blob.NewDerivations(w.pool).List(w.ctx, func(d blob.DrvInfo) error {
		keys = append(keys, d.NarInfoKey(), d.NarKey)
		return nil
	}))
	slices.Sort(keys)
	return keys
}

func (w *world) has(key string) bool {
	w.t.Helper()
	_, err := w.store.Head(w.ctx, key)
	if errors.Is(err, blob.ErrNotFound) {
		drvs := blob.NewDerivations(w.pool)
		if h, ok := strings.CutSuffix(key, ".narinfo"); ok {
			_, _, err = drvs.NarInfo(w.ctx, h)
		} else if blob.IsPlainNAR(key) {
			_, _, err = drvs.NAR(w.ctx, key)
		}
	}
	if errors.Is(err, blob.ErrNotFound) {
		return false
	}
	w.must(err)
	return true
}

// objects are a path's narinfo and NAR.
func (w *world) objects(p string) []string { return []string{hashOf(p) + ".narinfo", w.nars[p]} }

func logKey(drv string) string { return "log/" + strings.TrimPrefix(drv, nix.StoreDir+"/") }

// waitOld waits until everything written so far is older than the grace period by the
// database's clock.
func (w *world) waitOld() {
	w.t.Helper()
	var start time.Time
	w.must(w.pool.QueryRow(w.ctx, `SELECT now()`).Scan(&start))
	waittest.For(w.t, 10*time.Second, func() bool {
		var now time.Time
		w.must(w.pool.QueryRow(w.ctx, `SELECT clock_timestamp()`).Scan(&now))
		return now.Sub(start) > grace+time.Second
	}, "the grace period to pass")
}

func day(n int) time.Duration { return time.Duration(n) * 24 * time.Hour }

// scenario is two evaluations of one project: the older past retention.
type scenario struct {
	oldEval, newEval int64
	oldDrv, oldOut   string // the old evaluation's own derivation and output
	sharedDrv        string
	kept, gone       []string // object keys
	young            []string
}

func (w *world) twoEvaluations() scenario {
	var s scenario
	// Shared by both evaluations, with a source.
	src := storePath("builder.sh")
	w.publish(src, "")
	sharedDrv, sharedOut := w.derivation("shared", day(100), nil, src)
	w.publishDrv(sharedDrv, src)
	w.publish(sharedOut, "")
	// Only the old evaluation's.
	oldDrv, oldOut := w.derivation("old-only", day(100), []string{sharedDrv})
	w.publishDrv(oldDrv, sharedDrv)
	w.publish(oldOut, "", sharedOut)
	w.put(hashOf(oldOut)+".ls", []byte(`{"version":1}`))
	// The new evaluation's output refers at run time to paths the database does not know (say,
	// substituted from the cache when it was built): they stay with it, transitively.
	deep := storePath("deep-runtime-dep")
	w.publish(deep, "")
	runtime := storePath("runtime-dep")
	w.publish(runtime, "", deep)
	newDrv, newOut := w.derivation("new-only", day(1), []string{sharedDrv})
	w.publishDrv(newDrv, sharedDrv)
	w.publish(newOut, "", sharedOut, runtime)
	w.put(hashOf(newOut)+".ls", []byte(`{"version":1}`))
	// A build of the new evaluation whose log is past log retention: the build stays, the log goes.
	expDrv, expOut := w.derivation("log-expired", day(40), nil)
	w.publishDrv(expDrv)
	w.publish(expOut, "")

	// The new evaluation's build took two attempts, each with its own log: the first ended past
	// log retention, the second within it. An attempt's log that no attempt names is garbage.
	w.attempt(newDrv, 1, day(40))
	w.attempt(newDrv, 2, day(1))
	w.put(logKey(newDrv)+".3", []byte("a log of no attempt"))
	// A build running its second attempt may upload that attempt's log before the attempt ends.
	runDrv, _ := w.derivation("running", day(1), nil)
	w.attempt(runDrv, 1, day(40))
	_, err := w.pool.Exec(w.ctx, `UPDATE build_jobs SET status = 'building', claimed_by = 'b', attempt = 2, finished_at = NULL
		WHERE drv_path = $1`, runDrv)
	w.must(err)
	w.put(logKey(runDrv)+".2", []byte("the running attempt's log"))

	s.oldDrv, s.oldOut, s.sharedDrv = oldDrv, oldOut, sharedDrv
	s.oldEval = w.evaluation("old", day(100), oldDrv, sharedDrv)
	s.newEval = w.evaluation("new", day(1), newDrv, sharedDrv, expDrv)

	// Garbage: an unreferenced narinfo and NAR, a realisation and a log of nothing.
	junk := storePath("junk")
	w.publish(junk, "")
	w.put("realisations/"+hashOf(oldDrv)+"!out.doi", []byte("{}"))

	for _, p := range []string{src, sharedDrv, sharedOut, deep, runtime, newDrv, newOut, expDrv, expOut} {
		s.kept = append(s.kept, w.objects(p)...)
	}
	s.kept = append(s.kept, hashOf(newOut)+".ls", logKey(newDrv), logKey(newDrv)+".2", logKey(runDrv), logKey(runDrv)+".2",
		"nix-cache-info")
	for _, p := range []string{oldDrv, oldOut, junk} {
		s.gone = append(s.gone, w.objects(p)...)
	}
	// The shared build is kept, but it was built 100 days ago: its log is past log retention.
	s.gone = append(s.gone, hashOf(oldOut)+".ls", logKey(oldDrv), logKey(expDrv), logKey(sharedDrv),
		"realisations/"+hashOf(oldDrv)+"!out.doi", logKey(newDrv)+".1", logKey(newDrv)+".3", logKey(runDrv)+".1")
	return s
}

// attempt records attempt n of drv's job, failed age ago with its own log.
func (w *world) attempt(drv string, n int, age time.Duration) {
	w.t.Helper()
	key := logKey(drv) + "." + strconv.Itoa(n)
	_, err := w.pool.Exec(w.ctx, `INSERT INTO build_attempts (job_id, attempt, node, started_at, finished_at, status, log_key)
		SELECT id, $2, 'b', now() - $3 * interval '1 second', now() - $3 * interval '1 second', 'failed', $4
		FROM build_jobs WHERE drv_path = $1`, drv, n, age.Seconds(), key)
	w.must(err)
	w.put(key, []byte(fmt.Sprintf("attempt %d of %s", n, drv)))
}

// addYoung writes unreferenced objects after the others are old: the grace period keeps them.
func (w *world) addYoung(s *scenario) {
	young := storePath("young-junk")
	w.publish(young, "")
	s.young = w.objects(young)
}

func (w *world) check(s scenario) {
	w.t.Helper()
	for _, k := range append(slices.Clone(s.kept), s.young...) {
		if !w.has(k) {
			w.t.Errorf("%s was deleted; it must stay", k)
		}
	}
	for _, k := range s.gone {
		if w.has(k) {
			w.t.Errorf("%s is still there; it should be gone", k)
		}
	}
}

func TestCollectKeepsTheLiveAndDeletesTheRest(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			w := newWorld(t, b.open(t))
			s := w.twoEvaluations()
			w.waitOld()
			w.addYoung(&s)
			before := w.keys()
			c := w.collector()

			// A dry run reports exactly what the collection deletes, and deletes nothing.
			dry, err := c.DryRun(w.ctx)
			w.must(err)
			if after := w.keys(); !slices.Equal(before, after) {
				t.Fatalf("the dry run changed the cache:\nbefore %v\nafter  %v", before, after)
			}
			var wouldDelete []string
			for _, k := range dry.Keys {
				wouldDelete = append(wouldDelete, k.Key)
			}
			want := slices.Clone(s.gone)
			sort.Strings(want)
			sort.Strings(wouldDelete)
			if !slices.Equal(wouldDelete, want) {
				t.Errorf("the dry run would delete\n%v\nwant\n%v", wouldDelete, want)
			}
			var evals int
			w.must(w.pool.QueryRow(w.ctx, `SELECT count(*) FROM evaluations`).Scan(&evals))
			if evals != 2 || dry.Evaluations != 1 {
				t.Errorf("dry run: %d evaluations left (want 2), reported %d to delete (want 1)", evals, dry.Evaluations)
			}

			rep := w.run(c)
			w.check(s)
			if got := rep.Objects().Objects; got != int64(len(s.gone)) {
				t.Errorf("reported %d objects deleted, want %d", got, len(s.gone))
			}
			// Logs: two jobs' and two attempts'.
			if rep.Evaluations != 1 || rep.Jobs != 1 || rep.Derivations != 1 || rep.LogsExpired != 4 {
				t.Errorf("database step: %+v; want 1 evaluation, 1 job, 1 derivation, 4 logs", rep)
			}
			var left []int64
			rows, err := w.pool.Query(w.ctx, `SELECT id FROM evaluations ORDER BY id`)
			w.must(err)
			left, err = pgx.CollectRows(rows, pgx.RowTo[int64])
			w.must(err)
			if !slices.Equal(left, []int64{s.newEval}) {
				t.Errorf("evaluations left: %v, want [%d]", left, s.newEval)
			}
			var st status.GCRunStatus
			w.must(w.pool.QueryRow(w.ctx, `SELECT status FROM gc_runs ORDER BY id DESC LIMIT 1`).Scan(&st))
			if st != status.GCSucceeded {
				t.Errorf("gc_runs records %q", st)
			}

			// A second collection finds nothing more.
			if again := w.run(c); again.Objects().Objects != 0 || again.Rows() != 0 {
				t.Errorf("a second collection deleted %+v", again)
			}
		})
	}
}

// TestCollectRacingAnEvaluation republishes the old evaluation's paths between the mark and the
// sweep, as an evaluation of the same commit would: nothing it relies on is deleted.
func TestCollectRacingAnEvaluation(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			w := newWorld(t, b.open(t))
			s := w.twoEvaluations()
			// A job the mark saw without a narinfo; its builder then finds its NAR already in
			// the cache (unreferenced, old) and publishes a narinfo pointing at it.
			pendingDrv, pendingOut := storePath("pending.drv"), storePath("pending")
			_, err := queue.Enqueue(w.ctx, w.pool, queue.EnqueueParams{ProjectID: &w.projectID, Derivations: []queue.Derivation{{
				DrvPath: pendingDrv, Name: "pending", System: "x86_64-linux", NarHash: "sha256:" + strings.Repeat("0", 52), NarSize: 1,
				Outputs: []queue.Output{{Name: "out", Path: pendingOut}}, InputSrcs: []string{}}}})
			w.must(err)
			w.evaluation("pending", time.Hour, pendingDrv)
			orphanNAR := w.newNAR()
			w.waitOld()

			c := w.collector()
			raced := false
			c.SetAfterMark(func(ctx context.Context) {
				raced = true
				// An evaluation of the old commit takes the publication lock, finds the old
				// paths in the cache, and commits the rows that need them (the database step
				// deleted the old ones).
				release, err := publication.Hold(ctx, w.pool)
				w.must(err)
				defer release()
				var n int
				w.must(w.pool.QueryRow(ctx, `SELECT count(*) FROM derivations WHERE drv_path = $1`, s.oldDrv).Scan(&n))
				if n != 0 {
					t.Fatalf("the database step kept %s", s.oldDrv)
				}
				_, err = queue.Enqueue(ctx, w.pool, queue.EnqueueParams{ProjectID: &w.projectID, Derivations: []queue.Derivation{{
					DrvPath: s.oldDrv, Name: "old-only", System: "x86_64-linux", NarHash: "sha256:" + strings.Repeat("0", 52), NarSize: 1,
					Outputs: []queue.Output{{Name: "out", Path: s.oldOut}}, InputSrcs: []string{},
					Inputs: []queue.Input{{DrvPath: s.sharedDrv, Outputs: []string{"out"}}}}}})
				w.must(err)
				w.evaluation("old-again", 0, s.oldDrv, s.sharedDrv)
				// The pending job's builder publishes its output onto the orphaned NAR, and the
				// signer records its hash.
				w.publish(pendingOut, orphanNAR)
				_, err = w.pool.Exec(ctx, `UPDATE derivation_outputs SET nar_hash = 'sha256:x', nar_size = 1 WHERE output_path = $1`, pendingOut)
				w.must(err)
			})
			w.run(c)
			if !raced {
				t.Fatal("the hook did not run")
			}
			relied := append(slices.Clone(s.kept), w.objects(pendingOut)...)
			relied = append(relied, w.objects(s.oldDrv)...)
			relied = append(relied, w.objects(s.oldOut)...)
			relied = append(relied, logKey(s.oldDrv))
			for _, k := range relied {
				if !w.has(k) {
					t.Errorf("%s was deleted while an evaluation or a build relied on it", k)
				}
			}
		})
	}
}

// TestCollectWaitsForAPublisher: an evaluation holding the publication lock (between its cache
// lookups and its commit) makes the collection wait; what it commits before releasing is kept.
func TestCollectWaitsForAPublisher(t *testing.T) {
	w := newWorld(t, backends[0].open(t))
	s := w.twoEvaluations()
	w.waitOld()
	release, err := publication.Hold(w.ctx, w.pool)
	w.must(err)
	done := make(chan error, 1)
	go func() {
		_, err := w.collector().Run(w.ctx, gc.RunOptions{NodeID: "test", Fence: func(ctx context.Context, fn func(pgx.Tx) error) error {
			return pgx.BeginFunc(ctx, w.pool, fn)
		}})
		done <- err
	}()
	waittest.For(t, 10*time.Second, func() bool {
		var waiting bool
		w.must(w.pool.QueryRow(w.ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
			WHERE locktype = 'advisory' AND objid::bigint = $1 AND NOT granted)`, int64(db.LockPublication)).Scan(&waiting))
		return waiting
	}, "the collection to wait for the publication lock")
	select {
	case err := <-done:
		t.Fatalf("the collection finished while a publisher held the lock: %v", err)
	default:
	}
	// The publisher commits an evaluation that needs the old evaluation's derivation again.
	w.evaluation("old-again", 0, s.oldDrv)
	release()
	w.must(<-done)
	for _, k := range append(w.objects(s.oldDrv), w.objects(s.oldOut)...) {
		if !w.has(k) {
			t.Errorf("%s was deleted although the publisher committed a need for it", k)
		}
	}
}

// TestCollectClosesInterruptedRuns: a run a lost term left "running" is recorded as failed by
// the next one, so operators do not see a collection running forever.
func TestCollectClosesInterruptedRuns(t *testing.T) {
	w := newWorld(t, backends[0].open(t))
	var stale int64
	w.must(w.pool.QueryRow(w.ctx, `INSERT INTO gc_runs (node_id, epoch) VALUES ('gone', 1) RETURNING id`).Scan(&stale))
	w.run(w.collector())
	var st status.GCRunStatus
	var msg string
	w.must(w.pool.QueryRow(w.ctx, `SELECT status, COALESCE(error, '') FROM gc_runs WHERE id = $1`, stale).Scan(&st, &msg))
	if st != status.GCFailed || !strings.Contains(msg, "interrupted") {
		t.Errorf("the interrupted run is %q (%q); want failed, interrupted", st, msg)
	}
}

// A project's own retention counts for at most the node's retention.max: an evaluation whose
// tree asked to be kept for ever goes once it is older than the ceiling, one within it stays.
func TestRetentionCeiling(t *testing.T) {
	w := newWorld(t, backends[0].open(t))
	day := 24 * time.Hour
	forever := w.evaluation("c1", 400*day)
	within := w.evaluation("c2", 200*day)
	byDefault := w.evaluation("c4", 100*day) // no retention of its own: the default, 90 days
	w.evaluation("c3", 0)                    // the newest of the default branch, always kept
	for id, keep := range map[int64]time.Duration{forever: 100_000 * day, within: 300 * day} {
		_, err := w.pool.Exec(w.ctx, `UPDATE evaluations SET retention_seconds = $2 WHERE id = $1`, id, int64(keep.Seconds()))
		w.must(err)
	}
	for _, tc := range []struct {
		max  time.Duration
		left []int64
	}{
		{0, []int64{forever, within}}, // no ceiling: both asked for longer than their age
		{365 * day, []int64{within}},
	} {
		c, err := gc.New(gc.Config{Store: w.store, Retention: 90 * day, MaxRetention: tc.max, LogRetention: 30 * day,
			Grace: grace, Logger: slog.New(slog.DiscardHandler)}, w.pool)
		w.must(err)
		w.run(c)
		rows, err := w.pool.Query(w.ctx, `SELECT id FROM evaluations WHERE id = ANY($1) ORDER BY id`, []int64{forever, within, byDefault})
		w.must(err)
		left, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		w.must(err)
		if !slices.Equal(left, tc.left) {
			t.Errorf("retention.max %v: evaluations %v left, want %v", tc.max, left, tc.left)
		}
	}
}
