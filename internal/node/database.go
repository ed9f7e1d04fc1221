package node

import (
	"context"
	"log/slog"
	"path/filepath"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/pgembed"
)

// OpenDatabase returns the pool for cfg: the configured database, or the embedded server under
// the state directory (started, or attached to if another process runs it). The returned stop
// func closes the pool and stops an embedded server this call started.
func OpenDatabase(ctx context.Context, cfg *config.Config, logger *slog.Logger) (*pgxpool.Pool, func(), error) {
	url := cfg.DatabaseURL
	var srv *pgembed.Server
	if url == "" {
		var err error
		srv, err = pgembed.Start(ctx, pgembed.Options{
			Dir: filepath.Join(cfg.StateDir, "postgres"), Durable: true, Logger: logger,
		})
		if err != nil {
			return nil, nil, err
		}
		url = srv.URL("harmonia")
	}
	pool, err := db.Connect(ctx, url, db.PoolConfig{
		ApplicationName: "harmonia-ci " + cfg.Node.ID,
		// A process paused inside a transaction must not hold row locks (the leader fence)
		// for longer than a lease.
		IdleInTransactionTimeout: cfg.Cluster.LeaderElection.LeaseDuration.Duration,
	})
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

