package evaluation

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// ErrFinished is returned when cancelling an evaluation that has already finished.
var ErrFinished = errors.New("evaluation already finished")

// Cancel stops an evaluation: queued or running → cancelled and rolled back (its attributes
// deleted, the pending jobs no other live evaluation needs cancelled). A running evaluator notices within a second and kills Nix.
func Cancel(ctx context.Context, pool *pgxpool.Pool, id int64, reason string) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var got int64
		err := tx.QueryRow(ctx, sqlCancelEval, id, reason).Scan(&got)
		if errors.Is(err, pgx.ErrNoRows) {
			if _, err := Get(ctx, tx, id); err != nil {
				return err
			}
			return ErrFinished
		}
		if err != nil {
			return err
		}
		if err := Rollback(ctx, tx, []int64{id}); err != nil {
			return err
		}
		return Notify(ctx, tx, id, status.EvalCancelled)
	})
	if err != nil {
		return fmt.Errorf("cancel evaluation %d: %w", id, err)
	}
	return nil
}

// Rollback cancels the jobs only evaluations ids needed and deletes their attributes.
func Rollback(ctx context.Context, tx pgx.Tx, ids []int64) error {
	if err := cancelUnneeded(ctx, tx, ids); err != nil {
		return err
	}
	return ClearAttrs(ctx, tx, ids...)
}

// ClearAttrs deletes the attributes of evaluations ids: those of a rolled-back evaluation, or
// of an earlier attempt at one that is claimed again.
func ClearAttrs(ctx context.Context, q db.DBTX, ids ...int64) error {
	if _, err := q.Exec(ctx, sqlDeleteAttrs, ids); err != nil {
		return fmt.Errorf("delete attributes: %w", err)
	}
	return nil
}

// LockJobNeed takes the job-need lock for the rest of tx: cancelling, superseding and failing
// evaluations, and ingesting attributes, hold it, so a job is never cancelled as unneeded
// while an evaluation that needs it commits its attributes. An ingest takes it before the
// enqueue lock, as cancelUnneeded does.
func LockJobNeed(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, sqlNeedLock, db.LockClass, db.LockJobNeed); err != nil {
		return fmt.Errorf("take job-need lock: %w", err)
	}
	return nil
}

// cancelUnneeded cancels the pending jobs of evaluations ids that no live evaluation needs.
func cancelUnneeded(ctx context.Context, tx pgx.Tx, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	if err := LockJobNeed(ctx, tx); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, sqlCancelUnneeded, ids)
	if err != nil {
		return fmt.Errorf("cancel unneeded jobs: %w", err)
	}
	drvs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("cancel unneeded jobs: %w", err)
	}
	for _, d := range drvs {
		if err := queue.NotifyJobs(ctx, tx, map[string]string{"drv_path": d, "status": string(status.JobCancelled)}); err != nil {
			return err
		}
	}
	return nil
}
