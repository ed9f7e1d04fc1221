package dbroles_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/gc"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// TestRolesAllow runs each role's own work as that role, through the real code where it is
// exported: a whole build's life from evaluation to garbage collection.
func TestRolesAllow(t *testing.T) {
	c := setup(t)
	ctx := testCtx(t)
	// The statements of unexported code paths, read from their packages' queries.go so that
	// each role's real writes run under its grants; the exported paths (registry, claims,
	// finishes, enqueue, maintenance, election, requests, the garbage collector) run as they are.
	var (
		sqlClaimEval          = realQuery(t, "eval", "sqlClaimEval")
		sqlHoldClaim          = realQuery(t, "eval", "sqlHoldClaim")
		sqlDeleteAttrs        = realQuery(t, "evaluation", "sqlDeleteAttrs")
		sqlInsertAttrs        = realQuery(t, "eval", "sqlInsertAttrs")
		sqlNeedJobs           = realQuery(t, "eval", "sqlNeedJobs")
		sqlSetMerge           = realQuery(t, "eval", "sqlSetMerge")
		sqlCountRestart       = realQuery(t, "eval", "sqlCountRestart")
		sqlSucceedEval        = realQuery(t, "eval", "sqlSucceedEval")
		sqlCancelUnneeded     = realQuery(t, "evaluation", "sqlCancelUnneeded")
		sqlUpsertTail         = realQuery(t, "builder", "sqlUpsertTail")
		sqlDeleteFinishedTail = realQuery(t, "builder", "sqlDeleteFinishedTail")
		sqlRecordNarHashes    = realQuery(t, "signer", "sqlRecordNarHashes")
		sqlReleaseQuarantine  = realQuery(t, "signer", "sqlReleaseQuarantine")
		sqlPromoteOutputs     = realQuery(t, "eval", "sqlPromoteOutputs")
		sqlRecordKey          = realQuery(t, "signer", "sqlRecordKey")
		sqlInsertUnits        = realQuery(t, "eval", "sqlInsertUnits")
		sqlClaimUnitToHelp    = realQuery(t, "eval", "sqlClaimUnitToHelp")
		sqlHoldEval           = realQuery(t, "eval", "sqlHoldEval")
		sqlHoldUnits          = realQuery(t, "eval", "sqlHoldUnits")
	)
	pid := queuetest.NewProject(t, c.owner, "p", 100)
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	// Every node registers, beats and sets its status in its own row.
	regs := map[string]*cluster.Registry{}
	for _, n := range testNodes {
		regs[n.ID] = register(t, c.as[n.ID], n.ID, n.Roles)
	}
	// With the schema current, a restricted node's start-up migration has nothing to do.
	res, err := db.Migrate(ctx, c.as["b1"], "b1")
	must("migrate as b1", err)
	if len(res.Applied) != 0 {
		t.Fatalf("migrate as b1 applied %v", res.Applied)
	}

	// The frontend requests an evaluation (the webhook path) and the evaluator claims it.
	ev, created, err := evaluation.Request(ctx, c.as["f1"], evaluation.RequestParams{
		ProjectID: pid, FlakeURL: "git+file:///p", Commit: "0123456789abcdef0123456789abcdef01234567", Branch: "main",
		Delivery: &evaluation.Delivery{Forge: "gitea", ID: "d1"},
	})
	must("request evaluation as f1", err)
	if !created {
		t.Fatal("evaluation not created")
	}
	var evalID int64
	var evalAttempt int
	must("claim evaluation as e1", c.as["e1"].QueryRow(ctx, sqlClaimEval, "e1", "2.8.0", 2, int64(1<<30)).Scan(&evalID, &evalAttempt))
	if evalID != ev.ID {
		t.Fatalf("e1 claimed evaluation %d, want %d", evalID, ev.ID)
	}

	// Ingest: in one transaction that proves the claim, derivations and jobs (queue.EnqueueTx)
	// and the attributes. a ← b ← c, and x.
	drvs := []queue.Derivation{queuetest.Drv("a", system), queuetest.Drv("b", system, "a"),
		queuetest.Drv("c", system, "b"), queuetest.Drv("x", system)}
	must("ingest as e1", pgx.BeginFunc(ctx, c.as["e1"], func(tx pgx.Tx) error {
		var status string
		if err := tx.QueryRow(ctx, sqlHoldClaim, evalID, "e1", evalAttempt).Scan(&status); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlDeleteAttrs, []int64{evalID}); err != nil {
			return err
		}
		if _, err := queue.EnqueueTx(ctx, tx, queue.EnqueueParams{ProjectID: &pid, Derivations: drvs}); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sqlInsertAttrs, evalID, []string{"c", "x"},
			[]string{queuetest.DrvPath("c"), queuetest.DrvPath("x")}, []string{"", ""}, []int64{0, 0})
		return err
	}))
	// The readiness triggers ran as the owner: the evaluator could not have written these.
	if b := queuetest.Job(t, c.owner, "b"); b.BlockedInputs != 1 {
		t.Fatalf("after ingest: %s, want blocked_inputs 1", b)
	}
	// A pull request had queued x and built c's input b (quarantined): the branch's next ingest
	// trusts x, promotes b's output (the project promotes) and resets nothing.
	queuetest.Exec(t, c.owner, `UPDATE build_jobs SET trusted = false WHERE drv_path = $1`, queuetest.DrvPath("x"))
	queuetest.Exec(t, c.owner, `UPDATE derivation_outputs SET nar_hash = 'sha256:bb', nar_size = 1, quarantined = true WHERE drv_path = $1`,
		queuetest.DrvPath("b"))
	must("trust as e1", pgx.BeginFunc(ctx, c.as["e1"], func(tx pgx.Tx) error {
		var status string
		if err := tx.QueryRow(ctx, sqlHoldClaim, evalID, "e1", evalAttempt).Scan(&status); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlPromoteOutputs, []string{queuetest.OutPath("b")}); err != nil {
			return err
		}
		var revived, reset []string
		if err := tx.QueryRow(ctx, sqlNeedJobs, []string{queuetest.DrvPath("c"), queuetest.DrvPath("x")}, true, true).Scan(&revived, &reset); err != nil {
			return err
		}
		if len(revived)+len(reset) != 0 {
			return fmt.Errorf("revived %v, reset %v; want nothing", revived, reset)
		}
		return nil
	}))
	if n := queuetest.QueryInt(t, c.owner, `SELECT count(*) FROM build_jobs WHERE NOT trusted`); n != 0 {
		t.Fatalf("after the trusted ingest: %d untrusted jobs", n)
	}
	if n := queuetest.QueryInt(t, c.owner, `SELECT count(*) FROM derivation_outputs WHERE quarantined`); n != 0 {
		t.Fatalf("after the trusted ingest: %d quarantined outputs", n)
	}
	queuetest.Exec(t, c.owner, `UPDATE derivation_outputs SET nar_hash = NULL, nar_size = NULL WHERE drv_path = $1`, queuetest.DrvPath("b"))

	// Cancelling the jobs nothing else needs (a rolled-back evaluation's) and reviving them
	// (a new evaluation needs them again).
	if n := execN(t, c.as["e1"], sqlCancelUnneeded, []int64{evalID}); n != 4 {
		t.Fatalf("cancel unneeded jobs as e1 changed %d rows, want 4", n)
	}
	var revived, reset []string
	must("revive jobs as e1", c.as["e1"].QueryRow(ctx, sqlNeedJobs, []string{queuetest.DrvPath("c"), queuetest.DrvPath("x")}, false, true).
		Scan(&revived, &reset))
	if len(revived) != 4 || len(reset) != 0 {
		t.Fatalf("revive jobs as e1 revived %d, reset %d, want 4 and 0", len(revived), len(reset))
	}
	// e1 hands a part of the tree on as a unit; e2 claims it and ingests what it walked there
	// (a new derivation, its job and its attribute) for e1's evaluation, marking the unit done.
	if n := execN(t, c.as["e1"], sqlInsertUnits, evalID, evalAttempt, 0, "big", []string{"big"}, 1, `[["h"]]`, false, "e1", 0); n != 1 {
		t.Fatalf("queue a unit as e1 inserted %d rows", n)
	}
	var unitID, unitEval int64
	var unitAttempt, unitEvalAttempt, force int
	var path, names []string
	var retry bool
	must("claim a unit as e2", c.as["e2"].QueryRow(ctx, sqlClaimUnitToHelp, "e2", []int64{}).
		Scan(&unitID, &unitAttempt, &unitEval, &unitEvalAttempt, &path, &force, &names, &retry))
	must("ingest a unit as e2", pgx.BeginFunc(ctx, c.as["e2"], func(tx pgx.Tx) error {
		var status string
		if err := tx.QueryRow(ctx, sqlHoldEval, evalID, evalAttempt).Scan(&status); err != nil {
			return err
		}
		hold := func(done bool) error {
			rows, err := tx.Query(ctx, sqlHoldUnits, "e2", []int64{unitID}, []int{unitAttempt}, []bool{done})
			if err != nil {
				return err
			}
			held, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil || len(held) != 1 {
				return fmt.Errorf("held %v: %w", held, err)
			}
			return nil
		}
		if err := hold(false); err != nil {
			return err
		}
		if _, err := queue.EnqueueTx(ctx, tx, queue.EnqueueParams{ProjectID: &pid, Derivations: []queue.Derivation{queuetest.Drv("h", system)}}); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlInsertAttrs, evalID, []string{"big.h"}, []string{queuetest.DrvPath("h")}, []string{""}, []int64{unitID}); err != nil {
			return err
		}
		return hold(true)
	}))
	if n := queuetest.QueryInt(t, c.owner, `SELECT count(*) FROM eval_units WHERE status = 'done' AND claimed_by = 'e2'`); n != 1 {
		t.Fatalf("after e2's ingest: %d units done by e2", n)
	}
	// A pull request's evaluation records the merge it evaluates.
	if n := execN(t, c.as["e1"], sqlSetMerge, evalID, "e1", evalAttempt, strings.Repeat("b", 40), strings.Repeat("c", 40)); n != 1 {
		t.Fatalf("record the merge as e1 changed %d rows", n)
	}
	// A walker restarted past its memory limit is counted.
	if n := execN(t, c.as["e1"], sqlCountRestart, evalID, "e1", evalAttempt); n != 1 {
		t.Fatalf("count a restart as e1 changed %d rows", n)
	}
	if n := execN(t, c.as["e1"], sqlSucceedEval, evalID, "e1", evalAttempt); n != 1 {
		t.Fatalf("finish evaluation as e1 changed %d rows", n)
	}

	// b1 claims the ready jobs, streams a log tail, uploads; the signer records the success.
	jobs, err := queue.ClaimJobs(ctx, c.as["b1"], queue.Claimer{NodeID: "b1", Systems: []string{system}}, 10)
	must("claim as b1", err)
	if got := queuetest.Names(jobs); len(got) != 2 {
		t.Fatalf("b1 claimed %v, want a and x", got)
	}
	claims := map[string]queue.Claim{}
	for _, j := range jobs {
		claims[queuetest.NameOf(j.DrvPath)] = j.Claim()
	}
	for _, tail := range []string{"building a", "building a\ndone"} {
		if n := execN(t, c.as["b1"], sqlUpsertTail, claims["a"].JobID, []byte(tail)); n != 1 {
			t.Fatalf("tail upsert as b1 changed %d rows", n)
		}
	}
	must("mark uploading as b1", queue.MarkUploading(ctx, c.as["b1"], claims["a"]))
	// The signer's build-complete: the output's hashes and the success with its log, one batch.
	batch := &pgx.Batch{}
	batch.Queue(sqlReleaseQuarantine, []string{queuetest.OutPath("a")}, []string{"sha256:aa"}, []int64{10})
	batch.Queue(sqlRecordNarHashes, []string{queuetest.OutPath("a")}, []string{"sha256:aa"}, []int64{10}, queuetest.DrvPath("a"), false)
	var succeeded queue.Outcome
	queue.QueueSucceed(batch, claims["a"], "log/a", &succeeded)
	must("succeed as s1", c.as["s1"].SendBatch(ctx, batch).Close())
	for range 2 { // a signer records its key at start, and again after a restart
		execN(t, c.as["s1"], sqlRecordKey, "harmonia-test-1:AAAA")
	}
	if b := queuetest.Job(t, c.owner, "b"); b.BlockedInputs != 0 {
		t.Fatalf("after a succeeded: %s, want blocked_inputs 0 (the trigger runs as the owner)", b)
	}
	if n := execN(t, c.as["b1"], sqlDeleteFinishedTail, claims["a"].JobID); n != 1 {
		t.Fatalf("delete finished tail as b1 deleted %d rows", n)
	}
	// A transient failure goes back to the queue; b1 charges the project its time.
	_, err = queue.Fail(ctx, c.as["b1"], claims["x"], queue.Failure{Kind: queue.Transient, Message: "disk full"})
	must("fail transiently as b1", err)
	var charger queue.Charger
	charger.Add(&pid, 5)
	must("charge as b1", charger.Flush(ctx, c.as["b1"]))

	// b2 takes b and x; b fails for good (c becomes dep-failed), x goes back unfinished.
	jobs, err = queue.ClaimJobs(ctx, c.as["b2"], queue.Claimer{NodeID: "b2", Systems: []string{system}}, 10)
	must("claim as b2", err)
	for _, j := range jobs {
		claims[queuetest.NameOf(j.DrvPath)] = j.Claim()
	}
	if len(jobs) != 2 {
		t.Fatalf("b2 claimed %v, want b and x", queuetest.Names(jobs))
	}
	out, err := queue.Fail(ctx, c.as["b2"], claims["b"], queue.Failure{Kind: queue.Permanent, Message: "build failed", LogKey: "log/b"})
	must("fail permanently as b2", err)
	if out.DepFailed != 1 || queuetest.Status(t, c.owner, "c") != status.JobDepFailed {
		t.Fatalf("after b failed: %d dep-failed, c %s", out.DepFailed, queuetest.Status(t, c.owner, "c"))
	}
	must("release as b2", queue.Release(ctx, c.as["b2"], claims["x"]))

	// The frontend rebuilds b (c comes back too) and cancels x's rebuild.
	n, err := queue.Rebuild(ctx, c.as["f1"], claims["b"].JobID, queue.PriorityBoost)
	must("rebuild as f1", err)
	if n != 2 {
		t.Fatalf("rebuild reset %d jobs, want 2", n)
	}
	_, err = queue.Rebuild(ctx, c.as["f1"], claims["x"].JobID, queue.PriorityBoost)
	must("rebuild x as f1", err)
	must("cancel as f1", queue.Cancel(ctx, c.as["f1"], claims["x"].JobID))
	// ... and a user's cancel, which detaches or cancels under the job-need lock.
	_, err = queue.Rebuild(ctx, c.as["f1"], claims["x"].JobID, queue.PriorityNormal)
	must("rebuild x at normal priority as f1", err)
	interested, _, err := queue.InterestedEvals(ctx, c.as["f1"], claims["x"].JobID)
	must("evaluations interested in x as f1", err)
	if res, err := queue.CancelFor(ctx, c.as["f1"], claims["x"].JobID, interested); err != nil || !res.Cancelled {
		t.Fatalf("cancel for a user as f1: %+v, %v", res, err)
	}
	must("drain request as f1", cluster.RequestDrain(ctx, c.as["f1"], "c1"))
	// A user's cache token: minted, listed, refreshed from the forge and revoked by a frontend.
	var tokenID int64
	var expires time.Time
	must("mint a user's cache token as f1", c.as["f1"].QueryRow(ctx, realQuery(t, "webui", "sqlUserTokenInsert"),
		make([]byte, 32), "note", []int64{}, 30, "github", int64(5), "octo", 50).Scan(&tokenID, &expires))
	for _, q := range []struct {
		name string
		args []any
	}{
		{"sqlUserTokens", []any{"github", int64(5), 10}},
		{"sqlLiveUserTokens", nil},
		{"sqlUserTokenRefresh", []any{[]int64{tokenID}, []int64{}}},
		{"sqlUserTokenRevoke", []any{tokenID, "github", int64(5)}},
	} {
		_, err := c.as["f1"].Exec(ctx, realQuery(t, "webui", q.name), q.args...)
		must(q.name+" as f1", err)
	}

	// A restarted builder gives back what its previous process held (OnReregister).
	jobs, err = queue.ClaimJobs(ctx, c.as["b1"], queue.Claimer{NodeID: "b1", Systems: []string{system}}, 1)
	must("claim b as b1", err)
	if len(jobs) != 1 {
		t.Fatalf("b1 claimed %v, want b", queuetest.Names(jobs))
	}
	regs["b1"] = register(t, c.as["b1"], "b1", []string{"builder"})
	if s := queuetest.Status(t, c.owner, "b"); s != status.JobPending {
		t.Fatalf("after b1 re-registered, b is %s", s)
	}

	// The maintenance leader (a frontend) runs every task: b2 went silent holding b.
	jobs, err = queue.ClaimJobs(ctx, c.as["b2"], queue.Claimer{NodeID: "b2", Systems: []string{system}}, 1)
	must("claim b as b2", err)
	queuetest.Exec(t, c.owner, `UPDATE nodes SET last_seen = now() - interval '1 hour' WHERE id = 'b2'`)
	leader := queuetest.StartLeader(t, c.as["f1"], "f1", queuetest.SteadyElector(), nil)
	term := leader.NextTerm(t, 30*time.Second)
	tasks := append(cluster.NodeTasks(cluster.NodeTasksConfig{}, queuetest.Logger()),
		queue.MaintenanceTasks(queue.MaintenanceConfig{}, queuetest.Logger())...)
	maint := cluster.NewMaintainer(c.as["f1"], tasks, queuetest.Logger(), clock.Real{})
	for _, task := range tasks {
		must("maintenance task "+task.Name+" as f1", maint.RunOnce(ctx, term, task))
	}
	if s := queuetest.Status(t, c.owner, "b"); s != status.JobPending {
		t.Fatalf("after the reaper, b is %s", s)
	}

	// The GC leader (a signer) expires logs and deletes an evaluation, its jobs and derivations.
	gcCfg := queuetest.SteadyElector()
	gcCfg.Role = cluster.RoleGC
	gcTerm := queuetest.StartLeader(t, c.as["s1"], "s1", gcCfg, nil).NextTerm(t, 30*time.Second)
	queuetest.Exec(t, c.owner, `INSERT INTO gc_requests DEFAULT VALUES`)
	// The evaluation expired long ago on a branch nobody builds any more, so nothing keeps it.
	queuetest.Exec(t, c.owner, `UPDATE evaluations SET created_at = now() - interval '1000 days', branch = 'gone'`)
	store, err := blob.NewLocal(t.TempDir(), "http://unused", make([]byte, 32))
	must("open a cache", err)
	collector, err := gc.New(gc.Config{Store: store, Retention: time.Hour, LogRetention: time.Hour,
		Grace: time.Nanosecond, Logger: queuetest.Logger()}, c.as["s1"])
	must("make a collector", err)
	_, err = collector.Run(ctx, gc.RunOptions{NodeID: "s1", Epoch: gcTerm.Epoch, Valid: gcTerm.Valid,
		Fence: func(ctx context.Context, fn func(pgx.Tx) error) error { return gcTerm.RunFenced(ctx, c.as["s1"], fn) }})
	must("collect garbage as s1", err)
	if n := queuetest.QueryInt(t, c.owner, `SELECT count(*) FROM derivations`); n != 0 {
		t.Fatalf("after the GC %d derivations are left", n)
	}

	// Every node drains and leaves.
	for _, n := range testNodes {
		must("drain "+n.ID, regs[n.ID].StartDraining(ctx))
		must("deregister "+n.ID, regs[n.ID].Deregister(ctx))
	}
	if n := queuetest.QueryInt(t, c.owner, `SELECT count(*) FROM nodes`); n != 0 {
		t.Fatalf("%d node rows left", n)
	}
}

