package queue_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	qt "github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// TestPermanentFailurePropagatesAndRebuildRestores: a permanent failure marks every transitive
// dependent dep-failed and announces each; a rebuild puts the failed job first (priority 100)
// and its dependents back to pending, and readiness releases them in DAG order again.
func TestPermanentFailurePropagatesAndRebuildRestores(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		drvs      []queue.Derivation
		depFailed []string   // dependents of a, all transitively
		stages    [][]string // what becomes claimable, stage by stage, after the rebuild
		blocked   map[string]int
	}{
		{
			name: "diamond",
			drvs: []queue.Derivation{
				qt.Drv("a", sys), qt.Drv("b", sys, "a"), qt.Drv("c", sys, "a"), qt.Drv("d", sys, "b", "c"),
			},
			depFailed: []string{"b", "c", "d"},
			stages:    [][]string{{"a"}, {"b", "c"}, {"d"}},
			blocked:   map[string]int{"a": 0, "b": 1, "c": 1, "d": 2},
		},
		{
			name: "chain",
			drvs: []queue.Derivation{
				qt.Drv("a", sys), qt.Drv("b", sys, "a"), qt.Drv("c", sys, "b"), qt.Drv("d", sys, "c"), qt.Drv("e", sys, "d"),
			},
			depFailed: []string{"b", "c", "d", "e"},
			stages:    [][]string{{"a"}, {"b"}, {"c"}, {"d"}, {"e"}},
			blocked:   map[string]int{"a": 0, "b": 1, "c": 1, "d": 1, "e": 1},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := dbtest.NewPool(t)
			ctx := qt.Ctx(t, 30*time.Second)
			notes := collect(t, startNotifier(t, pool, notify.Config{}))
			project := qt.NewProject(t, pool, "p", 100)
			// A job for another system that depends on nothing of this graph: never touched.
			drvs := append(slices.Clone(tc.drvs), qt.Drv("bystander", "other-linux"))
			if n := qt.Enqueue(t, pool, &project, drvs...); n != len(drvs) {
				t.Fatalf("NewJobs = %d, want %d", n, len(drvs))
			}
			c := claimer("builder")

			a := claim(t, pool, c, 10)
			if got := qt.Names(a); !slices.Equal(got, []string{"a"}) {
				t.Fatalf("first claim = %v, want only the root [a]", got)
			}
			out := fail(t, pool, a[0], queue.Permanent)
			if out.Status != status.JobFailed || out.DepFailed != len(tc.depFailed) {
				t.Fatalf("Fail(permanent) = %+v, want status failed with %d dep-failed", out, len(tc.depFailed))
			}
			want := map[string]status.JobStatus{"a": status.JobFailed, "bystander": status.JobPending}
			for _, n := range tc.depFailed {
				want[n] = status.JobDepFailed
			}
			if got := jobStatuses(t, pool, append(tc.depFailed, "a", "bystander")...); !maps.Equal(got, want) {
				t.Fatalf("after the failure: %v, want %v", got, want)
			}
			qt.WaitFor(t, 20*time.Second, func() bool { return slices.Equal(notes.withStatus(status.JobDepFailed), tc.depFailed) },
				"a dep-failed notification for each of %v (have %v)", tc.depFailed, notes.withStatus(status.JobDepFailed))
			if got := notes.withStatus(status.JobFailed); !slices.Equal(got, []string{"a"}) {
				t.Fatalf("failed notifications for %v, want [a]", got)
			}
			if got := claim(t, pool, c, 10); len(got) != 0 {
				t.Fatalf("claimed %v while everything left depends on a failed job", qt.Names(got))
			}

			n, err := queue.Rebuild(ctx, pool, a[0].ID, queue.PriorityBoost)
			if err != nil || n != 1+len(tc.depFailed) {
				t.Fatalf("Rebuild = %d, %v; want %d jobs reset", n, err, 1+len(tc.depFailed))
			}
			if j := qt.Job(t, pool, "a"); j.Status != status.JobPending || j.Priority != 100 || j.RetryCount != 0 || j.ClaimedBy != nil {
				t.Fatalf("rebuilt root: %v, want pending, priority 100, no retries, unclaimed", j)
			}
			for name, blocked := range tc.blocked {
				j := qt.Job(t, pool, name)
				if j.Status != status.JobPending || j.BlockedInputs != blocked {
					t.Fatalf("after rebuild: %v, want pending with %d blocking inputs", j, blocked)
				}
				if name != "a" && j.Priority != 0 {
					t.Fatalf("after rebuild a dependent got priority %d: %v", j.Priority, j)
				}
			}
			if n, err := queue.Rebuild(ctx, pool, a[0].ID, queue.PriorityBoost); err != nil || n != 0 {
				t.Fatalf("Rebuild of a pending job = %d, %v; want 0 reset", n, err)
			}

			for i, stage := range tc.stages {
				jobs := claim(t, pool, c, 10)
				if got := qt.Names(jobs); !slices.Equal(got, stage) {
					t.Fatalf("stage %d after rebuild: claimed %v, want %v", i, got, stage)
				}
				for _, j := range jobs {
					succeed(t, pool, j)
				}
			}
			if got := claim(t, pool, c, 10); len(got) != 0 {
				t.Fatalf("claimed %v after the whole graph succeeded", qt.Names(got))
			}
			for _, d := range tc.drvs {
				if s := qt.Status(t, pool, d.Name); s != status.JobSucceeded {
					t.Fatalf("%s ended %s, want succeeded", d.Name, s)
				}
			}
			if s := qt.Status(t, pool, "bystander"); s != status.JobPending {
				t.Fatalf("bystander ended %s, want pending", s)
			}
			if n := auditReadiness(t, pool); n != 0 {
				t.Fatalf("readiness audit found %d wrong counts", n)
			}
		})
	}
}

