// Package db owns harmonia-ci's PostgreSQL schema: the embedded, versioned migrations, the
// advisory-locked migration runner, and the connection pool every role shares.
//
// Queries live with the package that runs them (cluster, queue, ...); this package holds only
// what every one of them needs.
package db

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PoolConfig tunes the shared pool.
type PoolConfig struct {
	// ApplicationName shows in pg_stat_activity; default "harmonia-ci".
	ApplicationName string
	// MaxConns is the pool size; default 10.
	MaxConns int32
	// IdleInTransactionTimeout makes the server end a session that sits idle inside a
	// transaction (a paused or wedged process) so it cannot hold row locks or xmin forever.
	// Default 1 minute.
	IdleInTransactionTimeout time.Duration
}

// Connect opens the shared pool and checks that the server answers.
func Connect(ctx context.Context, url string, cfg PoolConfig) (*pgxpool.Pool, error) {
	pc, err := ParsePoolConfig(url, cfg)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("open database pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	return pool, nil
}

// ParsePoolConfig turns a database URL into a pool configuration with harmonia-ci's session
// settings. The error never repeats the URL, which may hold a password.
func ParsePoolConfig(url string, cfg PoolConfig) (*pgxpool.Config, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database url: invalid connection string")
	}
	if cfg.ApplicationName == "" {
		cfg.ApplicationName = "harmonia-ci"
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = 10
	}
	if cfg.IdleInTransactionTimeout == 0 {
		cfg.IdleInTransactionTimeout = time.Minute
	}
	pc.MaxConns = cfg.MaxConns
	rp := pc.ConnConfig.RuntimeParams
	rp["application_name"] = cfg.ApplicationName
	rp["idle_in_transaction_session_timeout"] = fmt.Sprint(cfg.IdleInTransactionTimeout.Milliseconds())
	rp["timezone"] = "UTC"
	return pc, nil
}

// DedicatedConn opens a single connection outside the pool, with the pool's settings, for
// session state that must not wander between pooled sessions (advisory locks, LISTEN).
//
// A cancelled or timed-out context cancels the running statement (a cancel request) instead of
// closing the connection, pgx's default: losing this session would lose its locks or LISTENs.
func DedicatedConn(ctx context.Context, pool *pgxpool.Pool, applicationName string) (*pgx.Conn, error) {
	cc := pool.Config().ConnConfig.Copy()
	if applicationName != "" {
		cc.RuntimeParams["application_name"] = applicationName
	}
	cc.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: time.Minute}
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("open dedicated connection: %w", err)
	}
	return conn, nil
}
