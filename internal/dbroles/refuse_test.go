package dbroles_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
)

const system = "x86_64-linux"

// fixture is a cluster's state before an attack, written by the owner: a project; jobs a ←
// b ← c (c waits for b), d (ready), arm (ready, for a system no node builds), h (building,
// claimed by b2) and m (building, claimed by b1, its only slot); a derivation with no job; a
// log tail of h; one evaluation running for another evaluator, one running for e1 and one
// queued; the maintenance lease held by f1 and the gc lease by s1.
type fixture struct {
	project, otherProject       int64
	job                         map[string]int64
	evalOther, evalOwn, evalNew int64
	evalOwnPR                   int64 // a pull request's, running for e1
	// Units of evalOwn (e1's): one e1 walks, one queued.
	unitWalked, unitQueued int64
}

// foreignSystem is a system no node of the fixture builds.
const foreignSystem = "aarch64-linux"

func newFixture(t *testing.T, c *testDB) fixture {
	t.Helper()
	o := c.owner
	fx := fixture{job: map[string]int64{}}
	fx.project = queuetest.NewProject(t, o, "p", 100)
	fx.otherProject = queuetest.NewProject(t, o, "q", 100)
	queuetest.Enqueue(t, o, &fx.project,
		queuetest.Drv("a", system), queuetest.Drv("b", system, "a"), queuetest.Drv("c", system, "b"),
		queuetest.Drv("d", system), queuetest.Drv("h", system), queuetest.Drv("m", system),
		queuetest.Drv("arm", foreignSystem), queuetest.Drv("built", system))
	if _, err := queue.Enqueue(testCtx(t), o, queue.EnqueueParams{
		Derivations: []queue.Derivation{queuetest.Drv("nojob", system)}, Build: []string{},
	}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b", "c", "d", "h", "m", "arm", "built"} {
		fx.job[name] = queuetest.Job(t, o, name).ID
	}
	for name, node := range map[string]string{"h": "b2", "m": "b1"} {
		queuetest.Exec(t, o, `UPDATE build_jobs SET status = 'building', claimed_by = $2, claimed_at = now(),
started_at = now(), attempt = 1 WHERE id = $1`, fx.job[name], node)
	}
	queuetest.Exec(t, o, `INSERT INTO build_log_tails (build_job_id, log_tail, log_seq) VALUES ($1, 'building h', 1)`, fx.job["h"])
	for _, n := range testNodes {
		queuetest.InsertNode(t, o, queuetest.Node{ID: n.ID, Roles: n.Roles, Systems: []string{system}})
	}
	fx.evalOther = queuetest.QueryInt(t, o, `
INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status, claimed_by, claimed_at, started_at, attempt)
VALUES ($1, 'git+file:///p', 'c1', 'main', 'running', 'e2', now(), now(), 1) RETURNING id`, fx.project)
	fx.evalOwn = queuetest.QueryInt(t, o, `
INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status, claimed_by, claimed_at, started_at, attempt)
VALUES ($1, 'git+file:///p', 'c3', 'main', 'running', 'e1', now(), now(), 1) RETURNING id`, fx.project)
	fx.evalOwnPR = queuetest.QueryInt(t, o, `
INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, pr_number, pr_base, status, claimed_by, claimed_at, started_at, attempt)
VALUES ($1, 'git+file:///p', 'c4', 'pull/1', 1, 'main', 'running', 'e1', now(), now(), 1) RETURNING id`, fx.project)
	fx.unitWalked = queuetest.QueryInt(t, o, `
INSERT INTO eval_units (eval_id, eval_attempt, handed, path, force, status, claimed_by, claimed_at, attempt)
VALUES ($1, 1, 'big', '{big}', 0, 'running', 'e1', now(), 1) RETURNING id`, fx.evalOwn)
	fx.unitQueued = queuetest.QueryInt(t, o, `
INSERT INTO eval_units (eval_id, eval_attempt, handed, path, force) VALUES ($1, 1, 'big2', '{big2}', 0) RETURNING id`, fx.evalOwn)
	// built succeeded, for a pull request: its output is quarantined.
	queuetest.Exec(t, o, `UPDATE build_jobs SET status = 'succeeded', finished_at = now(), trusted = false WHERE id = $1`, fx.job["built"])
	queuetest.Exec(t, o, `UPDATE derivation_outputs SET nar_hash = 'sha256:bb', nar_size = 1, quarantined = true WHERE drv_path = $1`,
		queuetest.DrvPath("built"))
	// d was queued for a pull request; a's output was built for one (quarantined).
	queuetest.Exec(t, o, `UPDATE build_jobs SET trusted = false WHERE id = $1`, fx.job["d"])
	queuetest.Exec(t, o, `UPDATE derivation_outputs SET nar_hash = 'sha256:aa', nar_size = 1, quarantined = true WHERE drv_path = $1`,
		queuetest.DrvPath("a"))
	fx.evalNew = queuetest.QueryInt(t, o, `
INSERT INTO evaluations (project_id, flake_url, commit_sha, branch) VALUES ($1, 'git+file:///p', 'c2', 'dev') RETURNING id`, fx.project)
	queuetest.Exec(t, o, `
INSERT INTO leaders (role, node_id, incarnation, epoch, lease_until)
VALUES ('maintenance', 'f1', gen_random_uuid(), 1, now() + interval '1 hour'),
       ('gc', 's1', gen_random_uuid(), 1, now() + interval '1 hour')`)
	return fx
}