// register registers node id as its own role, releasing what an earlier process held, and
// beats once.
func register(t *testing.T, pool *pgxpool.Pool, id string, roles []string) *cluster.Registry {
	t.Helper()
	ctx := testCtx(t)
	reg := cluster.NewRegistry(pool, cluster.NodeInfo{
		ID: id, Roles: roles, Endpoint: "http://" + id + ":7777", Systems: []string{system}, Features: []string{}, MaxJobs: 2, MaxEvals: 1,
	}, queuetest.Logger())
	reg.OnReregister(queue.ReleaseNode)
	if err := reg.Register(ctx); err != nil {
		t.Fatal(err)
	}
	if err := reg.SetStatus(ctx, status.NodeActive); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Beat(ctx, cluster.Load{CurrentJobs: 1, CPU: 0.5, Memory: 0.5, SpeedFactor: 2}); err != nil {
		t.Fatal(err)
	}
	return reg
}

// execN runs a statement and returns the rows it changed.
func execN(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	tag, err := pool.Exec(context.Background(), sql, args...)
	if err != nil {
		t.Fatalf("exec %q: %v", sql, err)
	}
	return tag.RowsAffected()
}

// TestRolesAllowSharedIngest runs two evaluations of e1 that reach the same derivations, their
// ingests overlapping: the second waits on the first's inserts, then finds the rows there,
// identical to its own, and writes nothing of them. Its jobs land in its own project.
func TestRolesAllowSharedIngest(t *testing.T) {
	c := setup(t)
	ctx := testCtx(t)
	sqlHoldClaim := realQuery(t, "eval", "sqlHoldClaim")
	drvs := []queue.Derivation{queuetest.Drv("a", system), queuetest.Drv("b", system, "a")}
	var evals [2]int64
	var projects [2]int64
	for i := range evals {
		projects[i] = queuetest.NewProject(t, c.owner, fmt.Sprint("p", i), 100)
		evals[i] = queuetest.QueryInt(t, c.owner, `
INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status, claimed_by, claimed_at, started_at, attempt)
VALUES ($1, 'git+file:///p', 'c', 'main', 'running', 'e1', now(), now(), 1) RETURNING id`, projects[i])
	}
	ingest := func(tx pgx.Tx, i int) error {
		var status string
		if err := tx.QueryRow(ctx, sqlHoldClaim, evals[i], "e1", 1).Scan(&status); err != nil {
			return err
		}
		_, err := queue.EnqueueTx(ctx, tx, queue.EnqueueParams{ProjectID: &projects[i], Derivations: drvs, Build: []string{}})
		return err
	}
	first, err := c.as["e1"].Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(context.WithoutCancel(ctx))
	if err := ingest(first, 0); err != nil {
		t.Fatalf("first ingest: %v", err)
	}
	second := c.as["e1"]
	conn, err := second.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if err := ingest(tx, 1); err != nil {
				return err
			}
			_, err := queue.EnqueueTx(ctx, tx, queue.EnqueueParams{ProjectID: &projects[1], Derivations: drvs[:1]})
			return err
		})
	}()
	// The second ingest waits on a lock the first holds (the enqueue lock, or the rows).
	queuetest.WaitFor(t, 30*time.Second, func() bool {
		return queuetest.QueryInt(t, c.owner, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'`, pid) > 0
	}, "the second ingest waiting for the first")
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("second ingest: %v", err)
	}
	if n := queuetest.QueryInt(t, c.owner, `SELECT count(*) FROM build_jobs WHERE project_id = $1`, projects[1]); n != 1 {
		t.Fatalf("the second evaluation's project has %d jobs, want 1 (a)", n)
	}
	// Sequentially, as a re-evaluation that did not know the derivations: identical rows pass.
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(pgx.BeginFunc(ctx, c.as["e1"], func(tx pgx.Tx) error { return ingest(tx, 0) }))
}
