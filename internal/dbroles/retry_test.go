package dbroles_test

import (
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// TestRolesAllowRetryPolicy: the retry policy and failure expiry under the roles' own grants.
// The evaluator records a policy on the jobs it creates and raises it on queued ones; a
// builder sends a build failure back for its retry and fails it past its retries; the next
// evaluation resets the failure past its expiry with its dependents, and marks again dep-failed
// the dependent that still has another failure below it; a frontend's rebuild gives fresh
// retries.
func TestRolesAllowRetryPolicy(t *testing.T) {
	c := setup(t)
	ctx := testCtx(t)
	var (
		sqlClaimEval        = realQuery(t, "eval", "sqlClaimEval")
		sqlHoldClaim        = realQuery(t, "eval", "sqlHoldClaim")
		sqlApplyRetryPolicy = realQuery(t, "eval", "sqlApplyRetryPolicy")
		sqlRefailDependents = realQuery(t, "eval", "sqlRefailDependents")
	)
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	for _, n := range testNodes {
		register(t, c.as[n.ID], n.ID, n.Roles)
	}
	pid := queuetest.NewProject(t, c.owner, "p", 100)
	newEval := func(commit string) (int64, int) {
		t.Helper()
		if _, _, err := evaluation.Request(ctx, c.as["f1"], evaluation.RequestParams{
			ProjectID: pid, FlakeURL: "git+file:///p", Commit: commit, Branch: "main"}); err != nil {
			t.Fatal(err)
		}
		var id int64
		var attempt int
		must("claim evaluation as e1", c.as["e1"].QueryRow(ctx, sqlClaimEval, "e1", "2.8.0", 1, int64(1<<30)).Scan(&id, &attempt))
		return id, attempt
	}
	ingest := func(id int64, attempt int, f func(tx pgx.Tx) error) {
		t.Helper()
		must("ingest as e1", pgx.BeginFunc(ctx, c.as["e1"], func(tx pgx.Tx) error {
			var st string
			if err := tx.QueryRow(ctx, sqlHoldClaim, id, "e1", attempt).Scan(&st); err != nil {
				return err
			}
			return f(tx)
		}))
	}

	// f and k fail; g needs both. h waits.
	id, attempt := newEval("0123456789abcdef0123456789abcdef01234567")
	ingest(id, attempt, func(tx pgx.Tx) error {
		_, err := queue.EnqueueTx(ctx, tx, queue.EnqueueParams{ProjectID: &pid, RetryLimit: 1, RetryBackoff: time.Minute,
			Derivations: []queue.Derivation{queuetest.Drv("f", system), queuetest.Drv("k", system),
				queuetest.Drv("g", system, "f", "k"), queuetest.Drv("h", system, "g")}})
		return err
	})
	b1 := queue.Claimer{NodeID: "b1", Systems: []string{system}}
	failAll := func(want status.JobStatus) {
		t.Helper()
		queuetest.Exec(t, c.owner, `UPDATE build_jobs SET retry_at = NULL WHERE status = 'pending'`)
		jobs, err := queue.ClaimJobs(ctx, c.as["b1"], b1, 2)
		must("claim as b1", err)
		if got := queuetest.Names(jobs); !slices.Equal(got, []string{"f", "k"}) {
			t.Fatalf("b1 claimed %v, want f and k", got)
		}
		for _, j := range jobs {
			out, err := queue.Fail(ctx, c.as["b1"], j.Claim(), queue.Failure{Kind: queue.Permanent, Message: "failed"})
			must("fail as b1", err)
			if out.Status != want {
				t.Fatalf("%s after a build failure: %s, want %s", queuetest.NameOf(j.DrvPath), out.Status, want)
			}
		}
	}
	failAll(status.JobPending) // the retry
	failAll(status.JobFailed)  // past it: g and h dep-failed
	if s := queuetest.Status(t, c.owner, "h"); s != status.JobDepFailed {
		t.Fatalf("h: %s, want dep-failed", s)
	}

	// The next evaluation: f's failure is past the expiry, k's is not. f goes back with g and h,
	// which are dep-failed again (k still failed); the policy is raised on what waits.
	queuetest.Exec(t, c.owner, `UPDATE build_jobs SET finished_at = now() - interval '2 hours' WHERE drv_path = $1`, queuetest.DrvPath("f"))
	queuetest.Exec(t, c.owner, `UPDATE evaluations SET status = 'succeeded' WHERE id = $1`, id)
	id, attempt = newEval("1123456789abcdef0123456789abcdef01234567")
	ingest(id, attempt, func(tx pgx.Tx) error {
		var systems []string
		var dependents []int64
		if err := tx.QueryRow(ctx, sqlApplyRetryPolicy, []string{queuetest.DrvPath("h")}, 2, 30, 3600).Scan(&systems, &dependents); err != nil {
			return err
		}
		if len(dependents) != 2 {
			t.Errorf("reset dependents %v, want g and h", dependents)
		}
		_, err := tx.Exec(ctx, sqlRefailDependents, dependents)
		return err
	})
	for name, want := range map[string]status.JobStatus{"f": status.JobPending, "k": status.JobFailed,
		"g": status.JobDepFailed, "h": status.JobDepFailed} {
		if got := queuetest.Status(t, c.owner, name); got != want {
			t.Errorf("after the expiry: %s is %s, want %s", name, got, want)
		}
	}
	if n := queuetest.QueryInt(t, c.owner, `SELECT retry_limit FROM build_jobs WHERE drv_path = $1 AND failure_retries = 0`, queuetest.DrvPath("f")); n != 2 {
		t.Errorf("f after the expiry: retry limit %d, want 2 with its retries fresh", n)
	}

	// A frontend's rebuild of k gives it fresh retries.
	var kID int64
	must("k's id", c.owner.QueryRow(ctx, `SELECT id FROM build_jobs WHERE drv_path = $1`, queuetest.DrvPath("k")).Scan(&kID))
	n, err := queue.Rebuild(ctx, c.as["f1"], kID, queue.PriorityNormal)
	must("rebuild as f1", err)
	if n < 1 {
		t.Fatalf("rebuild as f1 reset %d jobs", n)
	}
}
