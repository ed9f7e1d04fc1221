package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
	"github.com/harmonia-ci/harmonia-ci/internal/startstop"
)

// Leader roles: work exactly one node does at a time.
const (
	// RoleMaintenance runs the cluster's housekeeping: marking dead nodes, cleaning their rows,
	// and (with the queue) reaping their jobs, failing unsupported builds and decaying shares.
	RoleMaintenance = "maintenance"
	// RoleGC collects garbage: expired evaluations and the cache objects nothing live needs.
	// Only nodes holding the cache's blob store (the signer role) stand for it.
	RoleGC = "gc"
)

// leaderLockIDs gives each leader role its advisory lock object id (class db.LockClass).
var leaderLockIDs = map[string]int32{
	RoleMaintenance: db.LockMaintenance,
	RoleGC:          db.LockGC,
}

// Leader election defaults (cluster.leader_election in the configuration).
const (
	DefaultElectionCheck = 5 * time.Second
	DefaultLease         = 60 * time.Second
)

// ElectorConfig configures leader election for one role. The refresh interval is lease/3, not
// lease/2, so a leader gets two retries before its lease runs out.
type ElectorConfig struct {
	// Role is the leader role; it must be one of the Role* constants.
	Role string
	// CheckInterval is how often a standby tries to take over and a leader checks its lock
	// session. Default DefaultElectionCheck.
	CheckInterval time.Duration
	// LeaseDuration is how long a lease lasts without renewal. Default DefaultLease.
	LeaseDuration time.Duration
	// RefreshInterval is how often the leader renews; at most LeaseDuration/3. Default
	// LeaseDuration/3.
	RefreshInterval time.Duration
	// Notifier, if set, wakes this elector when a leader of the role resigns, so it campaigns at
	// once rather than at its next check.
	Notifier *notify.Notifier
	// LeaderFunc runs while this node leads, in its own goroutine; its context ends when the
	// term ends, and the lease is given up only after it returns.
	LeaderFunc func(ctx context.Context, term *Term)
}

// Identity names one process: a node id and the incarnation of this start.
type Identity struct {
	NodeID      string
	Incarnation uuid.UUID
}

// Elector campaigns for one leader role and holds it while it can.
//
// The leases row is the authority and its epoch the fencing token. The advisory lock, held on
// the process's dedicated lock session, decides who may start a new epoch: holding it proves
// every earlier holder's session has ended or unlocked, so the lease is taken over at once
// without waiting for it to run out. A leader steps down when its lock session is lost, when a
// renewal changes no row, when a fenced write is refused, or when its local monotonic trust
// deadline (last successful renewal attempt + lease − margin) passes.
type Elector struct {
	startstop.Base
	cfg     ElectorConfig
	lockID  int32
	pool    *pgxpool.Pool
	lock    *LockConn
	id      Identity
	logger  *slog.Logger
	clock   clock.Clock
	metrics *Metrics

	kick chan struct{} // a term ended itself (fenced write refused)

	mu   sync.Mutex
	term *Term

	// loop-only state
	cooldownUntil time.Time
	lastRenew     time.Time
	leaderDone    chan struct{}
}

// NewElector builds an elector; Start runs it.
func NewElector(cfg ElectorConfig, pool *pgxpool.Pool, lock *LockConn, id Identity, metrics *Metrics, logger *slog.Logger, clk clock.Clock) (*Elector, error) {
	lockID, ok := leaderLockIDs[cfg.Role]
	if !ok {
		return nil, fmt.Errorf("leader election: unknown role %q", cfg.Role)
	}
	cfg.CheckInterval = cmpOr(cfg.CheckInterval, DefaultElectionCheck)
	cfg.LeaseDuration = cmpOr(cfg.LeaseDuration, DefaultLease)
	cfg.RefreshInterval = cmpOr(cfg.RefreshInterval, cfg.LeaseDuration/3)
	if cfg.RefreshInterval > cfg.LeaseDuration/3 {
		return nil, fmt.Errorf("leader election %s: refresh interval %s exceeds lease/3 (%s)", cfg.Role, cfg.RefreshInterval, cfg.LeaseDuration/3)
	}
	metrics.isLeader.WithLabelValues(cfg.Role).Set(0)
	metrics.tenure.WithLabelValues(cfg.Role).Set(0)
	return &Elector{
		cfg: cfg, lockID: lockID, pool: pool, lock: lock, id: id, metrics: metrics,
		logger: logger.With("service", "elector", "role", cfg.Role), clock: clk,
		kick: make(chan struct{}, 1),
	}, nil
}

