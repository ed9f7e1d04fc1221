package cluster

import (
	"context"
	"log/slog"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
)

// LockConn is the one connection per process that holds session advisory locks. It is never a
// pooled connection: a session lock lives exactly as long as this session, so losing the
// connection means losing every lock, and each new session gets a new generation number that
// lets holders notice.
type LockConn struct {
	pool   *pgxpool.Pool
	logger *slog.Logger

	mu   sync.Mutex
	conn *pgx.Conn
	gen  uint64
}

// NewLockConn prepares the dedicated lock connection; it connects on first use.
func NewLockConn(pool *pgxpool.Pool, logger *slog.Logger) *LockConn {
	return &LockConn{pool: pool, logger: logger}
}

// Do runs fn on the dedicated session, connecting first if there is none, and returns the
// session's generation. A call that leaves the connection broken drops it, so the next call
// starts a new session (and generation).
func (l *LockConn) Do(ctx context.Context, fn func(conn *pgx.Conn) error) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil || l.conn.IsClosed() {
		conn, err := db.DedicatedConn(ctx, l.pool, "harmonia-ci locks")
		if err != nil {
			return l.gen, err
		}
		l.conn = conn
		l.gen++
	}
	err := fn(l.conn)
	if err != nil && l.conn.IsClosed() {
		l.logger.Warn("advisory lock connection lost; its locks are gone", "error", err)
		l.conn = nil
	}
	return l.gen, err
}

// Close ends the session, which releases every lock it holds.
func (l *LockConn) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		_ = l.conn.Close(context.Background())
		l.conn = nil
	}
}
