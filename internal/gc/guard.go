package gc

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
)

// HoldPublication takes the publication lock shared for a writer that trusts what the cache
// holds: hold it from the first existence check (a cache lookup, an upload that found its object
// there) until the rows or narinfos that make those objects live are committed. The sweep
// deletes nothing while any writer holds it, and rechecks the database and the narinfos once
// they are done.
//
// The lock is a session lock on a connection of its own, not a transaction: it may be held
// across network calls. release unlocks it; if that fails the connection is closed, which
// releases the lock too. A writer must not hold it while waiting for another process that
// takes it (an evaluator's calls to the signer's publish do not take it again): a waiting sweep
// queues ahead of new shared holders.
func HoldPublication(ctx context.Context, pool *pgxpool.Pool) (release func(), err error) {
	p, err := HoldPublicationWith(ctx, pool, nil)
	if err != nil {
		return nil, err
	}
	return p.Release, nil
}

// ErrPublicationLock is wrapped by the errors of taking the publication lock.
var ErrPublicationLock = errors.New("take the publication lock")

// Publication is the publication lock held shared (see HoldPublication) on a connection of its
// own. Whatever its holder asks of the database runs on Conn, never on a second connection of
// the same pool: holders that each wait for a second connection can take the whole pool and
// wait for each other.
type Publication struct {
	conn *pgxpool.Conn
}

// HoldPublicationWith takes the publication lock shared and runs the queries queued in with, if
// any, in the same round trip (an implicit transaction; the lock outlives it). When they fail the
// lock is released and their error returned as it is; failing to take the lock wraps
// ErrPublicationLock.
func HoldPublicationWith(ctx context.Context, pool *pgxpool.Pool, with *pgx.Batch) (*Publication, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPublicationLock, err)
	}
	b := &pgx.Batch{}
	b.Queue(sqlPublishLockShared, cluster.LockClass)
	if with != nil {
		b.QueuedQueries = append(b.QueuedQueries, with.QueuedQueries...)
	}
	br := conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		conn.Release() // the lock was not taken, or the connection is closed
		return nil, fmt.Errorf("%w: %w", ErrPublicationLock, err)
	}
	if err := br.Close(); err != nil {
		unlock(conn, sqlPublishUnlockShard)
		return nil, err
	}
	return &Publication{conn: conn}, nil
}

// Conn is the connection holding the lock, for the holder's queries.
func (p *Publication) Conn() *pgx.Conn { return p.conn.Conn() }

// Release unlocks and returns the connection to its pool. Call it once.
func (p *Publication) Release() { unlock(p.conn, sqlPublishUnlockShard) }

// holdExclusive takes the publication lock exclusively: every writer holding it shared has
// committed what it relied on.
func holdExclusive(ctx context.Context, pool *pgxpool.Pool) (release func(), err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("take the publication lock: %w", err)
	}
	if _, err := conn.Exec(ctx, sqlPublishLock, cluster.LockClass); err != nil {
		conn.Release()
		return nil, fmt.Errorf("take the publication lock: %w", err)
	}
	return func() { unlock(conn, sqlPublishUnlock) }, nil
}

func unlock(conn *pgxpool.Conn, sql string) {
	// Unlock even when the caller's context is done; a connection that cannot unlock is closed
	// rather than returned to the pool with the lock held.
	ctx, cancel := context.WithTimeout(context.Background(), lockReleaseTimeout)
	defer cancel()
	if _, err := conn.Exec(ctx, sql, cluster.LockClass); err != nil {
		_ = conn.Conn().Close(ctx)
	}
	conn.Release()
}