// TestTransientFailuresRetryThreeTimes: a transient failure requeues the job with a retry
// counted; the fourth fails it for good and fails its dependents.
func TestTransientFailuresRetryThreeTimes(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	qt.Enqueue(t, pool, nil, qt.Drv("a", sys), qt.Drv("b", sys, "a"), qt.Drv("c", sys, "b"))
	for attempt := 1; attempt <= 4; attempt++ {
		j := claimOne(t, pool, claimer(fmt.Sprintf("builder-%d", attempt)))
		if qt.NameOf(j.DrvPath) != "a" || j.Attempt != attempt || j.RetryCount != attempt-1 {
			t.Fatalf("claim %d: %+v, want a at attempt %d with %d retries", attempt, j, attempt, attempt-1)
		}
		out := fail(t, pool, j, queue.Transient)
		row := qt.Job(t, pool, "a")
		if attempt < 4 {
			if out.Status != status.JobPending || out.DepFailed != 0 || row.Status != status.JobPending || row.RetryCount != attempt || row.ClaimedBy != nil {
				t.Fatalf("transient failure %d: outcome %+v, row %v; want pending, %d retries, unclaimed", attempt, out, row, attempt)
			}
			if got := jobStatuses(t, pool, "b", "c"); got["b"] != status.JobPending || got["c"] != status.JobPending {
				t.Fatalf("dependents after a retryable failure: %v", got)
			}
			continue
		}
		if out.Status != status.JobFailed || out.DepFailed != 2 || row.Status != status.JobFailed || row.RetryCount != 3 {
			t.Fatalf("fourth transient failure: outcome %+v, row %v; want failed with 3 retries, 2 dep-failed", out, row)
		}
	}
	if got := jobStatuses(t, pool, "b", "c"); got["b"] != status.JobDepFailed || got["c"] != status.JobDepFailed {
		t.Fatalf("dependents after the final failure: %v, want dep-failed", got)
	}
	if got := claim(t, pool, claimer("late"), 10); len(got) != 0 {
		t.Fatalf("claimed %v after the job failed for good", qt.Names(got))
	}
}

