package evaluation_test

import (
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// An evaluation is compared with the previous finished one of its branch (a pull request's
// with its base's): a break, a fix, a still-failing attribute, new and removed ones, each
// from the attributes' build statuses and evaluation errors.
func TestDiff(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := t.Context()
	project := queuetest.NewProject(t, pool, "diffed", 100)
	commit, drvs := 0, 0
	eval := func(st status.EvalStatus, branch string, pr int, base string) int64 {
		commit++
		var prNumber any
		if pr > 0 {
			prNumber = pr
		}
		return queuetest.QueryInt(t, pool, `INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status, pr_number, pr_base)
VALUES ($1, 'x', $2, $3, $4, $5, $6) RETURNING id`, project, fmt.Sprintf("%040d", commit), branch, st, prNumber, base)
	}
	// attr adds attribute name to evaluation e: built with a job of status js, cached (no
	// job: js ""), or failed to evaluate (js "error").
	attr := func(e int64, name string, js status.JobStatus) {
		if js == "error" {
			queuetest.Exec(t, pool, `INSERT INTO eval_attrs (eval_id, attr, error) VALUES ($1, $2, 'error: boom')`, e, name)
			return
		}
		drvs++
		drv := fmt.Sprintf("/nix/store/%032d-%s.drv", drvs, name)
		queuetest.Exec(t, pool, `INSERT INTO derivations (drv_path, hash_part, name, system, nar_hash, nar_size)
VALUES ($1, $2, $3, 'x86_64-linux', 'sha256:0', 0)`, drv, fmt.Sprintf("%032d", drvs), name)
		queuetest.Exec(t, pool, `INSERT INTO eval_attrs (eval_id, attr, drv_path) VALUES ($1, $2, $3)`, e, name, drv)
		if js != "" {
			claimed := "NULL"
			if js != status.JobPending {
				claimed = "'b1'"
			}
			queuetest.Exec(t, pool, `INSERT INTO build_jobs (drv_path, project_id, system, status, claimed_by)
VALUES ($1, $2, 'x86_64-linux', $3, `+claimed+`)`, drv, project, js)
		}
	}

	first := eval(status.EvalSucceeded, "main", 0, "")
	attr(first, "a", status.JobSucceeded)
	attr(first, "b", "")
	attr(first, "c", status.JobFailed)
	attr(first, "d", status.JobSucceeded)
	attr(first, "e", "error")
	attr(first, "p", status.JobSucceeded)
	eval(status.EvalFailed, "main", 0, "")     // a failed evaluation is compared with nothing
	eval(status.EvalSucceeded, "other", 0, "") // another branch's is not compared with

	second := eval(status.EvalSucceeded, "main", 0, "")
	attr(second, "a", status.JobFailed)    // broke
	attr(second, "b", status.JobSucceeded) // still good
	attr(second, "c", status.JobSucceeded) // fixed
	attr(second, "e", "error")             // still failing (d removed)
	attr(second, "f", status.JobDepFailed) // new, failing
	attr(second, "g", "")                  // new, fine
	attr(second, "p", status.JobPending)   // unfinished: neither broken nor fixed

	pr := eval(status.EvalSucceeded, "pull/7", 7, "main")
	attr(pr, "a", status.JobSucceeded) // the pull request fixes a against its base
	attr(pr, "b", status.JobSucceeded)
	attr(pr, "c", status.JobSucceeded)
	attr(pr, "e", "error")
	attr(pr, "f", status.JobDepFailed)
	attr(pr, "g", "")
	attr(pr, "p", status.JobSucceeded)

	for _, tt := range []struct {
		name    string
		id      int64
		want    evaluation.Diff
		summary string
	}{
		{"the first", first, evaluation.Diff{}, ""},
		{"the second against the first", second, evaluation.Diff{Against: first,
			NewlyFailing: []string{"a"}, NewlyFixed: []string{"c"}, StillFailing: []string{"e"},
			Added: []string{"f", "g"}, AddedFailing: []string{"f"}, Removed: []string{"d"}},
			"1 newly failing, 1 fixed, 1 new and failing, 1 removed"},
		{"a pull request against its base", pr, evaluation.Diff{Against: second,
			NewlyFixed: []string{"a"}, StillFailing: []string{"e", "f"}}, "1 fixed"},
	} {
		got, err := evaluation.DiffOf(ctx, pool, tt.id)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: %+v\nwant %+v", tt.name, got, tt.want)
		}
		if s := got.Summary(); s != tt.summary {
			t.Errorf("%s: summary %q, want %q", tt.name, s, tt.summary)
		}
	}
	if _, err := evaluation.DiffOf(ctx, pool, 99999); !errors.Is(err, evaluation.ErrNotFound) {
		t.Errorf("no such evaluation: %v", err)
	}
}
