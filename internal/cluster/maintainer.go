package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
)

// Task is one piece of leader-only housekeeping.
type Task struct {
	// Name identifies the task in logs and maintenance_runs.
	Name string
	// Interval between runs; the first run is right after election.
	Interval time.Duration
	// Run does the work inside the fenced transaction and reports how many rows it changed.
	Run func(ctx context.Context, tx pgx.Tx) (affected int64, err error)
	// Prepare, if set, runs first, outside any transaction, for the work no transaction may
	// stay open across (calls to a forge); it returns the write Run would do, which then runs
	// fenced in place of Run. A nil write skips the fenced part.
	Prepare func(ctx context.Context) (write func(ctx context.Context, tx pgx.Tx) (int64, error), err error)
	// Long, if set, replaces Run and Prepare for work that is long and mixes database writes
	// with network calls (the garbage collector): it runs outside any transaction and opens
	// its own short fenced transactions with term.RunFenced.
	Long func(ctx context.Context, term *Term) (affected int64, err error)
	// Wake, if set, starts a run before the interval is up (an operator's "run now").
	Wake <-chan notify.Notification
}

// Maintainer runs leader-only tasks while its node leads a role. Each run is one fenced
// transaction that also records itself in maintenance_runs, so a run either happens under a
// valid epoch, visibly, or not at all.
type Maintainer struct {
	pool   *pgxpool.Pool
	tasks  []Task
	logger *slog.Logger
	clock  clock.Clock
}

// NewMaintainer builds a maintainer for tasks.
func NewMaintainer(pool *pgxpool.Pool, tasks []Task, logger *slog.Logger, clk clock.Clock) *Maintainer {
	return &Maintainer{pool: pool, tasks: tasks, logger: logger.With("service", "maintenance"), clock: clk}
}

// Lead is an ElectorConfig.LeaderFunc: it runs every task on its interval until the term ends.
func (m *Maintainer) Lead(ctx context.Context, term *Term) {
	var wg sync.WaitGroup
	for _, task := range m.tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if err := m.RunOnce(ctx, term, task); err != nil {
					if errors.Is(err, ErrNotLeader) {
						m.logger.Warn("leader-only write refused; stepping down", "task", task.Name, "epoch", term.Epoch)
						return
					}
					if ctx.Err() == nil {
						m.logger.Error("maintenance task failed", "task", task.Name, "error", err)
					}
				}
				select {
				case <-ctx.Done():
					return
				case <-m.clock.After(task.Interval):
				case <-task.Wake:
				}
			}
		}()
	}
	wg.Wait()
}

// RunOnce runs task once under term's fence.
func (m *Maintainer) RunOnce(ctx context.Context, term *Term, task Task) error {
	var affected int64
	run := task.Run
	if task.Long != nil {
		n, err := task.Long(ctx, term)
		if err != nil {
			return fmt.Errorf("maintenance %s: %w", task.Name, err)
		}
		run = func(context.Context, pgx.Tx) (int64, error) { return n, nil }
	} else if task.Prepare != nil {
		write, err := task.Prepare(ctx)
		if err != nil {
			return fmt.Errorf("maintenance %s: %w", task.Name, err)
		}
		if write == nil {
			return nil
		}
		run = write
	}
	err := term.RunFenced(ctx, m.pool, func(tx pgx.Tx) error {
		var err error
		if affected, err = run(ctx, tx); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, sqlMaintenanceRecord, term.Role, task.Name, term.NodeID, term.Epoch, affected)
		return err
	})
	if err != nil {
		return fmt.Errorf("maintenance %s: %w", task.Name, err)
	}
	if affected > 0 {
		m.logger.Info("maintenance task changed rows", "task", task.Name, "affected", affected)
	}
	return nil
}

// NodeTasksConfig configures the membership housekeeping.
type NodeTasksConfig struct {
	// Interval between runs. Default 30s (the heartbeat interval).
	Interval time.Duration
	// DeadThreshold: a node silent this long is dead. Default DefaultDeadThreshold.
	DeadThreshold time.Duration
	// DeadRetention: a dead node's row is deleted this long after its last beat, once nothing
	// is claimed in its name any more. Default 24h.
	DeadRetention time.Duration
	// RunsRetention: maintenance_runs rows older than this are pruned. Default 24h.
	RunsRetention time.Duration
}

// NodeTasks returns the leader-only membership tasks: mark silent nodes dead, delete old dead
// rows, prune the maintenance log.
func NodeTasks(cfg NodeTasksConfig, logger *slog.Logger) []Task {
	cfg.Interval = cmpOr(cfg.Interval, 30*time.Second)
	cfg.DeadThreshold = cmpOr(cfg.DeadThreshold, DefaultDeadThreshold)
	cfg.DeadRetention = cmpOr(cfg.DeadRetention, 24*time.Hour)
	cfg.RunsRetention = cmpOr(cfg.RunsRetention, 24*time.Hour)
	return []Task{
		{Name: "mark-dead-nodes", Interval: cfg.Interval, Run: func(ctx context.Context, tx pgx.Tx) (int64, error) {
			ids, err := collectStrings(tx.Query(ctx, sqlNodesMarkDead, seconds(cfg.DeadThreshold)))
			if err != nil {
				return 0, fmt.Errorf("mark dead nodes: %w", err)
			}
			for _, id := range ids {
				logger.Warn("node marked dead: no heartbeat within the threshold", "node_id", id, "threshold", cfg.DeadThreshold.String())
			}
			return int64(len(ids)), nil
		}},
		{Name: "delete-dead-nodes", Interval: cfg.Interval, Run: func(ctx context.Context, tx pgx.Tx) (int64, error) {
			ids, err := collectStrings(tx.Query(ctx, sqlNodesDeleteDead, seconds(cfg.DeadRetention)))
			if err != nil {
				return 0, fmt.Errorf("delete dead nodes: %w", err)
			}
			for _, id := range ids {
				logger.Info("deleted the row of a long-dead node", "node_id", id)
			}
			return int64(len(ids)), nil
		}},
		{Name: "prune-maintenance-runs", Interval: time.Hour, Run: func(ctx context.Context, tx pgx.Tx) (int64, error) {
			tag, err := tx.Exec(ctx, sqlMaintenancePrune, seconds(cfg.RunsRetention))
			if err != nil {
				return 0, fmt.Errorf("prune maintenance runs: %w", err)
			}
			return tag.RowsAffected(), nil
		}},
	}
}

func collectStrings(rows pgx.Rows, err error) ([]string, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
