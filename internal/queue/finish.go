package queue

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// FailKind classifies a failure: transient ones are retried, permanent ones wait for a
// manual rebuild.
type FailKind int

const (
	// Transient failures (OOM, disk full, substitution timeout) go back to the queue with
	// retry_count + 1, and fail for good after 3 retries.
	Transient FailKind = iota
	// Permanent failures (the build itself failed) fail the job until a manual rebuild, or
	// an evaluation that needs it past its failure expiry; unless the job's retry policy has
	// retries left: then it goes back to the queue after its backoff.
	Permanent
)

// Outcome is what became of a finished attempt.
type Outcome struct {
	Status    status.JobStatus // the job's status afterwards
	ProjectID *int64           // the project to charge, if any
	Seconds   float64          // builder time the attempt took
	DrvPath   string           // the job's derivation
	DepFailed int              // dependents marked dep-failed because of it
	// Flaky: a success after an earlier build failure of the job (see JobInfo.Flaky).
	Flaky bool
}

// Succeed marks a claimed job succeeded. The caller announces it (wakes workers, whose
// dependents may be ready now, and tells the frontend) with an Announcer, and charges
// Outcome.Seconds to the project with a Charger; a Worker does both. A claim that no longer
// holds returns ErrStale.
func Succeed(ctx context.Context, q db.DBTX, c Claim) (Outcome, error) {
	out := Outcome{Status: status.JobSucceeded}
	rows, err := q.Query(ctx, sqlJobSucceed, c.JobID, c.NodeID, c.Attempt, nil, db.LockClass, db.LockEnqueue)
	if err == nil {
		var found bool
		for rows.Next() {
			found = true
			err = rows.Scan(&out.ProjectID, &out.Seconds, &out.DrvPath, &out.Flaky)
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
		if err == nil && !found {
			err = ErrStale
		}
	}
	if err != nil {
		return Outcome{}, fmt.Errorf("succeed %s: %w", c, err)
	}
	return out, nil
}

// QueueSucceed queues on b what Succeed does, recording logKey (unless "") as the job's log,
// so that a caller sends it with other statements in one round trip (a batch runs in one
// implicit transaction). Once the batch is closed, out holds the outcome; a claim that no
// longer held makes Close return an error wrapping ErrStale.
func QueueSucceed(b *pgx.Batch, c Claim, logKey string, out *Outcome) {
	var key *string
	if logKey != "" {
		key = &logKey
	}
	b.Queue(sqlJobSucceed, c.JobID, c.NodeID, c.Attempt, key, db.LockClass, db.LockEnqueue).QueryRow(func(row pgx.Row) error {
		*out = Outcome{Status: status.JobSucceeded}
		err := row.Scan(&out.ProjectID, &out.Seconds, &out.DrvPath, &out.Flaky)
		if errors.Is(err, pgx.ErrNoRows) {
			err = ErrStale
		}
		if err != nil {
			return fmt.Errorf("succeed %s: %w", c, err)
		}
		return nil
	})
}

// MarkUploading moves a claimed job from building to uploading (outputs are being published).
func MarkUploading(ctx context.Context, pool *pgxpool.Pool, c Claim) error {
	tag, err := pool.Exec(ctx, sqlJobUploading, c.JobID, c.NodeID, c.Attempt)
	if err != nil {
		return fmt.Errorf("mark %s uploading: %w", c, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("mark %s uploading: %w", c, ErrStale)
	}
	return nil
}

// Failure is why an attempt failed.
type Failure struct {
	Kind     FailKind
	ExitCode *int   // the build's exit status, if it had one
	Message  string // for users: "build timed out after 4h0m0s", Nix's error; "" for none
	LogKey   string // the uploaded log's blob key (log/<drv>), "" for none
}

// Fail records a failed attempt. A transient failure returns the job to the queue until its
// retries run out; a permanent one (or the last transient one) fails it and marks every pending
// job above it dep-failed. As with Succeed, the caller charges the time.
func Fail(ctx context.Context, pool *pgxpool.Pool, c Claim, f Failure) (Outcome, error) {
	sql := sqlJobFailTransient
	if f.Kind == Permanent {
		sql = sqlJobFailPermanent
	}
	msg, logKey := nullable(f.Message), nullable(f.LogKey)
	var out Outcome
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var drv, system string
		err := tx.QueryRow(ctx, sql, c.JobID, c.NodeID, c.Attempt, f.ExitCode, msg, logKey).Scan(&out.Status, &out.ProjectID, &out.Seconds, &drv, &system)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrStale
		}
		if err != nil {
			return err
		}
		if out.Status == status.JobPending {
			return notifyJobs(ctx, tx, map[string]string{"system": system})
		}
		if err := notifyJobs(ctx, tx, map[string]string{"drv_path": drv, "status": string(out.Status)}); err != nil {
			return err
		}
		out.DepFailed, err = propagateFailure(ctx, tx, []int64{c.JobID})
		return err
	})
	if err != nil {
		return Outcome{}, fmt.Errorf("fail %s: %w", c, err)
	}
	return out, nil
}

