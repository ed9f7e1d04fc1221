package queue_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	qt "github.com/harmonia-ci/harmonia-ci/internal/queuetest"
)

// TestFairShareBetweenProjects: two projects with 200 and 100 scheduling shares, 300 equal
// independent jobs each, four one-slot workers. While both still have jobs waiting, the builder
// time they got is 2:1 within 10%, and each project is charged exactly the builder time its
// jobs took.
func TestFairShareBetweenProjects(t *testing.T) {
	t.Parallel()
	const perProject, workers = 300, 4
	pool, _ := newPool(t, 12)
	big := qt.NewProject(t, pool, "big", 200)
	small := qt.NewProject(t, pool, "small", 100)
	// The small project enqueues first: at the start (both ratios 0) the oldest jobs win, so the
	// share accounting has to catch up with an initial lead of the small project.
	for _, p := range []struct {
		id   int64
		name string
	}{{small, "small"}, {big, "big"}} {
		var ds []queue.Derivation
		for i := range perProject {
			ds = append(ds, qt.Drv(fmt.Sprintf("%s-%d", p.name, i), sys))
		}
		qt.Enqueue(t, pool, &p.id, ds...)
	}

	build := func(ctx context.Context, _ queue.Job) queue.Result {
		select { // the simulated build: equal work for every job
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
		}
		return queue.Result{}
	}
	var ws []*queue.Worker
	for i := range workers {
		ws = append(ws, startWorker(t, pool, queue.WorkerConfig{
			Claimer: claimer(fmt.Sprintf("worker-%d", i)), MaxJobs: 1, PollInterval: 20 * time.Millisecond, Handler: build,
			// Builder time reaches consumed_seconds in batches; at the default (1s) the whole
			// contended window of this test would be scheduled on stale figures.
			ChargeInterval: 10 * time.Millisecond,
		}))
	}
	qt.WaitFor(t, 60*time.Second, func() bool {
		return qt.QueryInt(t, pool, `SELECT count(*) FROM build_jobs WHERE status = 'succeeded'`) == 2*perProject
	}, "all %d jobs to succeed", 2*perProject)
	// Charges reach the projects in batches: wait until they account for every job. (Stopping
	// right away would race Stop with a flush; see TestWorkerChargesOnceWhenStoppedMidFlush.)
	charged := func() bool {
		return qt.QueryInt(t, pool, `
SELECT count(*) FROM projects p
WHERE abs(p.consumed_seconds - (SELECT sum(EXTRACT(EPOCH FROM finished_at - started_at)) FROM build_jobs WHERE project_id = p.id)) < 1e-6`) == 2
	}
	qt.WaitFor(t, 10*time.Second, charged, "each project to be charged exactly its jobs' builder time")
	for _, w := range ws {
		w.Stop()
	}

	// The window ends when the first project's last job was claimed: from then on it has
	// nothing waiting and the other project may take every slot.
	rows, err := pool.Query(qt.Ctx(t, 10*time.Second), `
WITH window_end AS (
    SELECT min(last_start) AS t FROM (SELECT max(started_at) AS last_start FROM build_jobs GROUP BY project_id) l
)
SELECT bj.project_id, count(*), sum(EXTRACT(EPOCH FROM bj.finished_at - bj.started_at))
FROM build_jobs bj, window_end w
WHERE bj.started_at < w.t
GROUP BY bj.project_id`)
	if err != nil {
		t.Fatal(err)
	}
	secs, jobs := map[int64]float64{}, map[int64]int64{}
	for rows.Next() {
		var p, n int64
		var s float64
		if err := rows.Scan(&p, &n, &s); err != nil {
			t.Fatal(err)
		}
		secs[p], jobs[p] = s, n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	ratio := secs[big] / secs[small]
	t.Logf("while both had jobs waiting: big %d jobs %.3fs, small %d jobs %.3fs, ratio %.3f",
		jobs[big], secs[big], jobs[small], secs[small], ratio)
	if math.Abs(ratio-2) > 0.2 {
		t.Errorf("builder time big:small = %.3f while both had jobs waiting, want 2 ± 10%%", ratio)
	}

	if !charged() {
		t.Fatal("stopping the workers changed what the projects were charged")
	}
}

// TestClaimPriorityFirst: a job at priority 100 (a rebuild, or set by hand) is claimed before
// every priority-0 job, whatever its project's share ratio and however recent it is.
func TestClaimPriorityFirst(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// hog: the urgent job's project has used far more than its share; otherwise it is in
		// the same project as the others and the newest job.
		hog     bool
		rebuild bool
	}{
		{"rebuild of a failed job in a project over its share", true, true},
		{"priority set by hand on the newest job of a project", false, false},
		{"rebuild in the same project", false, true},
		{"priority set by hand in a project over its share", true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := dbtest.NewPool(t)
			ctx := qt.Ctx(t, 30*time.Second)
			hog := qt.NewProject(t, pool, "hog", 100)
			fresh := qt.NewProject(t, pool, "fresh", 100)
			qt.Exec(t, pool, `UPDATE projects SET consumed_seconds = 10000 WHERE id = $1`, hog)
			urgentProject := fresh
			if tc.hog {
				urgentProject = hog
			}
			if tc.rebuild {
				// The urgent job is the oldest: it was built, and failed, before the others came.
				qt.Enqueue(t, pool, &urgentProject, qt.Drv("urgent", sys))
				fail(t, pool, claimOne(t, pool, claimer("builder")), queue.Permanent)
			}
			for i := range 10 {
				qt.Enqueue(t, pool, &fresh, qt.Drv(fmt.Sprintf("fresh-%d", i), sys))
				qt.Enqueue(t, pool, &hog, qt.Drv(fmt.Sprintf("hog-%d", i), sys))
			}
			if tc.rebuild {
				if n, err := queue.Rebuild(ctx, pool, qt.Job(t, pool, "urgent").ID, queue.PriorityBoost); err != nil || n != 1 {
					t.Fatalf("Rebuild = %d, %v", n, err)
				}
			} else {
				qt.Enqueue(t, pool, &urgentProject, qt.Drv("urgent", sys))
				qt.Exec(t, pool, `UPDATE build_jobs SET priority = 100 WHERE drv_path = $1`, qt.DrvPath("urgent"))
			}
			if j := claimOne(t, pool, claimer("builder")); qt.NameOf(j.DrvPath) != "urgent" || j.Priority != 100 {
				t.Fatalf("first claim: %s at priority %d, want urgent at 100", j.DrvPath, j.Priority)
			}
			rest := claim(t, pool, claimer("builder"), 100)
			if len(rest) != 20 {
				t.Fatalf("then claimed %d jobs, want the 20 others", len(rest))
			}
		})
	}
}

