package webui

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/githubtest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// sharedFixture adds to actionsFixture a second public project, lib (octo/lib, where nobody of
// the fixture may push), whose live evaluation has a running build, libJob, with a pending
// dependent of its own.
type sharedFixture struct {
	*actionsFixture
	lib, libEval   int64
	libJob, libTop int64
	libDrv         string
	pr             int64 // a live evaluation of app's pull request 13 by prauthor
	ownJob         int64 // pr's attribute, which nothing else needs
}

func newSharedFixture(t *testing.T) *sharedFixture {
	t.Helper()
	fx := &sharedFixture{actionsFixture: newActionsFixture(t)}
	fx.gh.AddInstallation(7, githubtest.Repo{FullName: "octo/lib"})
	fx.lib = fx.project("lib", "github", "octo/lib", false)
	fx.libEval = fx.eval(fx.lib, status.EvalSucceeded, 0, "")
	fx.libJob, fx.libDrv = fx.job(fx.lib, fx.libEval, status.JobBuilding)
	fx.id(`UPDATE build_jobs SET started_at = now(), claimed_at = now() WHERE id = $1 RETURNING id`, fx.libJob)
	fx.libTop, _ = fx.job(fx.lib, fx.libEval, status.JobPending, fx.libDrv)
	fx.pr = fx.eval(fx.app, status.EvalSucceeded, 13, "prauthor")
	fx.ownJob, _ = fx.job(fx.app, fx.pr, status.JobPending)
	return fx
}

// TestPRAuthorCannotCancelAnotherProjectsJob is the attack: a pull request's author names
// another project's derivation as an attribute (or as an input of one) and cancels its running
// build. The build must go on and finish, its dependent stay pending.
func TestPRAuthorCannotCancelAnotherProjectsJob(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		share func(fx *sharedFixture)
	}{
		{"as an attribute", func(fx *sharedFixture) {
			fx.id(`INSERT INTO eval_attrs (eval_id, attr, drv_path) VALUES ($1, 'stolen', $2) RETURNING id`, fx.pr, fx.libDrv)
		}},
		{"through an attribute's closure", func(fx *sharedFixture) {
			fx.job(fx.app, fx.pr, status.JobPending, fx.libDrv)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			fx := newSharedFixture(t)
			c.share(fx)
			for _, b := range []*browser{fx.prAuthor, fx.writer} {
				got := fx.act(b, fmt.Sprintf("/api/builds/%d/cancel", fx.libJob))
				if got != http.StatusOK && got != http.StatusForbidden {
					t.Errorf("cancel of lib's build: %d, want 200 (detached) or 403", got)
				}
			}
			if s := fx.jobStatus(fx.libJob); s != status.JobBuilding {
				t.Fatalf("lib's running build is %s after the pull request author's cancel", s)
			}
			if s := fx.jobStatus(fx.libTop); s != status.JobPending {
				t.Errorf("lib's dependent is %s, want pending", s)
			}
			// The build goes on and finishes for lib.
			if _, err := queue.Succeed(fx.ctx, fx.pool, queue.Claim{JobID: fx.libJob, NodeID: "node1"}); err != nil {
				t.Fatalf("lib's build could not finish: %v", err)
			}
			if s := fx.jobStatus(fx.libJob); s != status.JobSucceeded {
				t.Errorf("lib's build is %s, want succeeded", s)
			}
			// A rebuild of lib's failed build is not the author's either.
			fx.pool.Exec(fx.ctx, `UPDATE build_jobs SET status = 'failed', claimed_by = NULL WHERE id = $1`, fx.libJob)
			if got := fx.act(fx.prAuthor, fmt.Sprintf("/api/builds/%d/rebuild", fx.libJob)); got != http.StatusForbidden {
				t.Errorf("the pull request author rebuilds lib's build: %d, want 403", got)
			}
			if s := fx.jobStatus(fx.libJob); s != status.JobFailed {
				t.Errorf("a refused rebuild left lib's build %s", s)
			}
		})
	}
}

// TestRebuildPriority: only an admin's rebuild jumps the queue; everyone else's gets the
// priority jobs are queued with, including the author's cancel-then-rebuild of their own job.
func TestRebuildPriority(t *testing.T) {
	t.Parallel()
	fx := newSharedFixture(t)
	// The author may still cancel their own job, which nobody else needs.
	if got := fx.act(fx.prAuthor, fmt.Sprintf("/api/builds/%d/cancel", fx.ownJob)); got != http.StatusOK {
		t.Fatalf("the author cancels their own job: %d, want 200", got)
	}
	if s := fx.jobStatus(fx.ownJob); s != status.JobCancelled {
		t.Fatalf("the author's own job is %s after their cancel, want cancelled", s)
	}
	for _, c := range []struct {
		name     string
		b        *browser
		job      int64
		priority int64
	}{
		{"the author, their cancelled job", fx.prAuthor, fx.ownJob, 0},
		{"a writer", fx.writer, fx.branchJob, 0},
		{"an admin", fx.boss, fx.branchJob, 100},
	} {
		if _, err := fx.pool.Exec(fx.ctx, `UPDATE build_jobs SET priority = 0 WHERE id = $1`, c.job); err != nil {
			t.Fatal(err)
		}
		if got := fx.act(c.b, fmt.Sprintf("/api/builds/%d/rebuild", c.job)); got != http.StatusOK {
			t.Errorf("%s rebuilds: %d, want 200", c.name, got)
		}
		if p := fx.id(`SELECT priority FROM build_jobs WHERE id = $1`, c.job); fx.jobStatus(c.job) != status.JobPending || p != c.priority {
			t.Errorf("%s rebuilds: job %s at priority %d, want pending at %d", c.name, fx.jobStatus(c.job), p, c.priority)
		}
		fx.pool.Exec(fx.ctx, `UPDATE build_jobs SET status = 'failed' WHERE id = $1`, c.job)
	}
}