// TestEnqueueDeduplicates: enqueuing what exists creates nothing and leaves existing jobs alone.
func TestEnqueueDeduplicates(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := qt.Ctx(t, 30*time.Second)
	p1 := qt.NewProject(t, pool, "first", 100)
	p2 := qt.NewProject(t, pool, "second", 100)
	a, b, c := qt.Drv("a", sys), qt.Drv("b", sys, "a"), qt.Drv("c", sys, "b")

	if n := qt.Enqueue(t, pool, &p1, a, b); n != 2 {
		t.Fatalf("first enqueue: NewJobs = %d, want 2", n)
	}
	succeed(t, pool, claimOne(t, pool, claimer("builder")))

	steps := []struct {
		name    string
		project *int64
		drvs    []queue.Derivation
		newJobs int
	}{
		{"same derivations, other project", &p2, []queue.Derivation{a, b}, 0},
		{"same derivations, no project", nil, []queue.Derivation{b, a}, 0},
		{"one new on top", &p2, []queue.Derivation{a, b, c}, 1},
		{"everything again", &p1, []queue.Derivation{c, b, a}, 0},
	}
	for _, s := range steps {
		if n := qt.Enqueue(t, pool, s.project, s.drvs...); n != s.newJobs {
			t.Fatalf("%s: NewJobs = %d, want %d", s.name, n, s.newJobs)
		}
	}
	want := []struct {
		name    string
		status  status.JobStatus
		project int64
		blocked int
	}{
		{"a", status.JobSucceeded, p1, 0},
		{"b", status.JobPending, p1, 0},
		{"c", status.JobPending, p2, 1},
	}
	for _, w := range want {
		j := qt.Job(t, pool, w.name)
		if j.Status != w.status || j.ProjectID == nil || *j.ProjectID != w.project || j.BlockedInputs != w.blocked || j.Attempt > 1 {
			t.Fatalf("%v, want status %s, project %d, %d blocking inputs", j, w.status, w.project, w.blocked)
		}
	}
	for _, q := range []struct {
		sql  string
		want int64
	}{
		{`SELECT count(*) FROM build_jobs`, 3},
		{`SELECT count(*) FROM derivations`, 3},
		{`SELECT count(*) FROM derivation_inputs`, 2},
		{`SELECT count(*) FROM derivation_outputs`, 3},
	} {
		if n := qt.QueryInt(t, pool, q.sql); n != q.want {
			t.Fatalf("%s = %d, want %d", q.sql, n, q.want)
		}
	}

	// Build names the derivations that get a job; the others are only recorded.
	res, err := queue.Enqueue(ctx, pool, queue.EnqueueParams{
		ProjectID:   &p2,
		Derivations: []queue.Derivation{qt.Drv("cached", sys), qt.Drv("top", sys, "cached", "c")},
		Build:       []string{qt.DrvPath("top")},
	})
	if err != nil || res.NewJobs != 1 {
		t.Fatalf("enqueue with Build: %+v, %v; want 1 new job", res, err)
	}
	// An input derivation without a job (already built) does not block; c's job does.
	if j := qt.Job(t, pool, "top"); j.BlockedInputs != 1 {
		t.Fatalf("%v, want blocked by c only", j)
	}
	if n := auditReadiness(t, pool); n != 0 {
		t.Fatalf("readiness audit found %d wrong counts", n)
	}
}

// TestEnqueueRejectsInvalidDerivations: what would corrupt the queue is refused, and nothing of
// the batch is written.
func TestEnqueueRejectsInvalidDerivations(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := qt.Ctx(t, 30*time.Second)
	valid := qt.Drv("valid", sys)
	cases := []struct {
		name string
		mod  func(d *queue.Derivation)
	}{
		{"path outside the store", func(d *queue.Derivation) { d.DrvPath = "/tmp/" + qt.Hash("x") + "-x.drv" }},
		{"hash with a letter outside nix base32", func(d *queue.Derivation) { d.DrvPath = "/nix/store/" + "e" + qt.Hash("x")[1:] + "-x.drv" }},
		{"hash too short", func(d *queue.Derivation) { d.DrvPath = "/nix/store/" + qt.Hash("x")[:31] + "-x.drv" }},
		{"not a .drv", func(d *queue.Derivation) { d.DrvPath = "/nix/store/" + qt.Hash("x") + "-x" }},
		{"no system", func(d *queue.Derivation) { d.System = "" }},
		{"feature with a comma", func(d *queue.Derivation) { d.RequiredFeatures = []string{"kvm,big-parallel"} }},
		{"input not a .drv", func(d *queue.Derivation) {
			d.Inputs = []queue.Input{{DrvPath: qt.OutPath("x"), Outputs: []string{"out"}}}
		}},
		{"input output name empty", func(d *queue.Derivation) {
			d.Inputs = []queue.Input{{DrvPath: qt.DrvPath("x"), Outputs: []string{""}}}
		}},
	}
	for _, tc := range cases {
		bad := qt.Drv("bad", sys)
		tc.mod(&bad)
		if _, err := queue.Enqueue(ctx, pool, queue.EnqueueParams{Derivations: []queue.Derivation{valid, bad}}); err == nil {
			t.Errorf("%s: Enqueue accepted %+v", tc.name, bad)
		}
	}
	if n := qt.QueryInt(t, pool, `SELECT (SELECT count(*) FROM derivations) + (SELECT count(*) FROM build_jobs)`); n != 0 {
		t.Fatalf("rejected enqueues wrote %d rows", n)
	}
}

