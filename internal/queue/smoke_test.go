package queue_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
)

func TestMain(m *testing.M) { dbtest.Main(m, proctest.Cleanup) }

func drv(i int) string { return fmt.Sprintf("/nix/store/%032d-d%d.drv", i, i) }

func TestSmokeChain(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := context.Background()
	var ds []queue.Derivation
	for i := 1; i <= 3; i++ {
		d := queue.Derivation{DrvPath: drv(i), Name: fmt.Sprint("d", i), System: "x86_64-linux", NarHash: "sha256:x", NarSize: 1}
		if i > 1 {
			d.Inputs = []queue.Input{{DrvPath: drv(i - 1), Outputs: []string{"out"}}}
		}
		ds = append(ds, d)
	}
	res, err := queue.Enqueue(ctx, pool, queue.EnqueueParams{Derivations: ds})
	if err != nil || res.NewJobs != 3 {
		t.Fatal(res, err)
	}
	c := queue.Claimer{NodeID: "n", Systems: []string{"x86_64-linux"}}
	for i := 1; i <= 3; i++ {
		jobs, err := queue.ClaimJobs(ctx, pool, c, 5)
		if err != nil || len(jobs) != 1 || jobs[0].DrvPath != drv(i) {
			t.Fatalf("step %d: %v %v", i, jobs, err)
		}
		if _, err := queue.Succeed(ctx, pool, jobs[0].Claim()); err != nil {
			t.Fatal(err)
		}
	}
}