// TestCancelDetachesSharedInterest: the author's cancel of a job lib needs too withdraws only
// their evaluation's interest, recorded on its attribute; that attribute no longer keeps the job
// needed once lib stops needing it.
func TestCancelDetachesSharedInterest(t *testing.T) {
	t.Parallel()
	fx := newSharedFixture(t)
	libRunning := fx.eval(fx.lib, status.EvalRunning, 0, "")
	sharedJob, sharedDrv := fx.job(fx.lib, libRunning, status.JobPending)
	stolen := fx.id(`INSERT INTO eval_attrs (eval_id, attr, drv_path) VALUES ($1, 'stolen', $2) RETURNING id`, fx.pr, sharedDrv)
	detached := func(attr int64) bool {
		t.Helper()
		var d bool
		if err := fx.pool.QueryRow(fx.ctx, `SELECT detached_at IS NOT NULL FROM eval_attrs WHERE id = $1`, attr).Scan(&d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	path := fmt.Sprintf("/api/builds/%d/cancel", sharedJob)
	resp, body := fx.prAuthor.post(path, url.Values{"csrf": {fx.prAuthor.csrf()}}, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "goes on") {
		t.Fatalf("the author cancels a shared job: %d %s, want 200 and a detach", resp.StatusCode, body)
	}
	if s := fx.jobStatus(sharedJob); s != status.JobPending || !detached(stolen) {
		t.Fatalf("after the detach: job %s, attribute detached %v; want pending, true", s, detached(stolen))
	}
	if n := fx.id(`SELECT count(*) FROM eval_attrs WHERE eval_id = $1 AND detached_at IS NOT NULL`, libRunning); n != 0 {
		t.Errorf("%d of lib's attributes detached", n)
	}
	// Nothing of the author's needs it any more: a second cancel is refused.
	if got := fx.act(fx.prAuthor, path); got != http.StatusForbidden {
		t.Errorf("a second cancel: %d, want 403", got)
	}
	// The pull request's evaluation counts the attribute as cancelled.
	var cancelled int
	if err := fx.pool.QueryRow(fx.ctx, `SELECT count(*) FILTER (WHERE detached_at IS NOT NULL)::int FROM eval_attrs WHERE eval_id = $1`, fx.pr).Scan(&cancelled); err != nil || cancelled != 1 {
		t.Errorf("detached attributes of the pull request: %d, %v", cancelled, err)
	}
	// Once lib's evaluation is cancelled, nothing live needs the job: it is cancelled with it.
	if err := evaluation.Cancel(fx.ctx, fx.pool, libRunning, "test"); err != nil {
		t.Fatal(err)
	}
	if s := fx.jobStatus(sharedJob); s != status.JobCancelled {
		t.Errorf("with lib's evaluation cancelled the job is %s, want cancelled", s)
	}
}

// TestRebuildFailedSkipsSharedJobs: rebuilding a pull request's failed builds leaves those that
// another project's evaluation needs too.
func TestRebuildFailedSkipsSharedJobs(t *testing.T) {
	t.Parallel()
	fx := newSharedFixture(t)
	sharedJob, sharedDrv := fx.job(fx.lib, fx.libEval, status.JobFailed)
	fx.id(`INSERT INTO eval_attrs (eval_id, attr, drv_path) VALUES ($1, 'stolen', $2) RETURNING id`, fx.pr, sharedDrv)
	path := fmt.Sprintf("/api/evals/%d/rebuild-failed", fx.pr)
	if got := fx.act(fx.prAuthor, path); got != http.StatusForbidden {
		t.Errorf("rebuild-failed with only a shared failure: %d, want 403", got)
	}
	fx.pool.Exec(fx.ctx, `UPDATE build_jobs SET status = 'failed', finished_at = now() WHERE id = $1`, fx.ownJob)
	if got := fx.act(fx.prAuthor, path); got != http.StatusOK {
		t.Errorf("rebuild-failed: %d, want 200", got)
	}
	if s, o := fx.jobStatus(sharedJob), fx.jobStatus(fx.ownJob); s != status.JobFailed || o != status.JobPending {
		t.Errorf("after rebuild-failed: shared job %s, own job %s; want failed, pending", s, o)
	}
	if got := fx.act(fx.boss, path); got != http.StatusOK || fx.jobStatus(sharedJob) != status.JobPending {
		t.Errorf("an admin's rebuild-failed: %d, shared job %s; want 200, pending", got, fx.jobStatus(sharedJob))
	}
}