// TestStaleFinishChangesNothing: once a claim no longer holds (released and claimed again,
// finished, or cancelled by a user) every write made under it fails with ErrStale and changes
// nothing.
func TestStaleFinishChangesNothing(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := qt.Ctx(t, 30*time.Second)
	qt.Enqueue(t, pool, nil, qt.Drv("a", sys), qt.Drv("b", sys, "a"))

	first := claimOne(t, pool, claimer("n1"))
	// n1 comes back under a new incarnation: what its previous process held is released.
	inTx(t, pool, func(ctx context.Context, tx pgx.Tx) error { return queue.ReleaseNode(ctx, tx, "n1") })
	if j := qt.Job(t, pool, "a"); j.Status != status.JobPending || j.RetryCount != 1 || j.ClaimedBy != nil {
		t.Fatalf("after ReleaseNode: %v, want pending with 1 retry", j)
	}
	second := claimOne(t, pool, claimer("n2"))
	if second.ID != first.ID || second.Attempt != 2 {
		t.Fatalf("re-claim: %+v, want job %d at attempt 2", second, first.ID)
	}

	code := 1
	writes := []struct {
		name  string
		write func(c queue.Claim) error
	}{
		{"Succeed", func(c queue.Claim) error { _, err := queue.Succeed(ctx, pool, c); return err }},
		{"Fail transient", func(c queue.Claim) error {
			_, err := queue.Fail(ctx, pool, c, queue.Failure{Kind: queue.Transient, ExitCode: &code})
			return err
		}},
		{"Fail permanent", func(c queue.Claim) error {
			_, err := queue.Fail(ctx, pool, c, queue.Failure{Kind: queue.Permanent})
			return err
		}},
		{"MarkUploading", func(c queue.Claim) error { return queue.MarkUploading(ctx, pool, c) }},
		{"Release", func(c queue.Claim) error { return queue.Release(ctx, pool, c) }},
	}
	stale := []struct {
		name  string
		claim queue.Claim
	}{
		{"the released claim", first.Claim()},
		{"the new holder's node with the old attempt", queue.Claim{JobID: first.ID, NodeID: "n2", Attempt: 1}},
		{"the old node with the new attempt", queue.Claim{JobID: first.ID, NodeID: "n1", Attempt: 2}},
	}
	unchanged := func(when string) {
		t.Helper()
		j := qt.Job(t, pool, "a")
		if j.Status != status.JobBuilding || j.ClaimedBy == nil || *j.ClaimedBy != "n2" || j.Attempt != 2 || j.RetryCount != 1 {
			t.Fatalf("%s: %v, want still building by n2 at attempt 2", when, j)
		}
		if b := qt.Job(t, pool, "b"); b.Status != status.JobPending || b.BlockedInputs != 1 {
			t.Fatalf("%s: dependent %v, want pending and blocked", when, b)
		}
	}
	for _, s := range stale {
		for _, w := range writes {
			if err := w.write(s.claim); !qt.IsStale(err) {
				t.Fatalf("%s with %s: err = %v, want ErrStale", w.name, s.name, err)
			}
			unchanged(w.name + " with " + s.name)
		}
	}

	// The holder's own writes work; afterwards its claim is spent too.
	if err := queue.MarkUploading(ctx, pool, second.Claim()); err != nil {
		t.Fatalf("MarkUploading by the holder: %v", err)
	}
	succeed(t, pool, second)
	for _, w := range writes {
		if err := w.write(second.Claim()); !qt.IsStale(err) {
			t.Fatalf("%s after the job succeeded: err = %v, want ErrStale", w.name, err)
		}
	}
	if err := queue.Cancel(ctx, pool, first.ID); !qt.IsStale(err) {
		t.Fatalf("Cancel of a succeeded job: err = %v, want ErrStale", err)
	}
	if j := qt.Job(t, pool, "a"); j.Status != status.JobSucceeded {
		t.Fatalf("after stale writes to a finished job: %v", j)
	}

	// A user cancels a running build: the builder finds its claim gone.
	third := claimOne(t, pool, claimer("n3"))
	if qt.NameOf(third.DrvPath) != "b" {
		t.Fatalf("claimed %s, want b", third.DrvPath)
	}
	if err := queue.Cancel(ctx, pool, third.ID); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	if _, err := queue.Succeed(ctx, pool, third.Claim()); !qt.IsStale(err) {
		t.Fatalf("Succeed after a user cancelled: err = %v, want ErrStale", err)
	}
	if s := qt.Status(t, pool, "b"); s != status.JobCancelled {
		t.Fatalf("b is %s after the stale succeed, want cancelled", s)
	}
}

