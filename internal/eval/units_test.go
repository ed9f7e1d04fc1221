package eval

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	qt "github.com/harmonia-ci/harmonia-ci/internal/queuetest"
)

// The units of an evaluation are claimed and finished like build jobs: a claim raises the
// attempt, a dead node's unit is put back by the reaper and claimed again by another with what
// the first committed as its skip set, the dead node's stale attempt can neither commit
// attributes of it nor mark it done, and the claimant waits until the last unit is done.
func TestUnitClaimFencing(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := dbtest.NewPool(t)
	project := qt.NewProject(t, pool, "demo", 100)
	for _, n := range []struct {
		id   string
		seen string
	}{{"owner", "0"}, {"live", "0"}, {"dead", "1 hour"}} {
		qt.Exec(t, pool, `INSERT INTO nodes (id, roles, endpoint, incarnation, last_seen)
VALUES ($1, '{evaluator}', 'http://127.0.0.1:1', gen_random_uuid(), now() - $2::interval)`, n.id, n.seen)
	}
	var evalID int64
	if err := pool.QueryRow(ctx, `INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status, claimed_by, attempt)
VALUES ($1, 'git+file:///demo', 'c', 'main', 'running', 'owner', 1) RETURNING id`, project).Scan(&evalID); err != nil {
		t.Fatal(err)
	}
	shared := func(node string) *sharedUnits {
		return &sharedUnits{pool: pool, node: node, evalID: evalID, evalAttempt: 1, owner: node == "owner"}
	}
	owner, dead, live := shared("owner"), shared("dead"), shared("live")
	if err := dead.insert(ctx, nil, "big", false, []unit{{Path: []string{"big"}, Force: 1, Names: []string{"a"}}}); !errors.Is(err, errStale) {
		t.Fatalf("a node that does not hold the evaluation queued root units: %v", err)
	}
	if err := owner.insert(ctx, nil, "big", false, []unit{
		{Path: []string{"big"}, Force: 1, Names: []string{"a", "b"}},
		{Path: []string{"big"}, Force: 1, Names: []string{"c"}},
	}); err != nil {
		t.Fatal(err)
	}
	first, ok, err := dead.claim(ctx)
	if err != nil || !ok || first.attempt != 1 || !slices.Equal(first.Names, []string{"a", "b"}) {
		t.Fatalf("first claim: %+v %v %v", first, ok, err)
	}
	// Before it dies, the node commits one attribute of it and splits a set off it.
	commit := func(node string, a Attr) error {
		in := &ingester{pool: pool, evalID: evalID, node: node, attempt: 1, helper: node != "owner"}
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := in.holdClaim(ctx, tx); err != nil {
				return err
			}
			if _, err := in.holdUnits(ctx, tx, []Attr{a}, true); err != nil {
				return err
			}
			if a.Name == "" {
				return nil
			}
			_, err := tx.Exec(ctx, sqlInsertAttrs, evalID, []string{a.Name}, []string{""}, []string{"e"}, []int64{a.unit})
			return err
		})
	}
	if err := commit("dead", Attr{Name: "big.a", unit: first.id, unitAttempt: first.attempt}); err != nil {
		t.Fatal(err)
	}
	if err := dead.insert(ctx, &first, "big.b", false, []unit{{Path: []string{"big", "b"}, Force: 0, Names: []string{"x"}}}); err != nil {
		t.Fatal(err)
	}
	open, err := owner.open(ctx)
	if err != nil || !open {
		t.Fatalf("open with units queued and walked elsewhere: %v %v", open, err)
	}

	// The reaper puts the dead node's unit back.
	reap := queue.MaintenanceTasks(queue.MaintenanceConfig{DeadThreshold: time.Minute}, slog.New(slog.DiscardHandler))[0]
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := reap.Run(ctx, tx); return err }); err != nil {
		t.Fatal(err)
	}
	var st string
	if err := pool.QueryRow(ctx, `SELECT status FROM eval_units WHERE id = $1`, first.id).Scan(&st); err != nil || st != "queued" {
		t.Fatalf("the dead node's unit is %q after the reaper (%v), want queued", st, err)
	}
	again, ok, err := live.claim(ctx)
	if err != nil || !ok || again.id != first.id || again.attempt != 2 {
		t.Fatalf("reclaim: %+v %v %v", again, ok, err)
	}
	if want := []string{"big.a", "big.b"}; !slices.Equal(slices.Sorted(slices.Values(again.skip)), want) {
		t.Errorf("reclaimed unit skips %q, want %q (committed, and handed on)", again.skip, want)
	}
	// The dead node's attempt is stale: it commits nothing of the unit and cannot mark it done.
	if err := commit("dead", Attr{Name: "big.stale", unit: first.id, unitAttempt: first.attempt}); !errors.Is(err, errStale) {
		t.Errorf("a stale attempt committed an attribute: %v", err)
	}
	if err := commit("dead", Attr{unit: first.id, unitAttempt: first.attempt, unitDone: true}); !errors.Is(err, errStale) {
		t.Errorf("a stale attempt marked the unit done: %v", err)
	}
	if err := dead.insert(ctx, &first, "big.a2", false, []unit{{Path: []string{"big"}, Names: []string{"y"}}}); !errors.Is(err, errStale) {
		t.Errorf("a stale attempt queued units: %v", err)
	}
	// The new claim's attempt marks it done; the owner then walks the rest and may finish.
	if err := commit("live", Attr{unit: again.id, unitAttempt: again.attempt, unitDone: true}); err != nil {
		t.Fatal(err)
	}
	for {
		u, ok, err := owner.claim(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		if err := commit("owner", Attr{unit: u.id, unitAttempt: u.attempt, unitDone: true}); err != nil {
			t.Fatal(err)
		}
	}
	if open, err := owner.open(ctx); err != nil || open {
		t.Errorf("open after every unit is done: %v %v", open, err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM eval_attrs WHERE eval_id = $1`, evalID).Scan(&n); err != nil || n != 1 {
		t.Errorf("%d attributes (%v), want big.a alone", n, err)
	}
}
