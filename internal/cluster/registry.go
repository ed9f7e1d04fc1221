package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/status"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
)

// ErrSuperseded means another process registered under this node id after us: the row, and the
// node id, now belong to it.
var ErrSuperseded = errors.New("node id taken over by another process")

// ErrNodeNotFound is returned for a node id with no live row.
var ErrNodeNotFound = errors.New("node not found")

// NodeInfo is what a node registers about itself.
type NodeInfo struct {
	ID       string
	Roles    []string
	Endpoint string
	Hostname string
	Systems  []string
	Features []string
	MaxJobs  int
	MaxEvals int
	Version  string
}

// Load is the node's load, reported with each heartbeat.
type Load struct {
	CurrentJobs int
	CPU         float32 // fraction of all cores busy, 0..1
	Memory      float32 // fraction of memory in use, 0..1
	// SpeedFactor is the builder's recent pace (a rolling average of build durations, as builds
	// per minute); 0 keeps the last value.
	SpeedFactor float64
}

// Registry is this process's membership in the nodes table: one row per node id, owned by the
// process whose incarnation it carries.
type Registry struct {
	pool        *pgxpool.Pool
	info        NodeInfo
	incarnation uuid.UUID
	logger      *slog.Logger

	releaser ReleaseFunc

	mu     sync.Mutex
	status status.NodeStatus // what this process wants the row to say; draining wins in SQL
	nix    NixInfo
}

// NixInfo is the Nix a node runs: its version and the worker protocol the node speaks with its
// daemon ("1.38"); empty for a node that runs no Nix.
type NixInfo struct {
	Version  string `json:"nix_version"`
	Protocol string `json:"nix_protocol"`
}

// String is the version with its protocol, "2.26.3 (protocol 1.38)", or "-" for no Nix.
func (n NixInfo) String() string {
	switch {
	case n.Version == "":
		return "-"
	case n.Protocol == "":
		return n.Version
	}
	return n.Version + " (protocol " + n.Protocol + ")"
}

// SetNix records the Nix the node runs, once its roles have found out.
func (r *Registry) SetNix(ctx context.Context, nix NixInfo) error {
	r.mu.Lock()
	r.nix = nix
	r.mu.Unlock()
	if _, err := r.pool.Exec(ctx, sqlNodeSetNix, r.info.ID, r.incarnation, nix.Version, nix.Protocol); err != nil {
		return fmt.Errorf("set node %s nix version: %w", r.info.ID, err)
	}
	return nil
}

// NewRegistry prepares membership for info under a fresh incarnation.
func NewRegistry(pool *pgxpool.Pool, info NodeInfo, logger *slog.Logger) *Registry {
	return &Registry{pool: pool, info: info, incarnation: uuid.New(), logger: logger, status: status.NodeJoining}
}

// ID is the node id.
func (r *Registry) ID() string { return r.info.ID }

// Incarnation identifies this process among all that ever used the node id.
func (r *Registry) Incarnation() uuid.UUID { return r.incarnation }

// Register upserts the node row under this incarnation. If the id belonged to an earlier
// process, everything that process still held is released in the same transaction: its leases
// end now, and whatever OnReregister gives back (its claimed builds and evaluations).
func (r *Registry) Register(ctx context.Context) error {
	i := r.info
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		var prev *uuid.UUID
		if err := tx.QueryRow(ctx, sqlNodeRegister, i.ID, i.Roles, i.Endpoint, i.Hostname, i.MaxEvals,
			i.Systems, i.Features, i.MaxJobs, i.Version, r.incarnation).Scan(&prev); err != nil {
			return err
		}
		if prev == nil || *prev == r.incarnation {
			return nil // a new node id, or this process registering again
		}
		r.logger.InfoContext(ctx, "node id was registered before; releasing what the previous process held",
			"node_id", i.ID, "previous_incarnation", prev.String())
		if _, err := tx.Exec(ctx, sqlLeasesReleaseStale, i.ID, r.incarnation); err != nil {
			return fmt.Errorf("release leases: %w", err)
		}
		if r.releaser != nil {
			return r.releaser(ctx, tx, i.ID)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("register node %s: %w", i.ID, err)
	}
	return nil
}

