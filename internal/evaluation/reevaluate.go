package evaluation

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// ErrNotFinished is returned when re-evaluating an evaluation that is still queued or running:
// there is nothing to run again.
var ErrNotFinished = errors.New("evaluation not finished yet")

// Reevaluate runs a finished evaluation (succeeded, failed, cancelled or skipped) again: for
// an evaluation that failed for a reason outside the project (Nix missing, a crash, a timeout,
// a cancel). In one transaction the row goes back to queued under the same id, its claim,
// times, error and reuse cleared; it is rolled back as a failed evaluation is (its attributes
// deleted, the pending jobs only it needed cancelled, to come back when it is ingested again);
// it supersedes the older unfinished evaluations of its branch as a new request would; and
// the evaluators are notified. A queued or running evaluation is refused with ErrNotFinished.
func Reevaluate(ctx context.Context, pool *pgxpool.Pool, id int64) (Evaluation, error) {
	err := retryConflicts(ctx, func() error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return reevaluate(ctx, tx, id) })
	})
	if err != nil {
		return Evaluation{}, fmt.Errorf("re-evaluate evaluation %d: %w", id, err)
	}
	e, err := Get(ctx, pool, id)
	if err != nil {
		return Evaluation{}, fmt.Errorf("re-evaluate evaluation %d: %w", id, err)
	}
	return e, nil
}

// reevaluate takes its locks in the order a request or a cancel does: the evaluation's row, the
// rows it supersedes, then the job-need lock (in Rollback).
func reevaluate(ctx context.Context, tx pgx.Tx, id int64) error {
	var projectID int64
	var branch string
	err := tx.QueryRow(ctx, sqlReevaluate, id).Scan(&projectID, &branch)
	if errors.Is(err, pgx.ErrNoRows) {
		cur, err := Get(ctx, tx, id)
		if errors.Is(err, ErrNotFound) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("%w: it is %s", ErrNotFinished, cur.Status)
	}
	if err != nil {
		return err
	}
	old, err := supersede(ctx, tx, projectID, branch, id)
	if err != nil {
		return err
	}
	if err := Rollback(ctx, tx, append(old, id)); err != nil {
		return err
	}
	return Notify(ctx, tx, id, status.EvalQueued)
}
