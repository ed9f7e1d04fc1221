// Package queuetest holds fixtures for tests of the build queue: derivations with valid store
// paths, random DAGs, projects, node rows, an in-process leader to run maintenance tasks under,
// and helpers that wait for a condition instead of sleeping.
//
// Every helper takes the test's own pool (one fresh database per test, see dbtest), so tests
// using it can run in parallel.
package queuetest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

// NixBase32 is the alphabet of store path hashes.
const NixBase32 = "0123456789abcdfghijklmnpqrsvwxyz"

// Hash is a valid 32-character store hash derived from key (deterministic).
func Hash(key string) string {
	sum := sha256.Sum256([]byte(key))
	b := make([]byte, 32)
	for i := range b {
		b[i] = NixBase32[sum[i]%32]
	}
	return string(b)
}

// DrvPath is the .drv store path of the fixture derivation called name.
func DrvPath(name string) string { return "/nix/store/" + Hash(name) + "-" + name + ".drv" }

// OutPath is the output path of the fixture derivation called name.
func OutPath(name string) string { return "/nix/store/" + Hash(name+"!out") + "-" + name }

// Drv is a fixture derivation called name building for system, with the named fixture
// derivations as inputs.
func Drv(name, system string, inputs ...string) queue.Derivation {
	sum := sha256.Sum256([]byte(name))
	d := queue.Derivation{
		DrvPath: DrvPath(name),
		Name:    name,
		System:  system,
		NarHash: "sha256:" + hex.EncodeToString(sum[:]),
		NarSize: 1000,
		Outputs: []queue.Output{{Name: "out", Path: OutPath(name)}},
	}
	for _, in := range inputs {
		d.Inputs = append(d.Inputs, queue.Input{DrvPath: DrvPath(in), Outputs: []string{"out"}})
	}
	return d
}

// WithFeatures sets d's required features.
func WithFeatures(d queue.Derivation, features ...string) queue.Derivation {
	d.RequiredFeatures = features
	return d
}

// RandomDAG builds n derivations called prefix-0 … prefix-(n-1) for system. Node i takes up to
// maxInputs distinct inputs, chosen only among nodes before it (so the graph is acyclic and the
// slice is in topological order), mostly among the window nodes just before it so the graph is
// deep as well as wide.
func RandomDAG(rng *rand.Rand, prefix string, n, maxInputs, window int, system string) []queue.Derivation {
	ds := make([]queue.Derivation, n)
	for i := range n {
		var inputs []string
		if i > 0 {
			k := rng.IntN(maxInputs + 1)
			seen := map[int]bool{}
			for range k {
				var j int
				if rng.IntN(4) == 0 || i <= window {
					j = rng.IntN(i)
				} else {
					j = i - 1 - rng.IntN(window)
				}
				if !seen[j] {
					seen[j] = true
					inputs = append(inputs, fmt.Sprintf("%s-%d", prefix, j))
				}
			}
		}
		ds[i] = Drv(fmt.Sprintf("%s-%d", prefix, i), system, inputs...)
	}
	return ds
}

// Enqueue enqueues ds for project (nil for none) and returns the number of new jobs.
func Enqueue(t testing.TB, pool *pgxpool.Pool, project *int64, ds ...queue.Derivation) int {
	t.Helper()
	res, err := queue.Enqueue(Ctx(t, 30*time.Second), pool, queue.EnqueueParams{ProjectID: project, Derivations: ds})
	if err != nil {
		t.Fatalf("enqueue %d derivations: %v", len(ds), err)
	}
	return res.NewJobs
}

// Ctx is a context for one test step, cancelled at the end of the test.
func Ctx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Logger discards everything.
func Logger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestLogger writes warnings and errors to the test's output.
func TestLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// NewProject adds a repository and its project with the given scheduling shares and returns the
// project id.
func NewProject(t testing.TB, pool *pgxpool.Pool, name string, shares int) int64 {
	t.Helper()
	repo := QueryInt(t, pool, `
INSERT INTO repositories (forge, owner, name, full_name, clone_url)
VALUES ('github', 'owner', $1, 'owner/' || $1, 'https://example.invalid/' || $1) RETURNING id`, name)
	return QueryInt(t, pool, `INSERT INTO projects (repo_id, name, scheduling_shares) VALUES ($1, $2, $3) RETURNING id`,
		repo, name, shares)
}