func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// Start campaigns until Stop; Stop resigns gracefully if this node leads. A second Start is a
// no-op.
func (e *Elector) Start(ctx context.Context) error {
	_, err := e.Launch(ctx, func() (func(context.Context), error) {
		if e.cfg.Notifier == nil {
			return func(ctx context.Context) { e.loop(ctx, nil) }, nil
		}
		sub, err := e.cfg.Notifier.Subscribe("leaders")
		if err != nil {
			return nil, fmt.Errorf("leader election %s: %w", e.cfg.Role, err)
		}
		return func(ctx context.Context) {
			defer sub.Close()
			e.loop(ctx, sub.C)
		}, nil
	})
	return err
}

// Term returns the current term, or nil if this node does not lead the role.
func (e *Elector) Term() *Term {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.term != nil && !e.term.Valid() {
		return nil
	}
	return e.term
}

// IsLeader reports whether this node currently leads the role (by its own, local view).
func (e *Elector) IsLeader() bool { return e.Term() != nil }

func (e *Elector) loop(ctx context.Context, resigned <-chan notify.Notification) {
	// A random first delay spreads the campaigns of nodes started together.
	wait := time.Duration(rand.Int64N(int64(e.cfg.CheckInterval)/4 + 1))
	for {
		select {
		case <-ctx.Done():
			e.stepDown(true, "shutting down")
			return
		case <-e.kick:
		case n := <-resigned:
			if n.Payload != e.cfg.Role || e.currentTerm() != nil {
				continue
			}
		case <-e.clock.After(wait):
		}
		if e.currentTerm() == nil {
			e.campaign(ctx)
		} else {
			e.maintain(ctx)
		}
		wait = e.cfg.CheckInterval
		if e.currentTerm() == nil {
			wait += time.Duration(rand.Int64N(int64(e.cfg.CheckInterval)/5 + 1))
		}
	}
}

func (e *Elector) currentTerm() *Term {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.term
}

// campaign tries to become leader once.
func (e *Elector) campaign(ctx context.Context) {
	if e.clock.Now().Before(e.cooldownUntil) {
		return
	}
	e.metrics.elections.WithLabelValues(e.cfg.Role).Inc()
	attemptStart := e.clock.Now()
	cctx, cancel := context.WithTimeout(ctx, e.cfg.CheckInterval)
	defer cancel()

	var (
		won            bool
		epoch          int64
		prevNode       *string
		prevInc        *uuid.UUID
		prevUnresigned bool
		gen            uint64
		preempted      int
		errAcquire     error
	)
	gen, err := e.lock.Do(cctx, func(conn *pgx.Conn) error {
		var got bool
		if err := conn.QueryRow(cctx, sqlTryAdvisoryLock, db.LockClass, e.lockID).Scan(&got); err != nil {
			return fmt.Errorf("try lock: %w", err)
		}
		if !got {
			rows, err := conn.Query(cctx, sqlPreemptExpiredHolder, db.LockClass, e.lockID, e.cfg.Role, seconds(e.cfg.CheckInterval))
			if err != nil {
				return fmt.Errorf("preempt expired holder: %w", err)
			}
			ended, err := pgx.CollectRows(rows, pgx.RowTo[bool])
			if err != nil {
				return fmt.Errorf("preempt expired holder: %w", err)
			}
			preempted = len(ended)
			return nil
		}
		errAcquire = pgx.BeginFunc(cctx, conn, func(tx pgx.Tx) error {
			// A paused leader may sit inside a fenced transaction holding the row FOR SHARE;
			// don't wait for it past one check.
			if _, err := tx.Exec(cctx, sqlSetLockTimeout, e.cfg.CheckInterval.Milliseconds()); err != nil {
				return err
			}
			return tx.QueryRow(cctx, sqlLeaseAcquire, e.cfg.Role, e.id.NodeID, e.id.Incarnation,
				seconds(e.cfg.LeaseDuration)).Scan(&epoch, &prevNode, &prevInc, &prevUnresigned)
		})
		if errAcquire != nil {
			if _, err := conn.Exec(context.WithoutCancel(cctx), sqlAdvisoryUnlock, db.LockClass, e.lockID); err != nil {
				return fmt.Errorf("unlock after failed lease write: %w", err)
			}
			return nil
		}
		won = true
		return nil
	})
	switch {
	case err != nil:
		if ctx.Err() == nil {
			e.logger.Warn("election attempt failed", "error", err)
		}
		return
	case errAcquire != nil:
		if ctx.Err() == nil {
			e.logger.Warn("took the lock but could not write the lease", "error", errAcquire)
		}
		return
	case preempted > 0:
		e.logger.Warn("ended the lock session of a leader whose lease had expired", "sessions", preempted)
		return
	case !won:
		return
	}

	termCtx, cancelTerm := context.WithCancelCause(context.WithoutCancel(ctx))
	t := &Term{
		Role: e.cfg.Role, NodeID: e.id.NodeID, Incarnation: e.id.Incarnation, Epoch: epoch,
		AcquiredAt: attemptStart, gen: gen, ctx: termCtx, cancel: cancelTerm, elector: e,
		trustedUntil: e.trustDeadline(attemptStart),
	}
	e.mu.Lock()
	e.term = t
	e.mu.Unlock()
	e.lastRenew = attemptStart
	e.metrics.isLeader.WithLabelValues(e.cfg.Role).Set(1)
	e.metrics.tenure.WithLabelValues(e.cfg.Role).Set(0)
	from := ""
	if prevNode != nil && (*prevNode != e.id.NodeID || *prevInc != e.id.Incarnation) {
		from = *prevNode
		if prevUnresigned {
			e.metrics.failovers.WithLabelValues(e.cfg.Role).Inc()
		}
	}
	e.logger.Info("became leader", "epoch", epoch, "previous_leader", from, "previous_resigned", prevNode != nil && !prevUnresigned)
	if e.cfg.LeaderFunc != nil {
		done := make(chan struct{})
		e.leaderDone = done
		go func() {
			defer close(done)
			e.cfg.LeaderFunc(termCtx, t)
		}()
	}
}

