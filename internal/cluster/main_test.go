package cluster_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// testSystem is the system every fixture derivation and job builds for.
const testSystem = "x86_64-linux"

// hashPart is a valid 32-character store hash for fixture derivations.
const hashPart = "0123456789abcdfghijklmnpqrsvwxyz"

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

var (
	waitFor           = waittest.For
	observeLeadership = waittest.Hold
)

// ctxTimeout is a context for one test step.
func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// fastElectorConfig keeps the suite quick: 50ms checks, a 900ms lease renewed every 300ms.
func fastElectorConfig() cluster.ElectorConfig {
	return cluster.ElectorConfig{
		Role:            cluster.RoleMaintenance,
		CheckInterval:   50 * time.Millisecond,
		LeaseDuration:   900 * time.Millisecond,
		RefreshInterval: 300 * time.Millisecond,
	}
}

// testNode is one elector with its own lock session, identity and metrics.
type testNode struct {
	*cluster.Elector
	id      cluster.Identity
	reg     *prometheus.Registry
	metrics *cluster.Metrics
	lock    *cluster.LockConn
	leads   atomic.Int32       // LeaderFunc invocations
	terms   chan *cluster.Term // every term LeaderFunc was given, in order
}

// newTestNode builds an elector (not started). onLead, if set, runs as the leader work; by
// default the leader work just waits for the term to end.
func newTestNode(t testing.TB, pool *pgxpool.Pool, nodeID string, cfg cluster.ElectorConfig, onLead func(ctx context.Context, term *cluster.Term)) *testNode {
	t.Helper()
	return newTestNodeWithClock(t, pool, nodeID, cfg, onLead, clock.Real{})
}

func newTestNodeWithClock(t testing.TB, pool *pgxpool.Pool, nodeID string, cfg cluster.ElectorConfig, onLead func(ctx context.Context, term *cluster.Term), clk clock.Clock) *testNode {
	t.Helper()
	n := &testNode{
		id:    cluster.Identity{NodeID: nodeID, Incarnation: uuid.New()},
		reg:   prometheus.NewRegistry(),
		lock:  cluster.NewLockConn(pool, discardLogger()),
		terms: make(chan *cluster.Term, 16),
	}
	n.metrics = cluster.NewMetrics(n.reg)
	cfg.LeaderFunc = func(ctx context.Context, term *cluster.Term) {
		n.leads.Add(1)
		select {
		case n.terms <- term:
		default:
		}
		if onLead != nil {
			onLead(ctx, term)
			return
		}
		<-ctx.Done()
	}
	e, err := cluster.NewElector(cfg, pool, n.lock, n.id, n.metrics, discardLogger(), clk)
	if err != nil {
		t.Fatalf("NewElector: %v", err)
	}
	n.Elector = e
	// Cleanups run last-in first-out: stop the elector (it resigns), then end the lock session.
	t.Cleanup(n.lock.Close)
	t.Cleanup(e.Stop)
	return n
}

// startTestNode builds and starts an elector.
func startTestNode(t testing.TB, pool *pgxpool.Pool, nodeID string, cfg cluster.ElectorConfig, onLead func(ctx context.Context, term *cluster.Term)) *testNode {
	t.Helper()
	n := newTestNode(t, pool, nodeID, cfg, onLead)
	if err := n.Start(context.Background()); err != nil {
		t.Fatalf("start elector: %v", err)
	}
	return n
}

// firstTerm waits for the first term LeaderFunc received.
func (n *testNode) firstTerm(t testing.TB, timeout time.Duration) *cluster.Term {
	t.Helper()
	select {
	case term := <-n.terms:
		return term
	case <-time.After(timeout):
		t.Fatalf("%s: no term within %s", n.id.NodeID, timeout)
		return nil
	}
}

// metric reads a gauge or counter series from n's registry (0 if the series does not exist).
func (n *testNode) metric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	return metricValue(t, n.reg, name, labels...)
}

func metricValue(t testing.TB, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	if len(labels)%2 != 0 {
		t.Fatalf("metricValue: labels must be name/value pairs")
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			switch {
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func isLeaderMetric(t testing.TB, n *testNode) float64 {
	return n.metric(t, "harmonia_ci_leader_is_leader", "role", cluster.RoleMaintenance)
}

// leaderRow is the leaders row of a role as the database sees it.
type leaderRow struct {
	NodeID      string
	Incarnation uuid.UUID
	Epoch       int64
	Valid       bool // lease_until > now()
	Resigned    bool // lease_until = renewed_at
}

func readLeader(t testing.TB, pool *pgxpool.Pool, role string) (leaderRow, bool) {
	t.Helper()
	var r leaderRow
	err := pool.QueryRow(context.Background(), `
SELECT node_id, incarnation, epoch, lease_until > now(), lease_until = renewed_at
FROM leaders WHERE role = $1`, role).Scan(&r.NodeID, &r.Incarnation, &r.Epoch, &r.Valid, &r.Resigned)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false
	}
	if err != nil {
		t.Fatalf("read leaders row %s: %v", role, err)
	}
	return r, true
}

func mustExec(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("exec %q: %v", sql, err)
	}
}

func queryInt(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("query %q: %v", sql, err)
	}
	return n
}

func queryBool(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) bool {
	t.Helper()
	var b bool
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&b); err != nil {
		t.Fatalf("query %q: %v", sql, err)
	}
	return b
}

// insertDerivation adds a derivation row and returns its path.
func insertDerivation(t testing.TB, pool *pgxpool.Pool, name string) string {
	t.Helper()
	drv := "/nix/store/" + hashPart + "-" + name + ".drv"
	mustExec(t, pool, `
INSERT INTO derivations (drv_path, hash_part, name, system, nar_hash, nar_size)
VALUES ($1, $2, $3, $4, 'sha256:0000', 0)`, drv, hashPart, name, testSystem)
	return drv
}

