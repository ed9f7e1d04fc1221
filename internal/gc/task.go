package gc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// WakeChannel is notified when an operator asks for a collection now.
const WakeChannel = "gc_request"

// checkInterval is how often the GC leader asks whether a collection is due: a new leader does
// not collect at once when the last collection is recent, so restarts do not repeat it.
const checkInterval = 10 * time.Minute

// Task is the GC leader's periodic work: collect when none succeeded within interval, or when
// an operator asked (harmonia-ci gc); wake, if not nil, delivers those requests at once.
func Task(c *Collector, pool *pgxpool.Pool, interval time.Duration, wake <-chan notify.Notification) cluster.Task {
	return cluster.Task{
		Name:     "gc",
		Interval: min(interval, checkInterval),
		Wake:     wake,
		Long: func(ctx context.Context, term *cluster.Term) (int64, error) {
			var due bool
			if err := pool.QueryRow(ctx, sqlDue, seconds(interval)).Scan(&due); err != nil {
				return 0, fmt.Errorf("is a collection due: %w", err)
			}
			if !due {
				return 0, nil
			}
			rep, err := c.Run(ctx, RunOptions{
				Fence: func(ctx context.Context, fn func(pgx.Tx) error) error {
					return term.RunFenced(ctx, pool, fn)
				},
				Valid: term.Valid, NodeID: term.NodeID, Epoch: term.Epoch,
			})
			if err != nil {
				return 0, err
			}
			return rep.Rows() + rep.Objects().Objects, nil
		},
	}
}

// ErrNoLeader is returned by Request when no node leads the GC role.
var ErrNoLeader = errors.New("no node leads garbage collection (it runs on a node with the signer role)")

// Request asks the GC leader to collect now and waits for that collection to finish; it
// returns the run's row as a report.
func Request(ctx context.Context, pool *pgxpool.Pool, poll time.Duration) (*Report, error) {
	var leader string
	err := pool.QueryRow(ctx, sqlLeaderValid, cluster.RoleGC).Scan(&leader)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNoLeader
	}
	if err != nil {
		return nil, fmt.Errorf("find the gc leader: %w", err)
	}
	var at time.Time
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, sqlRequest).Scan(&at); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sqlNotifyWake)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("request a collection: %w", err)
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		var (
			id      int64
			st      status.GCRunStatus
			errMsg  string
			rep     Report
			deleted Count
		)
		err := pool.QueryRow(ctx, sqlRunSince, at).Scan(&id, &st, &errMsg, &rep.Evaluations, &rep.Jobs,
			&rep.Derivations, &rep.LogsExpired, &rep.Deliveries, &rep.Scanned, &deleted.Objects, &deleted.Bytes)
		switch {
		case errors.Is(err, pgx.ErrNoRows), err == nil && st == status.GCRunning:
		case err != nil:
			return nil, fmt.Errorf("wait for the collection: %w", err)
		case st == status.GCFailed:
			return nil, fmt.Errorf("collection %d failed: %s", id, errMsg)
		default:
			rep.Deleted = map[string]Count{"all": deleted}
			return &rep, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}