// Exec runs a statement.
func Exec(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	tag, err := pool.Exec(context.Background(), sql, args...)
	if err != nil {
		t.Fatalf("exec %q: %v", sql, err)
	}
	return tag.RowsAffected()
}

// QueryInt runs a query returning one integer.
func QueryInt(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("query %q: %v", sql, err)
	}
	return n
}

// JobRow is a build job as the database sees it.
type JobRow struct {
	ID            int64
	DrvPath       string
	Status        status.JobStatus
	Priority      int
	ProjectID     *int64
	ClaimedBy     *string
	Attempt       int
	RetryCount    int
	BlockedInputs int
}

func (j JobRow) String() string {
	by := "<nil>"
	if j.ClaimedBy != nil {
		by = *j.ClaimedBy
	}
	return fmt.Sprintf("job %d %s status=%s prio=%d claimed_by=%s attempt=%d retries=%d blocked=%d",
		j.ID, j.DrvPath, j.Status, j.Priority, by, j.Attempt, j.RetryCount, j.BlockedInputs)
}

// Job reads the job of the fixture derivation called name.
func Job(t testing.TB, pool *pgxpool.Pool, name string) JobRow {
	t.Helper()
	return JobOf(t, pool, DrvPath(name))
}

// Status is the status of the job of the fixture derivation called name.
func Status(t testing.TB, pool *pgxpool.Pool, name string) status.JobStatus {
	t.Helper()
	return Job(t, pool, name).Status
}

// Names maps claimed jobs to fixture names (the store path's name part), sorted.
func Names(jobs []queue.Job) []string {
	var names []string
	for _, j := range jobs {
		names = append(names, NameOf(j.DrvPath))
	}
	slices.Sort(names)
	return names
}

// NameOf is the name part of a fixture .drv path.
func NameOf(drvPath string) string {
	base := drvPath[len("/nix/store/")+33:]
	return base[:len(base)-len(".drv")]
}

// Node describes a nodes row for tests that need builders to exist.
type Node struct {
	ID       string
	Roles    []string // default {builder}
	Systems  []string
	Features []string
	Status   status.NodeStatus // default active
	Draining bool              //
	SeenAgo  time.Duration     // last_seen = now() - SeenAgo
}

// InsertNode adds a node row directly.
func InsertNode(t testing.TB, pool *pgxpool.Pool, n Node) {
	t.Helper()
	if n.Roles == nil {
		n.Roles = []string{"builder"}
	}
	if n.Systems == nil {
		n.Systems = []string{}
	}
	if n.Features == nil {
		n.Features = []string{}
	}
	if n.Status == "" {
		n.Status = status.NodeActive
	}
	Exec(t, pool, `
INSERT INTO nodes (id, roles, endpoint, systems, features, status, draining, incarnation, last_seen)
VALUES ($1, $2, 'http://' || $1 || ':7777', $3, $4, $5, $6, gen_random_uuid(), now() - make_interval(secs => $7))`,
		n.ID, n.Roles, n.Systems, n.Features, n.Status, n.Draining, n.SeenAgo.Seconds())
}

// KeepAlive beats for node id (last_seen = now()) every interval until the test ends, like a
// live node's heartbeat.
func KeepAlive(t testing.TB, pool *pgxpool.Pool, id string, interval time.Duration) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			_, _ = pool.Exec(ctx, `UPDATE nodes SET last_seen = now() WHERE id = $1`, id)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

// Backdate makes node id look silent for ago.
func Backdate(t testing.TB, pool *pgxpool.Pool, id string, ago time.Duration) {
	t.Helper()
	if Exec(t, pool, `UPDATE nodes SET last_seen = now() - make_interval(secs => $2) WHERE id = $1`, id, ago.Seconds()) != 1 {
		t.Fatalf("no node row %s to backdate", id)
	}
}

// WaitFor is waittest.For.
func WaitFor(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	waittest.For(t, timeout, cond, format, args...)
}

// Observe is waittest.Hold.
func Observe(t testing.TB, d time.Duration, check func()) {
	t.Helper()
	waittest.Hold(t, d, check)
}

