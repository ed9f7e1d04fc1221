package dbroles_test

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
)

// TestRolesAllowRebuild: a trusted evaluation's ingest, as the evaluator's login, resets the
// job of an output only a pull request built when its project does not promote such outputs,
// and the readiness triggers make the job above it wait again.
func TestRolesAllowRebuild(t *testing.T) {
	c := setup(t)
	ctx := testCtx(t)
	sqlHoldClaim := realQuery(t, "eval", "sqlHoldClaim")
	sqlNeedJobs := realQuery(t, "eval", "sqlNeedJobs")
	o := c.owner
	pid := queuetest.NewProject(t, o, "p", 100)
	queuetest.Exec(t, o, `UPDATE projects SET promote_pr_outputs = false WHERE id = $1`, pid)
	queuetest.Enqueue(t, o, &pid, queuetest.Drv("lib", system), queuetest.Drv("app", system, "lib"))
	queuetest.Exec(t, o, `UPDATE build_jobs SET status = 'succeeded', finished_at = now(), trusted = false WHERE drv_path = $1`,
		queuetest.DrvPath("lib"))
	queuetest.Exec(t, o, `UPDATE derivation_outputs SET nar_hash = 'sha256:aa', nar_size = 1, quarantined = true WHERE drv_path = $1`,
		queuetest.DrvPath("lib"))
	if j := queuetest.Job(t, o, "app"); j.BlockedInputs != 0 {
		t.Fatalf("before: %s, want app ready", j)
	}
	evalID := queuetest.QueryInt(t, o, `
INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status, claimed_by, claimed_at, started_at, attempt)
VALUES ($1, 'git+file:///p', 'c1', 'main', 'running', 'e1', now(), now(), 1) RETURNING id`, pid)

	var revived, reset []string
	err := pgx.BeginFunc(ctx, c.as["e1"], func(tx pgx.Tx) error {
		var st string
		if err := tx.QueryRow(ctx, sqlHoldClaim, evalID, "e1", 1).Scan(&st); err != nil {
			return err
		}
		return tx.QueryRow(ctx, sqlNeedJobs, []string{queuetest.DrvPath("app")}, true, false).Scan(&revived, &reset)
	})
	if err != nil || len(reset) != 1 {
		t.Fatalf("trusted ingest as e1: reset %v, %v; want lib's job", reset, err)
	}
	if n := queuetest.QueryInt(t, o, `SELECT count(*) FROM build_jobs WHERE drv_path = $1 AND status = 'pending' AND trusted`,
		queuetest.DrvPath("lib")); n != 1 {
		t.Error("lib's job is not pending and trusted after the reset")
	}
	if j := queuetest.Job(t, o, "app"); j.BlockedInputs != 1 {
		t.Errorf("after: %s, want app waiting for lib again", j)
	}
}