// insertJob adds a build job for drv; claimedBy "" means unclaimed.
func insertJob(t testing.TB, pool *pgxpool.Pool, drv string, st status.JobStatus, claimedBy string, retries int) int64 {
	t.Helper()
	var claimed *string
	if claimedBy != "" {
		claimed = &claimedBy
	}
	return queryInt(t, pool, `
INSERT INTO build_jobs (drv_path, system, status, claimed_by, claimed_at, started_at, attempt, retry_count)
VALUES ($1, $2, $3, $4::text,
        CASE WHEN $4::text IS NULL THEN NULL ELSE now() END,
        CASE WHEN $4::text IS NULL THEN NULL ELSE now() END,
        $5, $5)
RETURNING id`, drv, testSystem, st, claimed, retries)
}

// insertDependency records that referrer has input as an input derivation.
func insertDependency(t testing.TB, pool *pgxpool.Pool, referrer, input string) {
	t.Helper()
	mustExec(t, pool, `INSERT INTO derivation_inputs (referrer, input_drv, outputs) VALUES ($1, $2, '{out}')`, referrer, input)
}

type jobRow struct {
	Status    status.JobStatus
	ClaimedBy *string
	Retries   int
}

func readJob(t testing.TB, pool *pgxpool.Pool, id int64) jobRow {
	t.Helper()
	var j jobRow
	if err := pool.QueryRow(context.Background(), `SELECT status, claimed_by, retry_count FROM build_jobs WHERE id = $1`, id).
		Scan(&j.Status, &j.ClaimedBy, &j.Retries); err != nil {
		t.Fatalf("read job %d: %v", id, err)
	}
	return j
}

// insertProject adds a repository and its project and returns the project id.
func insertProject(t testing.TB, pool *pgxpool.Pool, name string) int64 {
	t.Helper()
	repo := queryInt(t, pool, `
INSERT INTO repositories (forge, owner, name, full_name, clone_url)
VALUES ('github', 'owner', $1, 'owner/' || $1, 'https://example.invalid/' || $1) RETURNING id`, name)
	return queryInt(t, pool, `INSERT INTO projects (repo_id, name) VALUES ($1, $2) RETURNING id`, repo, name)
}

// insertEvaluation adds an evaluation; claimedBy "" means unclaimed.
func insertEvaluation(t testing.TB, pool *pgxpool.Pool, project int64, commit string, st status.EvalStatus, claimedBy string) int64 {
	t.Helper()
	var claimed *string
	if claimedBy != "" {
		claimed = &claimedBy
	}
	return queryInt(t, pool, `
INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status, claimed_by, claimed_at, started_at)
VALUES ($1, 'github:owner/repo', $2, 'main', $3, $4::text,
        CASE WHEN $4::text IS NULL THEN NULL ELSE now() END,
        CASE WHEN $4::text IS NULL THEN NULL ELSE now() END)
RETURNING id`, project, commit, st, claimed)
}

// insertNode adds a node row directly, last seen `ago` before the database's now().
func insertNode(t testing.TB, pool *pgxpool.Pool, id string, st status.NodeStatus, ago time.Duration) {
	t.Helper()
	mustExec(t, pool, `
INSERT INTO nodes (id, roles, endpoint, incarnation, status, last_seen)
VALUES ($1, '{builder}', 'http://' || $1 || ':8080', gen_random_uuid(), $2, now() - make_interval(secs => $3))`,
		id, st, ago.Seconds())
}

func nodeStatus(t testing.TB, pool *pgxpool.Pool, id string) (status.NodeStatus, bool) {
	t.Helper()
	var s status.NodeStatus
	err := pool.QueryRow(context.Background(), `SELECT status FROM nodes WHERE id = $1`, id).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false
	}
	if err != nil {
		t.Fatalf("read node %s: %v", id, err)
	}
	return s, true
}

// rawConn opens a plain session on pool's database, outside the pool.
func rawConn(t testing.TB, pool *pgxpool.Pool) *pgx.Conn {
	t.Helper()
	conn, err := pgx.ConnectConfig(context.Background(), pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// lockSessionPID finds the backend holding the role's leader lock in pool's database.
func lockSessionPID(t testing.TB, pool *pgxpool.Pool) (int32, bool) {
	t.Helper()
	var pid int32
	err := pool.QueryRow(context.Background(), `
SELECT a.pid
FROM pg_stat_activity a
JOIN pg_locks l ON l.pid = a.pid
WHERE a.application_name = 'harmonia-ci locks'
  AND l.locktype = 'advisory' AND l.classid::bigint = $1 AND l.objid::bigint = $2 AND l.objsubid = 2 AND l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
		int64(db.LockClass), int64(db.LockMaintenance)).Scan(&pid)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false
	}
	if err != nil {
		t.Fatalf("find lock session: %v", err)
	}
	return pid, true
}

// pausableClock is the real clock whose timers can be stopped: once paused, After never fires,
// so a loop driven by it freezes like a SIGSTOPped process, while Now keeps running.
type pausableClock struct {
	mu     sync.Mutex
	paused bool
	parked chan struct{} // closed when a loop asked for a timer while paused
}

func newPausableClock() *pausableClock { return &pausableClock{parked: make(chan struct{})} }

func (c *pausableClock) Now() time.Time { return time.Now() }

func (c *pausableClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.paused {
		select {
		case <-c.parked:
		default:
			close(c.parked)
		}
		return nil // blocks forever
	}
	return time.After(d)
}

func (c *pausableClock) Pause() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.paused = true
}

func termEnded(term *cluster.Term) bool {
	select {
	case <-term.Context().Done():
		return true
	default:
		return false
	}
}
