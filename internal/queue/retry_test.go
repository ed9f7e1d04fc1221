package queue_test

import (
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	qt "github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// TestRetryPolicy: a build failure of a job whose policy has retries left goes back to the
// queue, unclaimable until its backoff has passed, with the attempt kept as failed; a success
// after it is flaky. Past its retries a build failure fails the job, and a rebuild gives it
// fresh ones. A job without a policy fails at once.
func TestRetryPolicy(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := qt.Ctx(t, 30*time.Second)
	project := qt.NewProject(t, pool, "p", 100)
	if _, err := queue.Enqueue(ctx, pool, queue.EnqueueParams{ProjectID: &project,
		Derivations: []queue.Derivation{qt.Drv("flaky", sys)}, RetryLimit: 1, RetryBackoff: time.Hour}); err != nil {
		t.Fatal(err)
	}
	qt.Enqueue(t, pool, &project, qt.Drv("plain", sys))
	b1 := claimer("b1")
	fail := func(j queue.Job) queue.Outcome {
		t.Helper()
		out, err := queue.Fail(ctx, pool, j.Claim(), queue.Failure{Kind: queue.Permanent, ExitCode: ptr(1), Message: "failed"})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	// plain is claimed first.
	qt.Exec(t, pool, `UPDATE build_jobs SET priority = 10 WHERE drv_path = $1`, qt.DrvPath("plain"))
	claimNamed := func(name string) queue.Job {
		t.Helper()
		j := claimOne(t, pool, b1)
		if got := qt.NameOf(j.DrvPath); got != name {
			t.Fatalf("claimed %s, want %s", got, name)
		}
		return j
	}

	// Without a policy: failed at once.
	if out := fail(claimNamed("plain")); out.Status != status.JobFailed {
		t.Fatalf("plain: %s after a build failure, want failed", out.Status)
	}

	// With one retry: back to the queue, but not claimable during its backoff.
	j := claimNamed("flaky")
	if out := fail(j); out.Status != status.JobPending {
		t.Fatalf("flaky: %s after its first build failure, want pending (a retry left)", out.Status)
	}
	if jobs := claim(t, pool, b1, 5); len(jobs) != 0 {
		t.Fatalf("claimed %s during the backoff", qt.Names(jobs))
	}
	info, err := queue.GetJob(ctx, pool, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if info.Failures != 1 || info.RetryLimit != 1 || info.RetryAt == nil || time.Until(*info.RetryAt) < 50*time.Minute || info.Flaky() {
		t.Fatalf("flaky during its backoff: %+v; want 1 failure, retry limit 1, retry in about an hour, not flaky", info)
	}
	// The backoff passes.
	qt.Exec(t, pool, `UPDATE build_jobs SET retry_at = now() - interval '1 second' WHERE id = $1`, j.ID)
	j2 := claimOne(t, pool, b1)
	if j2.ID != j.ID || j2.Attempt != 2 {
		t.Fatalf("claimed %s attempt %d, want flaky's attempt 2", qt.NameOf(j2.DrvPath), j2.Attempt)
	}
	if out := succeed(t, pool, j2); !out.Flaky {
		t.Fatalf("the retry's success: %+v, want flaky", out)
	}
	info, err = queue.GetJob(ctx, pool, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Flaky() || len(info.Attempts) != 2 || info.Attempts[0].Status != status.AttemptFailed ||
		info.Attempts[0].Error != "failed" || info.Attempts[1].Status != status.AttemptSucceeded {
		t.Fatalf("flaky after its retry succeeded: %+v; want flaky, attempt 1 failed, attempt 2 succeeded", info)
	}

	// Retries spent: a build failure fails the job; a rebuild gives fresh retries.
	qt.Exec(t, pool, `UPDATE build_jobs SET status = 'failed', failure_retries = 1, finished_at = now() WHERE id = $1`, j.ID)
	if _, err := queue.Rebuild(ctx, pool, j.ID, queue.PriorityNormal); err != nil {
		t.Fatal(err)
	}
	if out := fail(claimOne(t, pool, b1)); out.Status != status.JobPending {
		t.Fatalf("after a rebuild: %s after a build failure, want pending (fresh retries)", out.Status)
	}
	qt.Exec(t, pool, `UPDATE build_jobs SET retry_at = now() WHERE id = $1`, j.ID)
	if out := fail(claimOne(t, pool, b1)); out.Status != status.JobFailed {
		t.Fatalf("retries spent: %s after a build failure, want failed", out.Status)
	}
}