// trustDeadline is how long a renewal attempt that started at start lets this node act: the
// lease it asked for, less a margin for the round trip and scheduling.
func (e *Elector) trustDeadline(start time.Time) time.Time {
	margin := min(e.cfg.CheckInterval, e.cfg.LeaseDuration/4)
	return start.Add(e.cfg.LeaseDuration - margin)
}

// maintain runs one leader tick: check the trust deadline and the lock session, renew when due.
func (e *Elector) maintain(ctx context.Context) {
	t := e.currentTerm()
	now := e.clock.Now()
	e.metrics.tenure.WithLabelValues(e.cfg.Role).Set(now.Sub(t.AcquiredAt).Seconds())
	if err := context.Cause(t.ctx); err != nil {
		e.stepDown(false, err.Error())
		return
	}
	if !now.Before(t.deadline()) {
		e.stepDown(false, "lease not renewed before the local trust deadline")
		return
	}
	cctx, cancel := context.WithTimeout(ctx, e.cfg.CheckInterval)
	defer cancel()
	renewDue := now.Sub(e.lastRenew) >= e.cfg.RefreshInterval
	var held, renewed bool
	gen, err := e.lock.Do(cctx, func(conn *pgx.Conn) error {
		if err := conn.QueryRow(cctx, sqlAdvisoryLockHeld, db.LockClass, e.lockID).Scan(&held); err != nil {
			return fmt.Errorf("check lock: %w", err)
		}
		if !held || !renewDue {
			return nil
		}
		tag, err := conn.Exec(cctx, sqlLeaseRenew, t.Role, t.NodeID, t.Incarnation, t.Epoch, seconds(e.cfg.LeaseDuration))
		if err != nil {
			return fmt.Errorf("renew lease: %w", err)
		}
		renewed = tag.RowsAffected() == 1
		return nil
	})
	switch {
	case gen != t.gen:
		e.stepDown(false, "lock session lost")
	case err != nil:
		// Keep acting until the trust deadline; the next tick retries.
		if ctx.Err() == nil {
			e.logger.Warn("leader check failed", "error", err, "trusted_for", t.deadline().Sub(now).String())
		}
	case !held:
		e.stepDown(false, "advisory lock no longer held")
	case renewDue && !renewed:
		e.stepDown(false, "lease renewal changed no row (term ended)")
	case renewDue:
		e.lastRenew = now
		t.extend(e.trustDeadline(now))
	}
}

