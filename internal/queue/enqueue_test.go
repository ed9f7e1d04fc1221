package queue_test

import (
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	qt "github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// TestEnqueueWhileItsJobSucceeds: an evaluation enqueues a derivation whose job is finishing
// right now (a new commit re-evaluates what is being built: the common case). Both must go
// through, and the new dependent must end up ready.
//
// The interleaving is pinned with a test trigger that makes the success statement take half a
// second after it has updated the job's row: the enqueue starts inside that half second.
// TestConcurrentEnqueueAndClaim meets the same interleaving without any help.
func TestEnqueueWhileItsJobSucceeds(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t, 8)
	ctx := qt.Ctx(t, 30*time.Second)
	qt.Enqueue(t, pool, nil, qt.Drv("x", sys))
	x := claimOne(t, pool, claimer("builder"))
	// Fires before the readiness triggers (triggers fire in name order).
	qt.Exec(t, pool, `
CREATE FUNCTION test_slow_success() RETURNS trigger AS $$
BEGIN
    PERFORM pg_sleep(0.5);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER a_test_slow_success AFTER UPDATE OF status ON build_jobs
    FOR EACH ROW WHEN (NEW.status = 'succeeded') EXECUTE FUNCTION test_slow_success();`)

	succeeded := make(chan error, 1)
	go func() {
		_, err := queue.Succeed(ctx, pool, x.Claim())
		succeeded <- err
	}()
	qt.WaitFor(t, 10*time.Second, func() bool {
		return qt.QueryInt(t, pool, `
SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'PgSleep'`) == 1
	}, "the success to have updated the job's row")
	_, errEnqueue := queue.Enqueue(ctx, pool, queue.EnqueueParams{Derivations: []queue.Derivation{qt.Drv("x", sys), qt.Drv("y", sys, "x")}})
	errSucceed := <-succeeded
	if errEnqueue != nil || errSucceed != nil {
		t.Fatalf("enqueue during the success: %v; the success: %v", errEnqueue, errSucceed)
	}
	if x, y := qt.Job(t, pool, "x"), qt.Job(t, pool, "y"); x.Status != status.JobSucceeded || y.Status != status.JobPending || y.BlockedInputs != 0 {
		t.Fatalf("afterwards: %v; %v; want x succeeded and y ready", x, y)
	}
	if got := qt.Names(claim(t, pool, claimer("builder"), 5)); len(got) != 1 || got[0] != "y" {
		t.Fatalf("claimed %v, want [y]", got)
	}
}