// TestClaimFIFOWithinProject: a project's jobs are claimed oldest first.
func TestClaimFIFOWithinProject(t *testing.T) {
	t.Parallel()
	const n = 24
	cases := []struct {
		name string
		// enqueue creates the jobs and returns their names oldest first.
		enqueue func(t *testing.T, pool *pgxpool.Pool, project int64) []string
	}{
		{"one enqueue per job", func(t *testing.T, pool *pgxpool.Pool, project int64) []string {
			var names []string
			for i := range n {
				name := fmt.Sprintf("job-%d", i)
				qt.Enqueue(t, pool, &project, qt.Drv(name, sys))
				names = append(names, name)
			}
			return names
		}},
		{"created_at out of id order", func(t *testing.T, pool *pgxpool.Pool, project int64) []string {
			var ds []queue.Derivation
			for i := range n {
				ds = append(ds, qt.Drv(fmt.Sprintf("job-%d", i), sys))
			}
			qt.Enqueue(t, pool, &project, ds...)
			// Ages by a shuffled rank: the oldest is not the lowest id.
			rank := rand.New(rand.NewPCG(7, 7)).Perm(n)
			names := make([]string, n)
			for i, r := range rank {
				qt.Exec(t, pool, `UPDATE build_jobs SET created_at = now() - make_interval(mins => $2) WHERE drv_path = $1`,
					qt.DrvPath(fmt.Sprintf("job-%d", i)), n-r)
				names[r] = fmt.Sprintf("job-%d", i)
			}
			return names
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := dbtest.NewPool(t)
			project := qt.NewProject(t, pool, "p", 100)
			want := tc.enqueue(t, pool, project)
			var got []string
			// Batches of growing size: each batch is the oldest jobs left.
			for limit := 1; len(got) < n; limit++ {
				batch := qt.Names(claim(t, pool, claimer("builder"), limit))
				if len(batch) == 0 {
					t.Fatalf("nothing claimed after %v", got)
				}
				wantBatch := slices.Clone(want[len(got):min(n, len(got)+limit)])
				slices.Sort(wantBatch)
				if !slices.Equal(batch, wantBatch) {
					t.Fatalf("claim of %d after %d jobs: %v, want the oldest left %v", limit, len(got), batch, wantBatch)
				}
				got = append(got, batch...)
			}
		})
	}
}

// TestClaimFavoursLowestShareRatio: between projects at equal priority, the one that used least
// builder time for its shares goes first, whatever the age of its jobs.
func TestClaimFavoursLowestShareRatio(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	type proj struct {
		name     string
		shares   int
		consumed float64
	}
	// Ratios consumed/shares: a 2.0, b 0.5, c 1.0, d 0.
	projs := []proj{{"a", 100, 200}, {"b", 400, 200}, {"c", 300, 300}, {"d", 50, 0}}
	for _, p := range projs {
		id := qt.NewProject(t, pool, p.name, p.shares)
		qt.Exec(t, pool, `UPDATE projects SET consumed_seconds = $2 WHERE id = $1`, id, p.consumed)
		qt.Enqueue(t, pool, &id, qt.Drv(p.name+"-job", sys))
	}
	var got []string
	for range projs {
		got = append(got, qt.Names([]queue.Job{claimOne(t, pool, claimer("builder"))})...)
	}
	if want := []string{"d-job", "b-job", "c-job", "a-job"}; !slices.Equal(got, want) {
		t.Fatalf("claim order %v, want %v (lowest consumed/shares first)", got, want)
	}
}
