// Package db owns harmonia-ci's PostgreSQL schema: the embedded, versioned migrations, the
// advisory-locked migration runner, and the connection pool every role shares.
//
// Queries live with the package that runs them, as sql… constants in its queries.go (cluster,
// queue, ...); this package holds only what every one of them needs, such as DBTX.
package db

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
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
	// ConnectTimeout bounds one connection attempt (dial, TLS, startup), so a server that is
	// paused or unreachable fails the attempt instead of hanging it. Default 5 seconds; a
	// connect_timeout in the URL wins.
	ConnectTimeout time.Duration
}

// DefaultConnectTimeout is PoolConfig.ConnectTimeout's default.
const DefaultConnectTimeout = 5 * time.Second

// ErrUnavailable matches (errors.Is) a failure that says the database could not be reached or
// did not answer in time, as opposed to a bad URL, rejected credentials or a failed statement:
// see Unavailable.
var ErrUnavailable = errors.New("database unavailable")

// unavailableError marks an error as ErrUnavailable and keeps its cause.
type unavailableError struct{ err error }

func (e *unavailableError) Error() string        { return e.err.Error() }
func (e *unavailableError) Unwrap() error        { return e.err }
func (e *unavailableError) Is(target error) bool { return target == ErrUnavailable }

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
		if Unavailable(err) {
			err = &unavailableError{err}
		}
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	return pool, nil
}

// Unavailable reports whether err says the database could not be reached or did not answer in
// time: a refused or failed connection, a connection lost mid-statement, a deadline, a server
// shutting down, starting up or out of connections. Such a failure may pass by itself; a
// rejected password, an unknown database or a failed statement does not, and a caller that
// gave up (context.Canceled) is not the database's failure either.
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrUnavailable) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"): // connection_exception
			return true
		case strings.HasPrefix(pgErr.Code, "57P"): // admin/crash shutdown, cannot_connect_now
			return true
		case pgErr.Code == "53300": // too_many_connections
			return true
		}
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) {
		return true
	}
	if errors.Is(err, context.Canceled) {
		return false
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) || errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
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
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = DefaultConnectTimeout
	}
	pc.MaxConns = cfg.MaxConns
	if pc.ConnConfig.ConnectTimeout == 0 {
		pc.ConnConfig.ConnectTimeout = cfg.ConnectTimeout
	}
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
