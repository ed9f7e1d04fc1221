package queue_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	qt "github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// TestCancelFor: a user's cancel kills a job only when every live evaluation interested in it is
// one the user acted for; otherwise it detaches the user's evaluations and the job goes on. The
// interested evaluations are read when the cancel is written, so one that became interested
// after the permission check is never cancelled under.
func TestCancelFor(t *testing.T) {
	t.Parallel()
	// mine and theirs are evaluations; "attr" names the derivation an evaluation's attribute is
	// (top needs job, which needs nothing).
	type attr struct {
		eval   string
		drv    string
		status status.EvalStatus // the evaluation's
	}
	for _, c := range []struct {
		name         string
		attrs        []attr
		acting       []string
		wantErr      error
		wantCancel   bool
		wantDetached []string
	}{
		{"only mine, as an attribute", []attr{{"mine", "job", status.EvalRunning}}, []string{"mine"}, nil, true, nil},
		{"only mine, through the closure", []attr{{"mine", "top", status.EvalSucceeded}}, []string{"mine"}, nil, true, nil},
		{"no live evaluation", []attr{{"theirs", "job", status.EvalCancelled}}, nil, nil, true, nil},
		{"theirs too: detach", []attr{{"mine", "job", status.EvalRunning}, {"theirs", "top", status.EvalRunning}}, []string{"mine"}, nil, false, []string{"mine"}},
		{"interested since the check: detach", []attr{{"mine", "top", status.EvalSucceeded}, {"theirs", "job", status.EvalQueued}}, []string{"mine"}, nil, false, []string{"mine"}},
		{"theirs only", []attr{{"theirs", "job", status.EvalRunning}}, []string{"mine"}, queue.ErrNotInterested, false, nil},
		{"all of them mine", []attr{{"mine", "job", status.EvalRunning}, {"mine2", "top", status.EvalSkipped}}, []string{"mine", "mine2"}, nil, true, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pool := dbtest.NewPool(t)
			ctx := qt.Ctx(t, 30*time.Second)
			project := qt.NewProject(t, pool, "p", 100)
			qt.Enqueue(t, pool, &project, qt.Drv("job", sys), qt.Drv("top", sys, "job"))
			evals := map[string]int64{}
			for i, a := range c.attrs {
				if _, ok := evals[a.eval]; !ok {
					evals[a.eval] = qt.QueryInt(t, pool, `INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status)
VALUES ($1, 'x', $2, $3, $4) RETURNING id`, project, a.eval, a.eval, a.status)
				}
				qt.Exec(t, pool, `INSERT INTO eval_attrs (eval_id, attr, drv_path) VALUES ($1, $2, $3)`,
					evals[a.eval], string(rune('a'+i)), qt.DrvPath(a.drv))
			}
			var ids []int64
			for _, e := range c.acting {
				ids = append(ids, evals[e])
			}
			res, err := queue.CancelFor(ctx, pool, qt.Job(t, pool, "job").ID, ids)
			if !errors.Is(err, c.wantErr) {
				t.Fatalf("CancelFor: %v, want %v", err, c.wantErr)
			}
			var want []int64
			for _, e := range c.wantDetached {
				want = append(want, evals[e])
			}
			if res.Cancelled != c.wantCancel || !slices.Equal(res.Detached, want) {
				t.Errorf("CancelFor: %+v, want cancelled %v, detached %v", res, c.wantCancel, want)
			}
			wantJob, wantTop := status.JobPending, status.JobPending
			if c.wantCancel {
				wantJob, wantTop = status.JobCancelled, status.JobDepFailed
			}
			if j, top := qt.Status(t, pool, "job"), qt.Status(t, pool, "top"); j != wantJob || top != wantTop {
				t.Errorf("job %s, top %s; want %s, %s", j, top, wantJob, wantTop)
			}
			detached := qt.QueryInt(t, pool, `SELECT count(*) FROM eval_attrs WHERE detached_at IS NOT NULL AND NOT (eval_id = ANY($1))`, want)
			if detached != 0 {
				t.Errorf("%d attributes of other evaluations detached", detached)
			}
			if len(want) > 0 && qt.QueryInt(t, pool, `SELECT count(*) FROM eval_attrs WHERE detached_at IS NULL AND eval_id = ANY($1)`, want) != 0 {
				t.Error("an attribute of a detached evaluation still needs the job")
			}
		})
	}
	t.Run("a finished job", func(t *testing.T) {
		t.Parallel()
		pool := dbtest.NewPool(t)
		qt.Enqueue(t, pool, nil, qt.Drv("done", sys))
		qt.Exec(t, pool, `UPDATE build_jobs SET status = 'succeeded', finished_at = now()`)
		if _, err := queue.CancelFor(qt.Ctx(t, 30*time.Second), pool, qt.Job(t, pool, "done").ID, nil); !errors.Is(err, queue.ErrStale) {
			t.Errorf("CancelFor of a finished job: %v, want ErrStale", err)
		}
	})
}