// Release gives a claim back unfinished, without counting a retry (a draining node that runs
// out of time). Workers are woken to pick it up.
func Release(ctx context.Context, pool *pgxpool.Pool, c Claim) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var system string
		err := tx.QueryRow(ctx, sqlJobRelease, c.JobID, c.NodeID, c.Attempt).Scan(&system)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrStale
		}
		if err != nil {
			return err
		}
		return notifyJobs(ctx, tx, map[string]string{"system": system})
	})
	if err != nil {
		return fmt.Errorf("release %s: %w", c, err)
	}
	return nil
}

// Cancel cancels a pending or running job on a user's behalf; a builder running it finds its
// claim gone. Its pending dependents become dep-failed (a rebuild restores them). It returns
// ErrStale if the job is already finished.
func Cancel(ctx context.Context, pool *pgxpool.Pool, jobID int64) error {
	return cancel(ctx, pool, sqlJobCancel, fmt.Sprintf("job %d", jobID), jobID)
}

func cancel(ctx context.Context, pool *pgxpool.Pool, sql, what string, args ...any) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var id int64
		var drv string
		err := tx.QueryRow(ctx, sql, args...).Scan(&id, &drv)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrStale
		}
		if err != nil {
			return err
		}
		if err := notifyJobs(ctx, tx, map[string]string{"drv_path": drv, "status": string(status.JobCancelled)}); err != nil {
			return err
		}
		_, err = propagateFailure(ctx, tx, []int64{id})
		return err
	})
	if err != nil {
		return fmt.Errorf("cancel %s: %w", what, err)
	}
	return nil
}

// Priorities of rebuilt jobs. A boost puts a job ahead of every project's fair share, so only an
// admin (the admin token, an [auth] admin, the CLI on the database) may ask for one; everyone
// else's rebuild gets the priority every job is queued with.
const (
	PriorityNormal = 0
	PriorityBoost  = 100
)

// Rebuild resets a failed (or dep-failed, or cancelled) job to pending at priority (PriorityNormal
// or PriorityBoost) with fresh retries, and its dep-failed dependents to pending; readiness keeps
// them waiting for their inputs. It returns how many jobs were reset; 0 means the job was not in a
// failed state.
func Rebuild(ctx context.Context, pool *pgxpool.Pool, jobID int64, priority int) (int, error) {
	var n int
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var systems []string
		if err := tx.QueryRow(ctx, sqlRebuild, jobID, priority).Scan(&n, &systems); err != nil {
			return err
		}
		for _, s := range systems {
			if err := notifyJobs(ctx, tx, map[string]string{"system": s}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("rebuild job %d: %w", jobID, err)
	}
	return n, nil
}

// propagateFailure marks every pending job above the failed ones dep-failed (with a
// notification each) and returns how many.
func propagateFailure(ctx context.Context, tx pgx.Tx, failed []int64) (int, error) {
	if len(failed) == 0 {
		return 0, nil
	}
	var n int
	if err := tx.QueryRow(ctx, sqlPropagateFailure, failed).Scan(&n); err != nil {
		return 0, fmt.Errorf("propagate failure: %w", err)
	}
	return n, nil
}

// nullable maps "" to SQL NULL.
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