// ReleaseFunc gives back, inside the registration transaction, the work a node id's previous
// process held (its claimed builds and evaluations). The queue provides it.
type ReleaseFunc func(ctx context.Context, tx pgx.Tx, nodeID string) error

// OnReregister sets what Register releases when the node id had a previous incarnation, besides
// its leases. Call before Register.
func (r *Registry) OnReregister(f ReleaseFunc) { r.releaser = f }

// SetStatus records the lifecycle status this process is in (joining, active, draining).
// A draining flag set by an operator keeps the row draining whatever the process says.
func (r *Registry) SetStatus(ctx context.Context, st status.NodeStatus) error {
	r.mu.Lock()
	r.status = st
	r.mu.Unlock()
	if _, err := r.pool.Exec(ctx, sqlNodeSetStatus, r.info.ID, r.incarnation, st); err != nil {
		return fmt.Errorf("set node %s status %s: %w", r.info.ID, st, err)
	}
	return nil
}

// StartDraining marks the node draining: it takes no new work from now on.
func (r *Registry) StartDraining(ctx context.Context) error {
	r.mu.Lock()
	r.status = status.NodeDraining
	r.mu.Unlock()
	if _, err := r.pool.Exec(ctx, sqlNodeStartDraining, r.info.ID, r.incarnation); err != nil {
		return fmt.Errorf("mark node %s draining: %w", r.info.ID, err)
	}
	return nil
}

// Beat records a heartbeat with the database's clock and reports whether an operator asked the
// node to drain. If maintenance deleted the row while the node was unreachable it is re-created;
// if another process owns the node id now, Beat returns ErrSuperseded.
func (r *Registry) Beat(ctx context.Context, load Load) (draining bool, err error) {
	r.mu.Lock()
	st, nix := r.status, r.nix
	r.mu.Unlock()
	err = r.pool.QueryRow(ctx, sqlNodeBeat, r.info.ID, r.incarnation, st,
		load.CurrentJobs, load.CPU, load.Memory, load.SpeedFactor).Scan(&draining)
	if err == nil {
		return draining, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("heartbeat node %s: %w", r.info.ID, err)
	}
	var owner uuid.UUID
	err = r.pool.QueryRow(ctx, sqlNodeIncarnation, r.info.ID).Scan(&owner)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		i := r.info
		if _, err := r.pool.Exec(ctx, sqlNodeRevive, i.ID, i.Roles, i.Endpoint, i.Hostname, i.MaxEvals,
			i.Systems, i.Features, i.MaxJobs, i.Version, r.incarnation, st, nix.Version, nix.Protocol); err != nil {
			return false, fmt.Errorf("heartbeat node %s: re-create row: %w", i.ID, err)
		}
		r.logger.WarnContext(ctx, "node row was gone (marked dead and cleaned up?); re-created it", "node_id", i.ID)
		return false, nil
	case err != nil:
		return false, fmt.Errorf("heartbeat node %s: %w", r.info.ID, err)
	case owner != r.incarnation:
		return false, fmt.Errorf("heartbeat node %s: %w (incarnation %s)", r.info.ID, ErrSuperseded, owner)
	default:
		return false, fmt.Errorf("heartbeat node %s: row unchanged", r.info.ID)
	}
}

// Deregister deletes the node row, if it is still this incarnation's.
func (r *Registry) Deregister(ctx context.Context) error {
	if _, err := r.pool.Exec(ctx, sqlNodeDeregister, r.info.ID, r.incarnation); err != nil {
		return fmt.Errorf("deregister node %s: %w", r.info.ID, err)
	}
	return nil
}

// RequestDrain asks a node to drain; the node acts on it at its next heartbeat.
// It returns ErrNodeNotFound if no live node has that id.
func RequestDrain(ctx context.Context, q db.DBTX, nodeID string) error {
	var id string
	err := q.QueryRow(ctx, sqlNodeRequestDrain, nodeID).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("drain node %s: %w", nodeID, ErrNodeNotFound)
	}
	if err != nil {
		return fmt.Errorf("drain node %s: %w", nodeID, err)
	}
	return nil
}

// seconds turns a duration into the float seconds make_interval wants.
func seconds(d time.Duration) float64 { return d.Seconds() }