// inEval is an attack that first names evaluation id as the one its transaction ingests for,
// as the evaluator's ingest does.
func inEval(id int64, sql string, args ...any) func(ctx context.Context, tx pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('harmonia.eval_id', $1::bigint::text, true)`, id); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sql, args...)
		return err
	}
}

// attack is something a node must not be able to do. effect tells, inside the attack's
// transaction, whether it worked.
type attack struct {
	as     string
	name   string
	do     func(ctx context.Context, tx pgx.Tx) error
	effect string // a query returning one boolean
	args   []any  // of effect
}

// stmt is an attack that is one statement.
func stmt(sql string, args ...any) func(ctx context.Context, tx pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, sql, args...)
		return err
	}
}

func attacks(fx fixture) []attack {
	h, m, c, d, arm := fx.job["h"], fx.job["m"], fx.job["c"], fx.job["d"], fx.job["arm"]
	a, nojob := queuetest.DrvPath("a"), queuetest.DrvPath("nojob")
	insertDrv := stmt(`INSERT INTO derivations (drv_path, hash_part, name, system, nar_hash, nar_size)
VALUES ($1, $2, 'evil', 'x86_64-linux', 'sha256:00', 1)`, queuetest.DrvPath("evil"), queuetest.Hash("evil"))
	drvInserted := `SELECT EXISTS (SELECT 1 FROM derivations WHERE name = 'evil')`
	insertKey := stmt(`INSERT INTO signing_keys (public_key) VALUES ('evil-1:AAAA')`)
	keyInserted := `SELECT EXISTS (SELECT 1 FROM signing_keys WHERE public_key = 'evil-1:AAAA')`
	recordHash := stmt(`UPDATE derivation_outputs SET nar_hash = 'sha256:evil', nar_size = 1 WHERE drv_path = $1`, a)
	hashRecorded := `SELECT EXISTS (SELECT 1 FROM derivation_outputs WHERE nar_hash = 'sha256:evil')`
	succeed := func(id int64) func(ctx context.Context, tx pgx.Tx) error {
		return stmt(`UPDATE build_jobs SET status = 'succeeded', finished_at = now(), exit_code = 0 WHERE id = $1`, id)
	}
	succeeded := `SELECT status = 'succeeded' FROM build_jobs WHERE id = $1`
	writeTail := stmt(`UPDATE build_log_tails SET log_tail = 'evil', log_seq = log_seq + 1 WHERE build_job_id = $1`, h)
	tailWritten := `SELECT log_tail = 'evil' FROM build_log_tails WHERE build_job_id = $1`
	takeLease := func(node, role string) func(ctx context.Context, tx pgx.Tx) error {
		return stmt(`UPDATE leaders SET node_id = $1, epoch = epoch + 1, lease_until = now() + interval '1 hour'
WHERE role = $2`, node, role)
	}
	leaseTaken := `SELECT node_id = $1 FROM leaders WHERE role = $2`
	signerRole := func(node string) func(ctx context.Context, tx pgx.Tx) error {
		return stmt(`UPDATE nodes SET roles = roles || '{signer}' WHERE id = $1`, node)
	}
	signerAdvertised := `SELECT 'signer' = ANY(roles) FROM nodes WHERE id = $1`
	claimAs := func(node string, id int64) func(ctx context.Context, tx pgx.Tx) error {
		return stmt(`UPDATE build_jobs SET status = 'building', claimed_by = $2, claimed_at = now(), started_at = now(),
    attempt = attempt + 1 WHERE id = $1`, id, node)
	}
	claimedBy := `SELECT claimed_by IS NOT DISTINCT FROM $2 FROM build_jobs WHERE id = $1`
	claimFunc := func(systems []string, node string) func(ctx context.Context, tx pgx.Tx) error {
		return stmt(`SELECT count(*) FROM claim_jobs($1, '{}', $2, 10, 10)`, systems, node)
	}
	evilOut := `/nix/store/00000000000000000000000000000000-evil`
	outRecorded := `SELECT EXISTS (SELECT 1 FROM derivation_outputs WHERE output_path = '/nix/store/00000000000000000000000000000000-evil')`
	insertOut := `INSERT INTO derivation_outputs (drv_path, output_name, output_path) VALUES ($1, 'dev', $2)`
	insertJob := `INSERT INTO build_jobs (drv_path, project_id, system) VALUES ($1, $2, 'x86_64-linux')`
	jobQueued := `SELECT EXISTS (SELECT 1 FROM build_jobs WHERE drv_path = $1)`
	unitDone := stmt(`UPDATE eval_units SET status = 'done' WHERE id = $1`, fx.unitWalked)
	isDone := `SELECT status = 'done' FROM eval_units WHERE id = $1`
	takeUnit := func(node string) func(ctx context.Context, tx pgx.Tx) error {
		return stmt(`UPDATE eval_units SET status = 'running', claimed_by = $2, claimed_at = now(), attempt = attempt + 1
WHERE id = $1`, fx.unitQueued, node)
	}
	unitTaken := `SELECT claimed_by IS NOT DISTINCT FROM $2 FROM eval_units WHERE id = $1`
	return []attack{
		// Units of an evaluation: only their walker marks them done; a builder claims none; an
		// evaluator queues units only for what it walks and clears only its evaluations'.
		{as: "b1", name: "mark another node's unit done", do: unitDone, effect: isDone, args: []any{fx.unitWalked}},
		{as: "e2", name: "mark another evaluator's unit done", do: unitDone, effect: isDone, args: []any{fx.unitWalked}},
		{as: "b1", name: "claim a unit", do: takeUnit("b1"), effect: unitTaken, args: []any{fx.unitQueued, "b1"}},
		{as: "e2", name: "steal a walked unit", do: stmt(`UPDATE eval_units SET claimed_by = 'e2', attempt = attempt + 1 WHERE id = $1`, fx.unitWalked),
			effect: unitTaken, args: []any{fx.unitWalked, "e2"}},
		{as: "e2", name: "clear another evaluator's units", do: stmt(`DELETE FROM eval_units WHERE eval_id = $1`, fx.evalOwn),
			effect: `SELECT NOT EXISTS (SELECT 1 FROM eval_units WHERE eval_id = $1)`, args: []any{fx.evalOwn}},
		{as: "e2", name: "queue a unit of an evaluation it does not walk",
			do:     stmt(`INSERT INTO eval_units (eval_id, eval_attempt, handed, path, force) VALUES ($1, 1, 'evil', '{evil}', 0)`, fx.evalOwn),
			effect: `SELECT EXISTS (SELECT 1 FROM eval_units WHERE path = '{evil}')`},
		// A builder: its own claims and log tails only, never a success.
		{as: "b1", name: "fail a job another builder holds",
			do:     stmt(`UPDATE build_jobs SET status = 'failed', finished_at = now() WHERE id = $1`, h),
			effect: `SELECT status = 'failed' FROM build_jobs WHERE id = $1`, args: []any{h}},
		{as: "b1", name: "take over another builder's claim",
			do:     stmt(`UPDATE build_jobs SET claimed_by = 'b1' WHERE id = $1`, h),
			effect: `SELECT claimed_by = 'b1' FROM build_jobs WHERE id = $1`, args: []any{h}},
		{as: "b1", name: "mark its own job succeeded (queue.Succeed, the signer's statement)",
			do: func(ctx context.Context, tx pgx.Tx) error {
				_, err := queue.Succeed(ctx, tx, queue.Claim{JobID: m, NodeID: "b1", Attempt: 1})
				return err
			},
			effect: succeeded, args: []any{m}},
		{as: "b1", name: "mark a pending job succeeded", do: succeed(d), effect: succeeded, args: []any{d}},
		{as: "b1", name: "claim a pending job for another node",
			do:     stmt(`UPDATE build_jobs SET status = 'building', claimed_by = 'b2', attempt = attempt + 1 WHERE id = $1`, d),
			effect: `SELECT claimed_by = 'b2' FROM build_jobs WHERE id = $1`, args: []any{d}},
		{as: "b1", name: "claim a ready job directly, not through the claim function",
			do: claimAs("b1", d), effect: claimedBy, args: []any{d, "b1"}},
		{as: "b1", name: "claim a job of a system it does not build",
			do: claimAs("b1", arm), effect: claimedBy, args: []any{arm, "b1"}},
		{as: "b1", name: "claim a job whose inputs are not built",
			do: claimAs("b1", c), effect: claimedBy, args: []any{c, "b1"}},
		{as: "b1", name: "claim a job of a system it does not build through the claim function",
			do: claimFunc([]string{foreignSystem}, "b1"), effect: claimedBy, args: []any{arm, "b1"}},
		{as: "b1", name: "claim for another node through the claim function",
			do: claimFunc([]string{system}, "b2"), effect: claimedBy, args: []any{d, "b2"}},
		{as: "b1", name: "claim past its free slots through the claim function",
			do:     claimFunc([]string{system}, "b1"),
			effect: `SELECT EXISTS (SELECT 1 FROM build_jobs WHERE claimed_by = 'b1' AND id <> $1)`, args: []any{m}},
		{as: "b1", name: "advertise a system its grant does not include",
			do:     stmt(`UPDATE nodes SET systems = systems || $1::text WHERE id = 'b1'`, foreignSystem),
			effect: `SELECT $1 = ANY(systems) FROM nodes WHERE id = 'b1'`, args: []any{foreignSystem}},
		{as: "b1", name: "advertise a feature its grant does not include",
			do:     stmt(`UPDATE nodes SET features = features || '{kvm}' WHERE id = 'b1'`),
			effect: `SELECT 'kvm' = ANY(features) FROM nodes WHERE id = 'b1'`},
		{as: "b1", name: "raise its max_jobs past its grant",
			do:     stmt(`UPDATE nodes SET max_jobs = 1000 WHERE id = 'b1'`),
			effect: `SELECT max_jobs = 1000 FROM nodes WHERE id = 'b1'`},
		{as: "b1", name: "register again with a system its grant does not include",
			do: func(ctx context.Context, tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `DELETE FROM nodes WHERE id = 'b1'`); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `INSERT INTO nodes (id, roles, endpoint, systems, incarnation)
VALUES ('b1', '{builder}', 'http://b1:7777', $1, gen_random_uuid())`, []string{foreignSystem})
				return err
			},
			effect: `SELECT $1 = ANY(systems) FROM nodes WHERE id = 'b1'`, args: []any{foreignSystem}},
		{as: "b1", name: "raise a job's priority",
			do:     stmt(`UPDATE build_jobs SET priority = 1000 WHERE id = $1`, d),
			effect: `SELECT priority = 1000 FROM build_jobs WHERE id = $1`, args: []any{d}},
		{as: "b1", name: "use up a pending job's retries",
			do:     stmt(`UPDATE build_jobs SET retry_count = 3 WHERE id = $1`, d),
			effect: `SELECT retry_count = 3 FROM build_jobs WHERE id = $1`, args: []any{d}},
		{as: "b1", name: "give another builder's job back to the queue",
			do:     stmt(`UPDATE build_jobs SET status = 'pending', claimed_by = NULL WHERE id = $1`, h),
			effect: `SELECT status = 'pending' FROM build_jobs WHERE id = $1`, args: []any{h}},
		{as: "b1", name: "unblock a job whose inputs are not built",
			do:     stmt(`UPDATE build_jobs SET blocked_inputs = 0 WHERE id = $1`, c),
			effect: `SELECT blocked_inputs = 0 FROM build_jobs WHERE id = $1`, args: []any{c}},
		{as: "b1", name: "delete a job", do: stmt(`DELETE FROM build_jobs WHERE id = $1`, d),
			effect: `SELECT NOT EXISTS (SELECT 1 FROM build_jobs WHERE id = $1)`, args: []any{d}},
		{as: "b1", name: "write another builder's log tail", do: writeTail, effect: tailWritten, args: []any{h}},
		{as: "b1", name: "insert a derivation", do: insertDrv, effect: drvInserted},
		{as: "b1", name: "record a NAR hash", do: recordHash, effect: hashRecorded},
		{as: "b1", name: "record a signing key", do: insertKey, effect: keyInserted},
		{as: "b1", name: "queue an evaluation",
			do: stmt(`INSERT INTO evaluations (project_id, flake_url, commit_sha, branch)
VALUES ($1, 'git+file:///p', 'evil', 'main')`, fx.project),
			effect: `SELECT EXISTS (SELECT 1 FROM evaluations WHERE commit_sha = 'evil')`},
		{as: "b1", name: "finish an evaluation",
			do:     stmt(`UPDATE evaluations SET status = 'failed', finished_at = now() WHERE id = $1`, fx.evalOther),
			effect: `SELECT status = 'failed' FROM evaluations WHERE id = $1`, args: []any{fx.evalOther}},
		{as: "b1", name: "take the maintenance lease", do: takeLease("b1", "maintenance"), effect: leaseTaken, args: []any{"b1", "maintenance"}},
		{as: "b1", name: "stand for a leader role",
			do:     stmt(`INSERT INTO leaders (role, node_id, incarnation, epoch, lease_until) VALUES ('evil', 'b1', gen_random_uuid(), 1, now())`),
			effect: `SELECT EXISTS (SELECT 1 FROM leaders WHERE role = 'evil')`},
		{as: "b1", name: "drain another node",
			do:     stmt(`UPDATE nodes SET draining = true WHERE id = 'b2'`),
			effect: `SELECT draining FROM nodes WHERE id = 'b2'`},
		{as: "b1", name: "point the signer's row at itself",
			do:     stmt(`UPDATE nodes SET endpoint = 'http://evil:7777' WHERE id = 's1'`),
			effect: `SELECT endpoint = 'http://evil:7777' FROM nodes WHERE id = 's1'`},
		{as: "b1", name: "register under another node id",
			do:     stmt(`INSERT INTO nodes (id, roles, endpoint, incarnation) VALUES ('s2', '{signer}', 'http://evil:7777', gen_random_uuid())`),
			effect: `SELECT EXISTS (SELECT 1 FROM nodes WHERE id = 's2')`},
		{as: "b1", name: "advertise itself as a signer", do: signerRole("b1"), effect: signerAdvertised, args: []any{"b1"}},
		{as: "b1", name: "delete another node's row", do: stmt(`DELETE FROM nodes WHERE id = 'b2'`),
			effect: `SELECT NOT EXISTS (SELECT 1 FROM nodes WHERE id = 'b2')`},
		{as: "b1", name: "disable row-level security", do: stmt(`ALTER TABLE build_jobs DISABLE ROW LEVEL SECURITY`),
			effect: `SELECT NOT relrowsecurity FROM pg_class WHERE oid = 'build_jobs'::regclass`},
		{as: "b1", name: "empty the queue", do: stmt(`TRUNCATE build_jobs CASCADE`),
			effect: `SELECT NOT EXISTS (SELECT 1 FROM build_jobs)`},

		// An evaluator: its evaluations, the derivation tables, new pending jobs.
		{as: "e1", name: "mark a job succeeded", do: succeed(d), effect: succeeded, args: []any{d}},
		{as: "e1", name: "cancel a job a builder is building",
			do:     stmt(`UPDATE build_jobs SET status = 'cancelled', finished_at = now() WHERE id = $1`, h),
			effect: `SELECT status = 'cancelled' FROM build_jobs WHERE id = $1`, args: []any{h}},
		{as: "e1", name: "claim a build job",
			do:     stmt(`UPDATE build_jobs SET status = 'building', claimed_by = 'e1' WHERE id = $1`, d),
			effect: `SELECT claimed_by = 'e1' FROM build_jobs WHERE id = $1`, args: []any{d}},
		{as: "e1", name: "insert a job already claimed",
			do:     stmt(`INSERT INTO build_jobs (drv_path, system, status, claimed_by) VALUES ($1, 'x86_64-linux', 'building', 'b1')`, nojob),
			effect: `SELECT EXISTS (SELECT 1 FROM build_jobs WHERE drv_path = $1)`, args: []any{nojob}},
		{as: "e1", name: "insert an output with a NAR hash",
			do: stmt(`INSERT INTO derivation_outputs (drv_path, output_name, output_path, nar_hash, nar_size)
VALUES ($1, 'dev', '/nix/store/00000000000000000000000000000000-evil', 'sha256:evil', 1)`, nojob),
			effect: hashRecorded},
		{as: "e1", name: "record a NAR hash", do: recordHash, effect: hashRecorded},
		{as: "e1", name: "record an output without naming an evaluation",
			do: stmt(insertOut, nojob, evilOut), effect: outRecorded},
		{as: "e1", name: "record an output for an evaluation it does not hold",
			do: inEval(fx.evalOther, insertOut, nojob, evilOut), effect: outRecorded},
		{as: "e1", name: "record an output for an evaluation that is not running",
			do: inEval(fx.evalNew, insertOut, nojob, evilOut), effect: outRecorded},
		{as: "e1", name: "add an output to a derivation recorded before its transaction",
			do: inEval(fx.evalOwn, insertOut, a, evilOut), effect: outRecorded},
		{as: "e1", name: "add an input to a derivation recorded before its transaction",
			do:     inEval(fx.evalOwn, `INSERT INTO derivation_inputs (referrer, input_drv, outputs) VALUES ($1, $2, '{out}')`, a, nojob),
			effect: `SELECT EXISTS (SELECT 1 FROM derivation_inputs WHERE referrer = $1 AND input_drv = $2)`, args: []any{a, nojob}},
		{as: "e1", name: "insert a derivation without naming an evaluation", do: insertDrv, effect: drvInserted},
		{as: "e1", name: "queue a job without naming an evaluation",
			do: stmt(insertJob, nojob, fx.project), effect: jobQueued, args: []any{nojob}},
		{as: "e1", name: "queue a job in another project than its evaluation's",
			do: inEval(fx.evalOwn, insertJob, nojob, fx.otherProject), effect: jobQueued, args: []any{nojob}},
		{as: "e1", name: "finish another evaluator's evaluation",
			do:     stmt(`UPDATE evaluations SET status = 'succeeded', finished_at = now() WHERE id = $1`, fx.evalOther),
			effect: `SELECT status = 'succeeded' FROM evaluations WHERE id = $1`, args: []any{fx.evalOther}},
		{as: "e1", name: "edit a queued evaluation",
			do:     stmt(`UPDATE evaluations SET error = 'evil' WHERE id = $1`, fx.evalNew),
			effect: `SELECT error = 'evil' FROM evaluations WHERE id = $1`, args: []any{fx.evalNew}},
		{as: "e1", name: "add attributes to an evaluation it does not hold",
			do:     stmt(`INSERT INTO eval_attrs (eval_id, attr) VALUES ($1, 'evil')`, fx.evalOther),
			effect: `SELECT EXISTS (SELECT 1 FROM eval_attrs WHERE attr = 'evil')`},
		{as: "e1", name: "queue an evaluation",
			do: stmt(`INSERT INTO evaluations (project_id, flake_url, commit_sha, branch)
VALUES ($1, 'git+file:///p', 'evil', 'main')`, fx.project),
			effect: `SELECT EXISTS (SELECT 1 FROM evaluations WHERE commit_sha = 'evil')`},
		{as: "e1", name: "record a signing key", do: insertKey, effect: keyInserted},
		{as: "e1", name: "write a log tail", do: writeTail, effect: tailWritten, args: []any{h}},
		{as: "e1", name: "advertise itself as a signer", do: signerRole("e1"), effect: signerAdvertised, args: []any{"e1"}},

		// A frontend: everything it does through forges, users and maintenance, but no build
		// results, derivations, hashes or keys.
		{as: "f1", name: "insert a derivation", do: insertDrv, effect: drvInserted},
		{as: "f1", name: "mark a job succeeded", do: succeed(d), effect: succeeded, args: []any{d}},
		{as: "f1", name: "record a NAR hash", do: recordHash, effect: hashRecorded},
		{as: "f1", name: "record a signing key", do: insertKey, effect: keyInserted},
		{as: "f1", name: "take the gc lease", do: takeLease("f1", "gc"), effect: leaseTaken, args: []any{"f1", "gc"}},
		{as: "f1", name: "write a log tail", do: writeTail, effect: tailWritten, args: []any{h}},
		{as: "f1", name: "make another node a signer", do: signerRole("b1"), effect: signerAdvertised, args: []any{"b1"}},
		{as: "f1", name: "point the signer's row elsewhere",
			do:     stmt(`UPDATE nodes SET endpoint = 'http://evil:7777' WHERE id = 's1'`),
			effect: `SELECT endpoint = 'http://evil:7777' FROM nodes WHERE id = 's1'`},
		{as: "f1", name: "advertise itself as a signer", do: signerRole("f1"), effect: signerAdvertised, args: []any{"f1"}},
		{as: "f1", name: "claim a job whose inputs are not built for a builder",
			do:     stmt(`UPDATE build_jobs SET status = 'building', claimed_by = 'b1', claimed_at = now(), started_at = now() WHERE id = $1`, c),
			effect: claimedBy, args: []any{c, "b1"}},

		// An evaluator trusts jobs and promotes outputs only in a trusted evaluation's ingest,
		// and trust only grows.
		{as: "e1", name: "trust a job in a pull request's ingest",
			do:     inEval(fx.evalOwnPR, `UPDATE build_jobs SET trusted = true WHERE id = $1`, d),
			effect: `SELECT trusted FROM build_jobs WHERE id = $1`, args: []any{d}},
		{as: "e1", name: "trust a job outside an ingest",
			do:     stmt(`UPDATE build_jobs SET trusted = true WHERE id = $1`, d),
			effect: `SELECT trusted FROM build_jobs WHERE id = $1`, args: []any{d}},
		{as: "e1", name: "distrust a job in a trusted ingest",
			do:     inEval(fx.evalOwn, `UPDATE build_jobs SET trusted = false WHERE id = $1`, c),
			effect: `SELECT NOT trusted FROM build_jobs WHERE id = $1`, args: []any{c}},
		{as: "e1", name: "reset a building job in a trusted ingest",
			do:     inEval(fx.evalOwn, `UPDATE build_jobs SET status = 'pending', claimed_by = NULL, trusted = true WHERE id = $1`, h),
			effect: `SELECT status = 'pending' FROM build_jobs WHERE id = $1`, args: []any{h}},
		{as: "e1", name: "queue a trusted job in a pull request's ingest",
			do: inEval(fx.evalOwnPR, `INSERT INTO build_jobs (drv_path, project_id, system, trusted) VALUES ($1, $2, $3, true)`,
				nojob, fx.project, system),
			effect: `SELECT EXISTS (SELECT 1 FROM build_jobs WHERE drv_path = $1 AND trusted)`, args: []any{nojob}},
		{as: "e1", name: "rebuild a quarantined output in the ingest of a project that promotes",
			do: inEval(fx.evalOwn, `UPDATE build_jobs SET status = 'pending', finished_at = NULL, trusted = true WHERE id = $1`,
				fx.job["built"]),
			effect: `SELECT status = 'pending' FROM build_jobs WHERE id = $1`, args: []any{fx.job["built"]}},
		{as: "e1", name: "rebuild a quarantined output in a pull request's ingest",
			do: inEval(fx.evalOwnPR, `UPDATE build_jobs SET status = 'pending', finished_at = NULL, trusted = true WHERE id = $1`,
				fx.job["built"]),
			effect: `SELECT status = 'pending' FROM build_jobs WHERE id = $1`, args: []any{fx.job["built"]}},
		{as: "e1", name: "promote an output in a pull request's ingest",
			do:     inEval(fx.evalOwnPR, `UPDATE derivation_outputs SET quarantined = false WHERE drv_path = $1`, a),
			effect: `SELECT NOT quarantined FROM derivation_outputs WHERE drv_path = $1`, args: []any{a}},
		{as: "e1", name: "record a NAR hash in a trusted ingest",
			do:     inEval(fx.evalOwn, `UPDATE derivation_outputs SET nar_hash = 'sha256:evil' WHERE drv_path = $1`, a),
			effect: hashRecorded},

		// A signer: results, hashes, keys and the GC, not claims or maintenance.
		{as: "s1", name: "take the maintenance lease", do: takeLease("s1", "maintenance"), effect: leaseTaken, args: []any{"s1", "maintenance"}},
		{as: "s1", name: "delete a job that is building", do: stmt(`DELETE FROM build_jobs WHERE id = $1`, h),
			effect: `SELECT NOT EXISTS (SELECT 1 FROM build_jobs WHERE id = $1)`, args: []any{h}},
		{as: "s1", name: "claim a build job",
			do:     stmt(`UPDATE build_jobs SET status = 'building', claimed_by = 's1' WHERE id = $1`, d),
			effect: `SELECT claimed_by = 's1' FROM build_jobs WHERE id = $1`, args: []any{d}},
		{as: "s1", name: "insert a derivation", do: insertDrv, effect: drvInserted},
		{as: "s1", name: "write a log tail", do: writeTail, effect: tailWritten, args: []any{h}},

		// A cache: reads.
		{as: "c1", name: "record a signing key", do: insertKey, effect: keyInserted},
		{as: "c1", name: "record a NAR hash", do: recordHash, effect: hashRecorded},
		{as: "c1", name: "mark a job succeeded", do: succeed(d), effect: succeeded, args: []any{d}},
		{as: "c1", name: "advertise itself as a signer", do: signerRole("c1"), effect: signerAdvertised, args: []any{"c1"}},
	}
}

// TestRolesRefuse runs every attack twice, each in a transaction rolled back afterwards: as the
// schema owner, where it must work (so the case tests something: this is every node's power
// without the roles), then as the node's own role, where PostgreSQL must refuse it with a
// permission error or, where row-level security hides the row, change nothing.
func TestRolesRefuse(t *testing.T) {
	c := setup(t)
	fx := newFixture(t, c)
	for _, a := range attacks(fx) {
		t.Run(a.as+"/"+a.name, func(t *testing.T) {
			ctx := testCtx(t)
			worked, err := try(ctx, c.owner, a)
			if err != nil || !worked {
				t.Fatalf("as the owner the attack should work: worked=%v err=%v", worked, err)
			}
			worked, err = try(ctx, c.as[a.as], a)
			switch {
			case err != nil && !refused(err):
				t.Fatalf("as %s: failed, but not with a permission error: %v", a.as, err)
			case err == nil && worked:
				t.Fatalf("as %s: the attack worked", a.as)
			}
		})
	}
}

// try runs the attack in a transaction that it rolls back and reports whether it had its
// effect.
func try(ctx context.Context, pool *pgxpool.Pool, a attack) (worked bool, err error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := a.do(ctx, tx); err != nil {
		return false, err
	}
	err = tx.QueryRow(ctx, a.effect, a.args...).Scan(&worked)
	return worked, err
}
