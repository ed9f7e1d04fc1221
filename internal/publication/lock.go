// Package publication owns the publication lock, which orders the garbage collector's mark and
// sweep against every writer that trusts what the binary cache holds. An evaluator holds it
// shared (Hold) from its cache lookups to the commit of the rows that make those objects live,
// the signer (HoldWith) from its existence checks to the narinfos it writes; the collector takes
// it exclusively (HoldExclusive) to read its start time and again to recheck and delete, and
// within its database step's transaction (HoldExclusiveTx). Whoever comes second sees the
// other's work.
package publication

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
)

// releaseTimeout bounds an unlock, which runs even when the holder's context is done.
const releaseTimeout = 10 * time.Second

// Hold takes the publication lock shared for a writer that trusts what the cache holds: hold it
// from the first existence check (a cache lookup, an upload that found its object there) until
// the rows or narinfos that make those objects live are committed. The sweep deletes nothing
// while any writer holds it, and rechecks the database and the narinfos once they are done.
//
// The lock is a session lock on a connection of its own, not a transaction: it may be held
// across network calls. release unlocks it; if that fails the connection is closed, which
// releases the lock too. A writer must not hold it while waiting for another process that
// takes it (an evaluator's calls to the signer's publish do not take it again): a waiting sweep
// queues ahead of new shared holders.
func Hold(ctx context.Context, pool *pgxpool.Pool) (release func(), err error) {
	l, err := HoldWith(ctx, pool, nil)
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

// ErrLock is wrapped by the errors of taking the publication lock.
var ErrLock = errors.New("take the publication lock")

// Lock is the publication lock held shared (see Hold) on a connection of its own. Whatever its
// holder asks of the database runs on Conn, never on a second connection of the same pool:
// holders that each wait for a second connection can take the whole pool and wait for each
// other.
type Lock struct {
	conn *pgxpool.Conn
}

// HoldWith takes the publication lock shared and runs the queries queued in with, if any, in
// the same round trip (an implicit transaction; the lock outlives it). When they fail the lock
// is released and their error returned as it is; failing to take the lock wraps ErrLock.
func HoldWith(ctx context.Context, pool *pgxpool.Pool, with *pgx.Batch) (*Lock, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrLock, err)
	}
	b := &pgx.Batch{}
	b.Queue(sqlLockShared, db.LockClass, db.LockPublication)
	if with != nil {
		b.QueuedQueries = append(b.QueuedQueries, with.QueuedQueries...)
	}
	br := conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		conn.Release() // the lock was not taken, or the connection is closed
		return nil, fmt.Errorf("%w: %w", ErrLock, err)
	}
	if err := br.Close(); err != nil {
		unlock(conn, sqlUnlockShared)
		return nil, err
	}
	return &Lock{conn: conn}, nil
}

// Conn is the connection holding the lock, for the holder's queries.
func (l *Lock) Conn() *pgx.Conn { return l.conn.Conn() }

// Release unlocks and returns the connection to its pool. Call it once.
func (l *Lock) Release() { unlock(l.conn, sqlUnlockShared) }

// HoldExclusive takes the publication lock exclusively, on a connection of its own: every
// writer holding it shared has committed what it relied on. release unlocks it as Release does.
func HoldExclusive(ctx context.Context, pool *pgxpool.Pool) (release func(), err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("take the publication lock: %w", err)
	}
	if _, err := conn.Exec(ctx, sqlLock, db.LockClass, db.LockPublication); err != nil {
		conn.Release()
		return nil, fmt.Errorf("take the publication lock: %w", err)
	}
	return func() { unlock(conn, sqlUnlock) }, nil
}

// HoldExclusiveTx takes the publication lock exclusively until tx ends.
func HoldExclusiveTx(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, sqlXactLock, db.LockClass, db.LockPublication); err != nil {
		return fmt.Errorf("take the publication lock: %w", err)
	}
	return nil
}

func unlock(conn *pgxpool.Conn, sql string) {
	// Unlock even when the caller's context is done; a connection that cannot unlock is closed
	// rather than returned to the pool with the lock held.
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if _, err := conn.Exec(ctx, sql, db.LockClass, db.LockPublication); err != nil {
		_ = conn.Conn().Close(ctx)
	}
	conn.Release()
}
