package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// MaxInterested bounds the evaluations InterestedEvals lists: a job that more evaluations
// need is shared by definition.
const MaxInterested = 1000

// ErrNotInterested means none of the evaluations a cancel was asked for still needs the job,
// and others do: there is nothing the caller may cancel.
var ErrNotInterested = errors.New("none of these evaluations needs the job")

// InterestedEvals lists the live evaluations interested in job jobID: those with an attribute,
// not detached, whose derivation is the job's or depends on it. truncated says there were more
// than MaxInterested.
func InterestedEvals(ctx context.Context, q db.DBTX, jobID int64) (ids []int64, truncated bool, err error) {
	rows, err := q.Query(ctx, sqlInterestedEvals, jobID, MaxInterested+1)
	if err != nil {
		return nil, false, fmt.Errorf("evaluations interested in job %d: %w", jobID, err)
	}
	ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, false, fmt.Errorf("evaluations interested in job %d: %w", jobID, err)
	}
	if len(ids) > MaxInterested {
		return ids[:MaxInterested], true, nil
	}
	return ids, false, nil
}

// CancelResult says what CancelFor did.
type CancelResult struct {
	// Cancelled: no evaluation but evals needed the job, so it was cancelled (as Cancel does).
	Cancelled bool
	// Detached lists the evaluations of evals that gave up the job while others still need
	// it: their attributes that need it are detached, and the job goes on.
	Detached []int64
}

// CancelFor cancels job jobID on behalf of evaluations evals (those the user may act on). If
// every live evaluation interested in the job is one of evals (or none is), the job is
// cancelled for everyone, its pending dependents dep-failed; otherwise only evals' interest in
// it is withdrawn and it goes on for the others. The decision and the write share one
// transaction under the job-need lock, so an evaluation that becomes interested meanwhile is
// never cancelled under. It returns ErrStale if the job has finished, ErrNotInterested if it is
// needed only by evaluations not in evals.
func CancelFor(ctx context.Context, pool *pgxpool.Pool, jobID int64, evals []int64) (CancelResult, error) {
	var res CancelResult
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlNeedLock, db.LockClass, db.LockJobNeed); err != nil {
			return fmt.Errorf("take job-need lock: %w", err)
		}
		var drv string
		err := tx.QueryRow(ctx, sqlJobLockForCancel, jobID).Scan(&drv)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrStale
		}
		if err != nil {
			return err
		}
		interested, truncated, err := InterestedEvals(ctx, tx, jobID)
		if err != nil {
			return err
		}
		others := slices.ContainsFunc(interested, func(id int64) bool { return !slices.Contains(evals, id) })
		if !others && !truncated {
			var id int64
			err := tx.QueryRow(ctx, sqlJobCancel, jobID).Scan(&id, &drv)
			if errors.Is(err, pgx.ErrNoRows) {
				return ErrStale
			}
			if err != nil {
				return err
			}
			if err := notifyJobs(ctx, tx, map[string]string{"drv_path": drv, "status": string(status.JobCancelled)}); err != nil {
				return err
			}
			res.Cancelled = true
			_, err = propagateFailure(ctx, tx, []int64{id})
			return err
		}
		rows, err := tx.Query(ctx, sqlDetachInterest, jobID, evals)
		if err != nil {
			return fmt.Errorf("detach interest: %w", err)
		}
		detached, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return fmt.Errorf("detach interest: %w", err)
		}
		slices.Sort(detached)
		res.Detached = slices.Compact(detached)
		if len(res.Detached) == 0 {
			return ErrNotInterested
		}
		return nil
	})
	if err != nil {
		return CancelResult{}, fmt.Errorf("cancel job %d: %w", jobID, err)
	}
	return res, nil
}
