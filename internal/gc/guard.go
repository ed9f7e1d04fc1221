package gc

import (
	"context"
	"fmt"

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
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("take the publication lock: %w", err)
	}
	if _, err := conn.Exec(ctx, sqlPublishLockShared, cluster.LockClass); err != nil {
		conn.Release()
		return nil, fmt.Errorf("take the publication lock: %w", err)
	}
	return func() { unlock(conn, sqlPublishUnlockShard) }, nil
}

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