// SteadyElector elects within about 100ms but keeps a 6s lease, so a loaded test machine does
// not make the leader step down.
func SteadyElector() cluster.ElectorConfig {
	return cluster.ElectorConfig{
		Role:            cluster.RoleMaintenance,
		CheckInterval:   100 * time.Millisecond,
		LeaseDuration:   6 * time.Second,
		RefreshInterval: 2 * time.Second,
	}
}

// Leader is an in-process elector campaigning for the maintenance role with its own lock
// session, as a node runs it.
type Leader struct {
	*cluster.Elector
	ID    cluster.Identity
	Terms chan *cluster.Term // every term the leader work was given, in order
	lock  *cluster.LockConn

	mu  sync.Mutex
	all []*cluster.Term
}

// AllTerms is every term this leader was given so far.
func (l *Leader) AllTerms() []*cluster.Term {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.all)
}

// StartLeader starts an elector for node id; while it leads, lead (if not nil) runs as the
// leader work, otherwise the work just waits for the term to end. It is stopped at the end of
// the test.
func StartLeader(t testing.TB, pool *pgxpool.Pool, nodeID string, cfg cluster.ElectorConfig, lead func(ctx context.Context, term *cluster.Term)) *Leader {
	t.Helper()
	l := &Leader{
		ID:    cluster.Identity{NodeID: nodeID, Incarnation: uuid.New()},
		Terms: make(chan *cluster.Term, 64),
		lock:  cluster.NewLockConn(pool, Logger()),
	}
	cfg.LeaderFunc = func(ctx context.Context, term *cluster.Term) {
		l.mu.Lock()
		l.all = append(l.all, term)
		l.mu.Unlock()
		select {
		case l.Terms <- term:
		default:
		}
		if lead != nil {
			lead(ctx, term)
			return
		}
		<-ctx.Done()
	}
	e, err := cluster.NewElector(cfg, pool, l.lock, l.ID, cluster.NewMetrics(prometheus.NewRegistry()), Logger(), clock.Real{})
	if err != nil {
		t.Fatalf("NewElector: %v", err)
	}
	l.Elector = e
	t.Cleanup(l.lock.Close)
	t.Cleanup(e.Stop)
	if err := e.Start(context.Background()); err != nil {
		t.Fatalf("start elector %s: %v", nodeID, err)
	}
	return l
}

// StartMaintainer starts an elector for node id whose leader work is a cluster.Maintainer
// running tasks, as a node runs its leader-only maintenance.
func StartMaintainer(t testing.TB, pool *pgxpool.Pool, nodeID string, cfg cluster.ElectorConfig, tasks []cluster.Task) *Leader {
	t.Helper()
	m := cluster.NewMaintainer(pool, tasks, Logger(), clock.Real{})
	return StartLeader(t, pool, nodeID, cfg, m.Lead)
}

// NextTerm waits for the next term the leader work is given.
func (l *Leader) NextTerm(t testing.TB, timeout time.Duration) *cluster.Term {
	t.Helper()
	select {
	case term := <-l.Terms:
		return term
	case <-time.After(timeout):
		t.Fatalf("%s: not elected within %s", l.ID.NodeID, timeout)
		return nil
	}
}

// Task finds a task by name.
func Task(t testing.TB, tasks []cluster.Task, name string) cluster.Task {
	t.Helper()
	for _, task := range tasks {
		if task.Name == name {
			return task
		}
	}
	t.Fatalf("no task %q", name)
	return cluster.Task{}
}

// RunTask runs task once inside term's fence and returns the rows it reports changed.
func RunTask(t testing.TB, pool *pgxpool.Pool, term *cluster.Term, task cluster.Task) int64 {
	t.Helper()
	ctx := Ctx(t, 30*time.Second)
	var affected int64
	err := term.RunFenced(ctx, pool, func(tx pgx.Tx) error {
		var err error
		affected, err = task.Run(ctx, tx)
		return err
	})
	if err != nil {
		t.Fatalf("run task %s: %v", task.Name, err)
	}
	return affected
}

// IsStale reports whether err says a claim no longer held.
func IsStale(err error) bool { return errors.Is(err, queue.ErrStale) }