// stepDown ends the current term. Leader work is cancelled and waited for before the lease and
// lock are given up. A graceful step-down resigns the lease so a standby takes over at its next
// check; after an involuntary one this node sits out a while so another node is preferred.
func (e *Elector) stepDown(graceful bool, reason string) {
	t := e.currentTerm()
	if t == nil {
		return
	}
	t.cancel(errors.New(reason))
	if e.leaderDone != nil {
		<-e.leaderDone
		e.leaderDone = nil
	}
	e.mu.Lock()
	e.term = nil
	e.mu.Unlock()
	e.metrics.isLeader.WithLabelValues(e.cfg.Role).Set(0)
	e.metrics.tenure.WithLabelValues(e.cfg.Role).Set(0)
	e.metrics.stepDowns.WithLabelValues(e.cfg.Role, stepDownKind(graceful)).Inc()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := e.lock.Do(ctx, func(conn *pgx.Conn) error {
		if e.lock.gen != t.gen {
			return nil // that session, and its lock, are gone already
		}
		if graceful {
			if _, err := conn.Exec(ctx, sqlLeaseResign, t.Role, t.NodeID, t.Incarnation, t.Epoch); err != nil {
				return fmt.Errorf("resign lease: %w", err)
			}
		}
		if _, err := conn.Exec(ctx, sqlAdvisoryUnlock, db.LockClass, e.lockID); err != nil {
			return err
		}
		if graceful {
			// Standbys woken now find the lock free and take over without waiting for a check.
			if _, err := conn.Exec(ctx, sqlNotifyResigned, t.Role); err != nil {
				return fmt.Errorf("announce resignation: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		e.logger.Warn("could not release leadership cleanly", "error", err)
	}
	if graceful {
		e.logger.Info("resigned leadership", "epoch", t.Epoch, "reason", reason)
		return
	}
	e.cooldownUntil = e.clock.Now().Add(2 * e.cfg.CheckInterval)
	e.logger.Warn("stepped down", "epoch", t.Epoch, "reason", reason)
}

func stepDownKind(graceful bool) string {
	if graceful {
		return "resign"
	}
	return "lost"
}

// ErrNotLeader is returned by a fenced write whose term no longer holds.
var ErrNotLeader = errors.New("not the leader (term ended)")

// Term is one tenure of this node as leader of a role.
type Term struct {
	Role        string
	NodeID      string
	Incarnation uuid.UUID
	Epoch       int64
	AcquiredAt  time.Time // local clock; for tenure only

	gen     uint64
	ctx     context.Context
	cancel  context.CancelCauseFunc
	elector *Elector

	mu           sync.Mutex
	trustedUntil time.Time
}

func (t *Term) deadline() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.trustedUntil
}

func (t *Term) extend(d time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.trustedUntil = d
}

// Context ends when the term does.
func (t *Term) Context() context.Context { return t.ctx }

// Valid reports whether this node may still act on the term by its own reckoning. The database
// has the final word: see RunFenced.
func (t *Term) Valid() bool {
	return t.ctx.Err() == nil && t.elector.clock.Now().Before(t.deadline())
}

// RunFenced runs fn in a transaction that first proves, in the database, that this term still
// holds: the role's lease row carries this node, incarnation and epoch and has not expired. The
// row stays locked against a new epoch until the transaction ends, so every write of an epoch
// commits before the next epoch begins. If the proof fails nothing is written, the term ends,
// and ErrNotLeader is returned.
func (t *Term) RunFenced(ctx context.Context, pool *pgxpool.Pool, fn func(tx pgx.Tx) error) error {
	if !t.Valid() {
		return ErrNotLeader
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// The fence holds the lease row FOR SHARE, which a takeover must wait for: a process
		// paused inside this transaction must not block failover past its own lease.
		if _, err := tx.Exec(ctx, sqlSetIdleTimeout,
			t.elector.cfg.LeaseDuration.Milliseconds()); err != nil {
			return fmt.Errorf("bound fenced transaction: %w", err)
		}
		var one int
		err := tx.QueryRow(ctx, sqlLeaseFence, t.Role, t.NodeID, t.Incarnation, t.Epoch).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotLeader
		}
		if err != nil {
			return fmt.Errorf("check leader epoch: %w", err)
		}
		return fn(tx)
	})
	if errors.Is(err, ErrNotLeader) {
		t.elector.metrics.fencedWrites.WithLabelValues(t.Role).Inc()
		t.cancel(errors.New("fenced write refused: a newer epoch holds the role or the lease expired"))
		select {
		case t.elector.kick <- struct{}{}:
		default:
		}
	}
	return err
}