// A failure records why and where its log is, for users; a transient one keeps the last reason;
// a rebuild and a success clear it; GetJob shows it.
func TestFailureRecordsMessageAndLog(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := qt.Ctx(t, 30*time.Second)
	qt.Enqueue(t, pool, nil, qt.Drv("m", sys))
	claimer := queue.Claimer{NodeID: "n1", Systems: []string{sys}}
	qt.InsertNode(t, pool, qt.Node{ID: "n1", Roles: []string{"builder"}})

	j := claimOne(t, pool, claimer)
	if _, err := queue.Fail(ctx, pool, j.Claim(), queue.Failure{Kind: queue.Transient, Message: "input x not available"}); err != nil {
		t.Fatal(err)
	}
	info, err := queue.GetJob(ctx, pool, j.ID)
	if err != nil || info.Status != status.JobPending || info.ErrorMessage != "input x not available" || info.RetryCount != 1 {
		t.Fatalf("after a transient failure: %+v %v", info, err)
	}

	j = claimOne(t, pool, claimer)
	code := 100
	if _, err := queue.Fail(ctx, pool, j.Claim(), queue.Failure{Kind: queue.Permanent, ExitCode: &code,
		Message: "build timed out after 4h0m0s", LogKey: "log/m.drv"}); err != nil {
		t.Fatal(err)
	}
	info, _ = queue.GetJob(ctx, pool, j.ID)
	if info.Status != status.JobFailed || info.ErrorMessage != "build timed out after 4h0m0s" || info.LogURL != "log/m.drv" ||
		info.ExitCode == nil || *info.ExitCode != 100 || info.FinishedAt == nil {
		t.Fatalf("after a permanent failure: %+v", info)
	}

	if _, err := queue.Rebuild(ctx, pool, j.ID, queue.PriorityBoost); err != nil {
		t.Fatal(err)
	}
	if info, _ = queue.GetJob(ctx, pool, j.ID); info.ErrorMessage != "" || info.Status != status.JobPending || info.Priority != 100 {
		t.Fatalf("after a rebuild: %+v", info)
	}
	j = claimOne(t, pool, claimer)
	if _, err := queue.Fail(ctx, pool, j.Claim(), queue.Failure{Kind: queue.Transient, Message: "nix crashed"}); err != nil {
		t.Fatal(err)
	}
	succeed(t, pool, claimOne(t, pool, claimer))
	if info, _ = queue.GetJob(ctx, pool, j.ID); info.Status != status.JobSucceeded || info.ErrorMessage != "" {
		t.Fatalf("after a success: %+v", info)
	}
	if _, err := queue.GetJob(ctx, pool, 999999); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("GetJob of an unknown id: %v", err)
	}
}
