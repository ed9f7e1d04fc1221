package eval

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// sharedUnits is an evaluation's table of units (eval_units) as one node's walkPool sees it:
// the units its walkers split off go there, and its idle workers claim the next queued one,
// whoever split it. The units a node's roots are, and nothing else, stay in its own queue.
type sharedUnits struct {
	pool        *pgxpool.Pool
	node        string
	evalID      int64
	evalAttempt int
	// owner: the evaluation's claimant, whose walk ends only once no other node walks a unit of
	// it (it finishes the evaluation). A helper's walk ends when it finds nothing to claim.
	owner bool
	// first is the unit a helper's claim took before its view was ready; the first worker to
	// claim takes it.
	first atomic.Pointer[unit]
	// poll is how often an idle worker looks for units again.
	poll time.Duration
}

// unitPollInterval: an idle worker of an evaluation whose units other nodes walk looks again
// this often (a unit takes seconds).
const unitPollInterval = 200 * time.Millisecond

// insert writes units handed on by the walker of parent (nil: of the evaluation's roots) in one
// statement: handed is the attribute they come from, which a reclaimed parent skips.
func (s *sharedUnits) insert(ctx context.Context, parent *unit, handed string, retry bool, units []unit) error {
	names := make([][]string, len(units))
	for i, u := range units {
		names[i] = u.Names
	}
	js, err := json.Marshal(names)
	if err != nil {
		return fmt.Errorf("queue units: %w", err)
	}
	var parentID int64
	var parentAttempt int
	if parent != nil {
		parentID, parentAttempt = parent.id, parent.attempt
	}
	tag, err := s.pool.Exec(ctx, sqlInsertUnits, s.evalID, s.evalAttempt, parentID, handed, units[0].Path,
		units[0].Force, string(js), retry, s.node, parentAttempt)
	if err != nil {
		return fmt.Errorf("queue units: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return errStale
	}
	return nil
}

// claim takes the next queued unit of the evaluation; false when none is queued.
func (s *sharedUnits) claim(ctx context.Context) (unit, bool, error) {
	if u := s.first.Swap(nil); u != nil {
		return *u, true, nil
	}
	u, err := scanUnit(s.pool.QueryRow(ctx, sqlClaimUnitOf, s.node, s.evalID, s.evalAttempt))
	if errors.Is(err, pgx.ErrNoRows) {
		return unit{}, false, nil
	}
	if err != nil {
		return unit{}, false, fmt.Errorf("claim unit: %w", err)
	}
	if err := u.readSkip(ctx, s.pool); err != nil {
		return unit{}, false, err
	}
	return u, true, nil
}

// open reports whether the claimant must wait on: units queued, or walked by other nodes.
func (s *sharedUnits) open(ctx context.Context) (bool, error) {
	var open bool
	if err := s.pool.QueryRow(ctx, sqlUnitsOpen, s.evalID, s.evalAttempt, s.node).Scan(&open); err != nil {
		return false, fmt.Errorf("look for open units: %w", err)
	}
	return open, nil
}

// scanUnit reads a claimed unit (sqlClaimUnitOf, sqlClaimUnitToHelp).
func scanUnit(row pgx.Row) (unit, error) {
	var u unit
	err := row.Scan(&u.id, &u.attempt, &u.evalID, &u.evalAttempt, &u.Path, &u.Force, &u.Names, &u.alone)
	if len(u.Names) == 0 {
		u.Names = nil
	}
	return u, err
}

// readSkip gives a reclaimed unit what its earlier attempts committed and handed on: its
// walker skips them, so no attribute is reported twice and no unit queued twice.
func (u *unit) readSkip(ctx context.Context, db *pgxpool.Pool) error {
	if u.attempt <= 1 {
		return nil
	}
	rows, err := db.Query(ctx, sqlUnitSkip, u.id)
	if err != nil {
		return fmt.Errorf("read what unit %d walked: %w", u.id, err)
	}
	if u.skip, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return fmt.Errorf("read what unit %d walked: %w", u.id, err)
	}
	return nil
}
