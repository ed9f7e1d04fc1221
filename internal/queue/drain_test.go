package queue_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	qt "github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// newPool opens a pool of up to maxConns connections on a fresh database (dbtest.NewPool's
// default is sized by the CPU count, too small for many concurrent claimers).
func newPool(t testing.TB, maxConns int32) (*pgxpool.Pool, string) {
	t.Helper()
	url := dbtest.NewDB(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, url
}

// claimLog records every claim the in-process claimers make.
type claimLog struct {
	mu     sync.Mutex
	claims map[int64][]queue.Job // job id → every claim of it
	byNode map[string]int
}

func (l *claimLog) add(jobs []queue.Job) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, j := range jobs {
		l.claims[j.ID] = append(l.claims[j.ID], j)
		l.byNode[j.NodeID]++
	}
}

// benchWorkerAvailable reports whether the binary has `bench worker` (see
// TestManyClaimersDrainRandomDAG for the contract it is tested against).
func benchWorkerAvailable(t *testing.T) (bool, string) {
	code, out := proctest.Run(t, nil, "bench", "worker", "--help")
	return code == 0 && strings.Contains(out, "until-empty"), out
}

// TestManyClaimersDrainRandomDAG drains a random DAG of 3000 jobs over several projects with
// eight in-process claimers (separate node ids, batches of 1..4) and two harmonia-ci processes
// running `bench worker` at the same time, and checks what users rely on: no job is claimed
// twice, none before all its inputs succeeded, no claim returns more than its limit, and every
// job ends succeeded. The maintained readiness counts are audited while the drain runs and
// after it.
//
// Contract of `harmonia-ci bench worker --database-url URL --node-id ID --workers N
// --until-empty`: it registers a node row for ID (roles builder), runs N no-op queue.Worker
// slots that Succeed every job they claim, and exits 0 once no job is pending, building or
// uploading. It builds for x86_64-linux unless told otherwise (its --systems default), which is
// the system of every job here.
func TestManyClaimersDrainRandomDAG(t *testing.T) {
	t.Parallel()
	const (
		nJobs     = 3000
		nClaimers = 8
	)
	procIDs := []string{"bench-proc-1", "bench-proc-2"}
	pool, url := newPool(t, 20)
	ctx := qt.Ctx(t, 90*time.Second)

	haveBench, help := benchWorkerAvailable(t)
	if !haveBench {
		// Reported at the end, so the in-process half still runs and checks everything else.
		t.Cleanup(func() {
			t.Errorf("`harmonia-ci bench worker` is not available (output: %q): the two claiming processes of this "+
				"test did not run; only the in-process claimers drained the queue", strings.TrimSpace(help))
		})
	}

	// The DAG, in topological order, enqueued in consecutive chunks of random size, each for
	// one of three projects or none.
	rng := rand.New(rand.NewPCG(1, 2))
	drvs := qt.RandomDAG(rng, "dag", nJobs, 3, 60, sys)
	projects := []*int64{nil}
	for i, shares := range []int{100, 200, 300} {
		id := qt.NewProject(t, pool, fmt.Sprintf("project-%d", i), shares)
		projects = append(projects, &id)
	}
	for lo := 0; lo < nJobs; {
		hi := min(nJobs, lo+50+rng.IntN(400))
		if n := qt.Enqueue(t, pool, projects[rng.IntN(len(projects))], drvs[lo:hi]...); n != hi-lo {
			t.Fatalf("enqueue of %d derivations created %d jobs", hi-lo, n)
		}
		lo = hi
	}
	installClaimLog(t, pool)
	// What autovacuum would do soon after a burst of inserts; without statistics the audit's
	// correlated count degrades to sequential scans (~1.5s per audit of 3000 jobs, >5s under
	// this test's load instead of ~30ms).
	qt.Exec(t, pool, `ANALYZE`)
	edges := qt.QueryInt(t, pool, `SELECT count(*) FROM derivation_inputs`)
	ready := qt.QueryInt(t, pool, `SELECT count(*) FROM build_jobs WHERE blocked_inputs = 0`)
	t.Logf("%d jobs, %d edges, %d ready at the start", nJobs, edges, ready)

	// An in-process leader audits the maintained readiness while the drain runs.
	leader := qt.StartLeader(t, pool, "auditor", qt.SteadyElector(), nil)
	leader.NextTerm(t, 10*time.Second)
	audit := qt.Task(t, queue.MaintenanceTasks(queue.MaintenanceConfig{}, qt.Logger()), "audit-readiness")

	var procs []*proctest.Proc
	if haveBench {
		env := []string{"XDG_STATE_HOME=" + t.TempDir(), "HARMONIA_DATABASE_URL="}
		for _, id := range procIDs {
			procs = append(procs, proctest.Start(t, id, env, "bench", "worker",
				"--database-url", url, "--node-id", id, "--workers", "4", "--until-empty"))
		}
		// Both processes are up (their node rows exist) before the in-process claimers start,
		// so all of them claim at the same time.
		qt.WaitFor(t, 30*time.Second, func() bool {
			return qt.QueryInt(t, pool, `SELECT count(*) FROM nodes WHERE id = ANY($1) AND 'builder' = ANY(roles)`, procIDs) == int64(len(procIDs))
		}, "the bench worker processes to register their builder node rows")
	}

	// The in-process claimers announce their successes as a node does, so the processes'
	// workers wake on them.
	announcer := queue.NewAnnouncer(pool, 0, qt.TestLogger(t))
	if err := announcer.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(announcer.Stop)
	log := &claimLog{claims: map[int64][]queue.Job{}, byNode: map[string]int{}}
	var wg sync.WaitGroup
	var stop atomic.Bool
	for i := range nClaimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := queue.Claimer{NodeID: fmt.Sprintf("claimer-%d", i), Systems: []string{sys}}
			rng := rand.New(rand.NewPCG(uint64(i), 99))
			idle := time.NewTicker(2 * time.Millisecond)
			defer idle.Stop()
			for !stop.Load() {
				limit := 1 + rng.IntN(4)
				jobs, err := queue.ClaimJobs(ctx, pool, c, limit)
				if err != nil {
					t.Errorf("%s: ClaimJobs: %v", c.NodeID, err)
					stop.Store(true)
					return
				}
				if len(jobs) > limit {
					t.Errorf("%s: ClaimJobs(limit %d) returned %d jobs", c.NodeID, limit, len(jobs))
				}
				if len(jobs) == 0 {
					var left int64
					if err := pool.QueryRow(ctx, `SELECT count(*) FROM build_jobs WHERE status IN ('pending', 'building', 'uploading')`).Scan(&left); err != nil {
						t.Errorf("%s: count unfinished jobs: %v", c.NodeID, err)
						stop.Store(true)
						return
					}
					if left == 0 {
						return
					}
					<-idle.C // poll again: some inputs are still being built
					continue
				}
				log.add(jobs)
				if err := checkInputsSucceeded(ctx, pool, jobs); err != nil {
					t.Errorf("%s: %v", c.NodeID, err)
				}
				for _, j := range jobs {
					out, err := queue.Succeed(ctx, pool, j.Claim())
					if err != nil || out.Status != status.JobSucceeded {
						t.Errorf("%s: Succeed(%s) = %+v, %v", c.NodeID, j.Claim(), out, err)
						stop.Store(true)
						return
					}
					announcer.Finished(out.DrvPath, out.Status)
				}
			}
		}()
	}
	start := time.Now()
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()

	audits, auditErrs := 0, 0
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
audit:
	for {
		select {
		case <-drained:
			break audit
		case <-tick.C:
			term := leader.Term()
			if term == nil {
				auditErrs++
				continue
			}
			var fixed int64
			err := term.RunFenced(ctx, pool, func(tx pgx.Tx) error {
				var err error
				fixed, err = audit.Run(ctx, tx)
				return err
			})
			switch {
			case err != nil:
				auditErrs++ // e.g. a lost lease under load: not what this test is about
				t.Logf("audit during the drain: %v", err)
			case fixed != 0:
				t.Errorf("audit-readiness during the drain found %d jobs with a wrong blocked_inputs count", fixed)
			default:
				audits++
			}
		}
	}
	t.Logf("drained in %s; %d readiness audits during the drain (%d could not run)", time.Since(start), audits, auditErrs)
	for _, p := range procs {
		if code := p.Wait(t, 60*time.Second); code != 0 {
			t.Errorf("%s exited %d, want 0 (--until-empty on a drained queue)", p.Name, code)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// Every job ends succeeded, claimed exactly once.
	if n := qt.QueryInt(t, pool, `SELECT count(*) FROM build_jobs WHERE status <> 'succeeded'`); n != 0 {
		t.Fatalf("%d jobs did not end succeeded", n)
	}
	if n := qt.QueryInt(t, pool, `SELECT count(*) FROM build_jobs WHERE attempt <> 1`); n != 0 {
		t.Fatalf("%d jobs were claimed more than once (attempt <> 1)", n)
	}
	inProcess := 0
	for id, claims := range log.claims {
		if len(claims) != 1 || claims[0].Attempt != 1 || claims[0].RetryCount != 0 {
			t.Fatalf("job %d claimed %d times in process: %+v", id, len(claims), claims)
		}
		inProcess++
	}
	for i := range nClaimers {
		node := fmt.Sprintf("claimer-%d", i)
		if got := qt.QueryInt(t, pool, `SELECT count(*) FROM build_jobs WHERE claimed_by = $1`, node); got != int64(log.byNode[node]) {
			t.Fatalf("%s: database says it claimed %d jobs, it recorded %d", node, got, log.byNode[node])
		}
		if log.byNode[node] == 0 {
			t.Errorf("%s claimed nothing", node)
		}
	}
	byProcs := qt.QueryInt(t, pool, `SELECT count(*) FROM build_jobs WHERE claimed_by = ANY($1)`, procIDs)
	if int64(inProcess)+byProcs != nJobs {
		t.Fatalf("claims: %d in process + %d by the processes = %d, want %d", inProcess, byProcs, int64(inProcess)+byProcs, nJobs)
	}
	for _, id := range procIDs[:len(procs)] {
		// Each process claimed while the in-process claimers did.
		var n int64
		var overlaps bool
		if err := pool.QueryRow(ctx, `
WITH p AS (SELECT count(*) AS n, min(started_at) AS lo, max(finished_at) AS hi FROM build_jobs WHERE claimed_by = $1),
     g AS (SELECT min(started_at) AS lo, max(finished_at) AS hi FROM build_jobs WHERE claimed_by LIKE 'claimer-%')
SELECT p.n, p.n > 0 AND p.lo < g.hi AND g.lo < p.hi FROM p, g`, id).Scan(&n, &overlaps); err != nil {
			t.Fatal(err)
		}
		if !overlaps {
			t.Errorf("process %s claimed %d jobs, not while the in-process claimers did", id, n)
		}
		t.Logf("process %s claimed %d jobs", id, n)
	}

	checkClaimLog(t, pool, nJobs)
	if n := qt.QueryInt(t, pool, `SELECT count(*) FROM build_jobs WHERE blocked_inputs <> 0`); n != 0 {
		t.Errorf("%d succeeded jobs still count blocking inputs", n)
	}
	if n := qt.RunTask(t, pool, currentTerm(t, leader), audit); n != 0 {
		t.Errorf("audit-readiness after the drain changed %d jobs, want 0", n)
	}
}

// currentTerm is the leader's term, waiting for a new one if it lost the role under load.
func currentTerm(t testing.TB, l *qt.Leader) *cluster.Term {
	t.Helper()
	var term *cluster.Term
	qt.WaitFor(t, 10*time.Second, func() bool { term = l.Term(); return term != nil }, "%s to lead", l.ID.NodeID)
	return term
}

// checkInputsSucceeded checks, right after a claim, that every input job of the claimed jobs
// has succeeded.
func checkInputsSucceeded(ctx context.Context, pool *pgxpool.Pool, jobs []queue.Job) error {
	ids := make([]int64, len(jobs))
	for i, j := range jobs {
		ids[i] = j.ID
	}
	rows, err := pool.Query(ctx, `
SELECT j.id, dep.id, dep.status
FROM build_jobs j
JOIN derivation_inputs di ON di.referrer = j.drv_path
JOIN build_jobs dep ON dep.drv_path = di.input_drv
WHERE j.id = ANY($1) AND dep.status <> 'succeeded'`, ids)
	if err != nil {
		return fmt.Errorf("check inputs: %w", err)
	}
	var bad []string
	for rows.Next() {
		var id, dep int64
		var status string
		if err := rows.Scan(&id, &dep, &status); err != nil {
			return err
		}
		bad = append(bad, fmt.Sprintf("job %d claimed while its input job %d is %s", id, dep, status))
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(bad) > 0 {
		return fmt.Errorf("%s", strings.Join(bad, "; "))
	}
	return nil
}

// installClaimLog instruments the test's database (test objects only; the queue is unchanged):
// every claim (pending → building) and every success is logged with clock_timestamp(), the
// real time the row changed, and each claim also counts, at that moment, the claimed job's
// input jobs that have not succeeded. This sees the claims of other processes too.
//
// Why not compare build_jobs.started_at with the inputs' finished_at: both are now(), the start
// of their transactions. A claim's transaction starts (Bind, planning) before its statement
// takes its snapshot, and a Succeed's finished_at is its BEGIN, before its commit; so a correct
// claim may carry a started_at a few milliseconds before its input's finished_at (observed under
// load). The clock_timestamp() of the claimed row's change is after the claim's snapshot, and
// that of the input's success before its commit: a correct claim always comes after.
func installClaimLog(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	qt.Exec(t, pool, `
CREATE TABLE test_claims (job_id BIGINT NOT NULL, attempt INT NOT NULL, node TEXT NOT NULL,
                          at TIMESTAMPTZ NOT NULL, unfinished_inputs INT NOT NULL);
CREATE TABLE test_successes (job_id BIGINT NOT NULL, at TIMESTAMPTZ NOT NULL);
CREATE FUNCTION test_log_status() RETURNS trigger AS $$
BEGIN
    IF OLD.status = 'pending' AND NEW.status = 'building' THEN
        INSERT INTO test_claims VALUES (NEW.id, NEW.attempt, NEW.claimed_by, clock_timestamp(), (
            SELECT count(*) FROM derivation_inputs di JOIN build_jobs dep ON dep.drv_path = di.input_drv
            WHERE di.referrer = NEW.drv_path AND dep.status <> 'succeeded'));
    ELSIF NEW.status = 'succeeded' AND OLD.status <> 'succeeded' THEN
        INSERT INTO test_successes VALUES (NEW.id, clock_timestamp());
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER test_log_status AFTER UPDATE OF status ON build_jobs
    FOR EACH ROW EXECUTE FUNCTION test_log_status();`)
}

// checkClaimLog checks the logged claims: one per job, none while an input had not succeeded,
// none before an input's success.
func checkClaimLog(t testing.TB, pool *pgxpool.Pool, nJobs int) {
	t.Helper()
	if n := qt.QueryInt(t, pool, `SELECT count(*) FROM test_claims`); n != int64(nJobs) {
		t.Errorf("%d claims logged, want one per job (%d)", n, nJobs)
	}
	if n := qt.QueryInt(t, pool, `SELECT count(*) FROM (SELECT job_id FROM test_claims GROUP BY job_id HAVING count(*) > 1) d`); n != 0 {
		t.Errorf("%d jobs were claimed more than once", n)
	}
	rows, err := pool.Query(context.Background(), `
SELECT c.job_id, c.node, c.unfinished_inputs, coalesce(late.dep, 0), coalesce(late.lag_us, 0)
FROM test_claims c
LEFT JOIN LATERAL (
    SELECT dep.id AS dep, (EXTRACT(EPOCH FROM s.at - c.at) * 1e6)::bigint AS lag_us
    FROM build_jobs j
    JOIN derivation_inputs di ON di.referrer = j.drv_path
    JOIN build_jobs dep ON dep.drv_path = di.input_drv
    LEFT JOIN test_successes s ON s.job_id = dep.id
    WHERE j.id = c.job_id AND (s.at IS NULL OR s.at > c.at)
    LIMIT 1
) late ON true
WHERE c.unfinished_inputs > 0 OR late.dep IS NOT NULL
LIMIT 10`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var job, dep, lag int64
		var node string
		var unfinished int
		if err := rows.Scan(&job, &node, &unfinished, &dep, &lag); err != nil {
			t.Fatal(err)
		}
		t.Errorf("job %d claimed by %s with %d input jobs not succeeded (input job %d succeeded %dµs after the claim)",
			job, node, unfinished, dep, lag)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// For the record: how far before an input's finished_at a correct claim's started_at was.
	var early float64
	if err := pool.QueryRow(context.Background(), `
SELECT coalesce(max(EXTRACT(EPOCH FROM dep.finished_at - j.started_at)) * 1000, 0)
FROM build_jobs j JOIN derivation_inputs di ON di.referrer = j.drv_path JOIN build_jobs dep ON dep.drv_path = di.input_drv`).Scan(&early); err != nil {
		t.Fatal(err)
	}
	t.Logf("largest started_at - input finished_at inversion (transaction-start timestamps): %.2f ms", early)
}

// TestConcurrentEnqueueAndClaim: evaluations keep enqueuing overlapping closures of one DAG
// (each enqueue brings a derivation with everything it depends on, as an evaluation does)
// while claimers drain the queue. A job enqueued on top of inputs that are pending, building or
// already succeeded must wait for exactly the unfinished ones: nothing is claimed before its
// inputs succeeded, nothing twice, every job ends succeeded, and the maintained counts agree
// with the graph throughout.
func TestConcurrentEnqueueAndClaim(t *testing.T) {
	t.Parallel()
	const (
		nDrvs      = 1200
		nEnqueuers = 4
		perEnq     = 25
		nClaimers  = 6
	)
	pool, _ := newPool(t, 16)
	ctx, abort := context.WithTimeout(context.Background(), 60*time.Second)
	defer abort()
	// The first error stops everything: a job left building would keep the claimers waiting.
	failf := func(format string, args ...any) {
		if ctx.Err() == nil {
			t.Errorf(format, args...)
		}
		abort()
	}
	installClaimLog(t, pool)
	drvs := qt.RandomDAG(rand.New(rand.NewPCG(3, 4)), "g", nDrvs, 3, 40, sys)
	byPath := map[string]queue.Derivation{}
	for _, d := range drvs {
		byPath[d.DrvPath] = d
	}
	closure := func(root queue.Derivation) []queue.Derivation {
		seen := map[string]bool{root.DrvPath: true}
		out := []queue.Derivation{root}
		for i := 0; i < len(out); i++ {
			for _, in := range out[i].Inputs {
				if !seen[in.DrvPath] {
					seen[in.DrvPath] = true
					out = append(out, byPath[in.DrvPath])
				}
			}
		}
		return out
	}
	projects := []*int64{nil}
	for i := range 2 {
		id := qt.NewProject(t, pool, fmt.Sprintf("p%d", i), 100)
		projects = append(projects, &id)
	}

	var enqueued sync.Map // drv path → true
	var enqWG, claimWG sync.WaitGroup
	var enqueuing atomic.Bool
	enqueuing.Store(true)
	for e := range nEnqueuers {
		enqWG.Add(1)
		go func() {
			defer enqWG.Done()
			rng := rand.New(rand.NewPCG(uint64(e), 5))
			for range perEnq {
				root := drvs[rng.IntN(nDrvs)]
				ds := closure(root)
				if _, err := queue.Enqueue(ctx, pool, queue.EnqueueParams{ProjectID: projects[rng.IntN(len(projects))], Derivations: ds}); err != nil {
					failf("enqueue closure of %s: %v", root.Name, err)
					return
				}
				for _, d := range ds {
					enqueued.Store(d.DrvPath, true)
				}
			}
		}()
	}
	var claims atomic.Int64
	for i := range nClaimers {
		claimWG.Add(1)
		go func() {
			defer claimWG.Done()
			c := queue.Claimer{NodeID: fmt.Sprintf("claimer-%d", i), Systems: []string{sys}}
			rng := rand.New(rand.NewPCG(uint64(i), 6))
			idle := time.NewTicker(2 * time.Millisecond)
			defer idle.Stop()
			for ctx.Err() == nil {
				done := !enqueuing.Load() // read before claiming: no enqueue can follow an empty claim
				limit := 1 + rng.IntN(4)
				jobs, err := queue.ClaimJobs(ctx, pool, c, limit)
				if err != nil {
					failf("%s: ClaimJobs: %v", c.NodeID, err)
					return
				}
				if len(jobs) > limit {
					t.Errorf("%s: ClaimJobs(limit %d) returned %d jobs", c.NodeID, limit, len(jobs))
				}
				if len(jobs) == 0 {
					var left int64
					if err := pool.QueryRow(ctx, `SELECT count(*) FROM build_jobs WHERE status IN ('pending', 'building', 'uploading')`).Scan(&left); err != nil {
						failf("%s: %v", c.NodeID, err)
						return
					}
					if done && left == 0 {
						return
					}
					<-idle.C
					continue
				}
				claims.Add(int64(len(jobs)))
				if err := checkInputsSucceeded(ctx, pool, jobs); err != nil {
					t.Errorf("%s: %v", c.NodeID, err)
				}
				for _, j := range jobs {
					if _, err := queue.Succeed(ctx, pool, j.Claim()); err != nil {
						failf("%s: Succeed(%s): %v", c.NodeID, j.Claim(), err)
						return
					}
				}
			}
		}()
	}
	// Audit the maintained counts while both go on.
	enqDone := make(chan struct{})
	go func() { enqWG.Wait(); close(enqDone) }()
	audits := 0
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
loop:
	for {
		select {
		case <-enqDone:
			break loop
		case <-ctx.Done():
			break loop
		case <-tick.C:
			if n := auditReadiness(t, pool); n != 0 {
				t.Errorf("readiness audit during concurrent enqueues found %d wrong counts", n)
			}
			audits++
		}
	}
	enqueuing.Store(false)
	enqWG.Wait()
	claimWG.Wait()
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("the queue was not drained within 60s")
	}
	if t.Failed() {
		t.FailNow()
	}

	var want int64
	enqueued.Range(func(any, any) bool { want++; return true })
	jobs := qt.QueryInt(t, pool, `SELECT count(*) FROM build_jobs`)
	t.Logf("%d enqueues of closures → %d distinct jobs, %d claims, %d audits while enqueuing", nEnqueuers*perEnq, jobs, claims.Load(), audits)
	if jobs != want || claims.Load() != want {
		t.Fatalf("%d derivations enqueued, %d jobs, %d claims: want one job and one claim each", want, jobs, claims.Load())
	}
	if n := qt.QueryInt(t, pool, `SELECT count(*) FROM build_jobs WHERE status <> 'succeeded' OR attempt <> 1`); n != 0 {
		t.Fatalf("%d jobs did not end succeeded after exactly one claim", n)
	}
	checkClaimLog(t, pool, int(want))
}
