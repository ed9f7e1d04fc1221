package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/pgembed"
)

const (
	// connectRetryMin and connectRetryMax bound the pause between attempts to reach a configured
	// database that is down: doubling from the first to the second, with jitter.
	connectRetryMin = time.Second
	connectRetryMax = 30 * time.Second
)

// OpenDatabase returns the pool for cfg: the configured database, or the embedded server under
// the state directory (started, or attached to if another process runs it). The returned stop
// func closes the pool and stops an embedded server this call started.
//
// With retry, a configured database that cannot be reached (db.ErrUnavailable) is retried with
// backoff until ctx ends: nodes and their database often start together, and a node that exited
// would need something else to restart it. One-shot commands pass false and fail at once. A bad
// URL or rejected credentials fail at once either way, and so does the embedded server, which
// this process starts itself.
func OpenDatabase(ctx context.Context, cfg *config.Config, logger *slog.Logger, retry bool) (*pgxpool.Pool, func(), error) {
	pc := db.PoolConfig{
		ApplicationName: "harmonia-ci " + cfg.Node.ID,
		// A process paused inside a transaction must not hold row locks (the leader fence)
		// for longer than a lease.
		IdleInTransactionTimeout: cfg.Cluster.LeaderElection.LeaseDuration.Duration,
	}
	if cfg.DatabaseURL != "" && !retry {
		pool, err := db.Connect(ctx, cfg.DatabaseURL, pc)
		if err != nil {
			return nil, nil, err
		}
		return pool, pool.Close, nil
	}
	if cfg.DatabaseURL != "" {
		pool, err := connectRetrying(ctx, cfg.DatabaseURL, pc, logger, connectRetryMin, connectRetryMax)
		if err != nil {
			return nil, nil, err
		}
		return pool, pool.Close, nil
	}
	srv, err := pgembed.Start(ctx, pgembed.Options{
		Dir: filepath.Join(cfg.StateDir, "postgres"), Durable: true, Logger: logger,
	})
	if err != nil {
		return nil, nil, err
	}
	pool, err := db.Connect(ctx, srv.URL("harmonia"), pc)
	if err != nil {
		_ = srv.Stop()
		return nil, nil, err
	}
	return pool, func() {
		pool.Close()
		if err := srv.Stop(); err != nil {
			logger.Warn("stop embedded postgres", "error", err)
		}
	}, nil
}

// connectRetrying is db.Connect, repeated while the database is unavailable: after a pause of
// first, doubled after each failure up to most, each with ±20% jitter so a fleet of nodes does
// not reconnect in step. Each failure is logged without the URL, which may hold a password (the
// driver's errors name the user, database and host only).
func connectRetrying(ctx context.Context, url string, pc db.PoolConfig, logger *slog.Logger, first, most time.Duration) (*pgxpool.Pool, error) {
	pause := first
	for attempt := 1; ; attempt++ {
		pool, err := db.Connect(ctx, url, pc)
		if err == nil {
			if attempt > 1 {
				logger.Info("database reachable", "attempts", attempt)
			}
			return pool, nil
		}
		if !errors.Is(err, db.ErrUnavailable) || ctx.Err() != nil {
			return nil, err
		}
		wait := time.Duration(float64(pause) * (0.8 + 0.4*rand.Float64()))
		logger.Warn("database unavailable; retrying", "attempt", attempt, "retry_in", wait.Round(time.Millisecond).String(), "error", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("connect to database: gave up after %d attempts: %w", attempt, context.Cause(ctx))
		case <-t.C:
		}
		pause = min(2*pause, most)
	}
}
