package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Node statuses (seed 003).
const (
	StatusJoining  = "joining"
	StatusActive   = "active"
	StatusDraining = "draining"
	StatusDead     = "dead"
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
}

// Registry is this process's membership in the nodes table: one row per node id, owned by the
// process whose incarnation it carries.
type Registry struct {
	pool        *pgxpool.Pool
	info        NodeInfo
	incarnation uuid.UUID
	logger      *slog.Logger

	mu     sync.Mutex
	status string // what this process wants the row to say; draining wins in SQL
}

// NewRegistry prepares membership for info under a fresh incarnation.
func NewRegistry(pool *pgxpool.Pool, info NodeInfo, logger *slog.Logger) *Registry {
	return &Registry{pool: pool, info: info, incarnation: uuid.New(), logger: logger, status: StatusJoining}
}

// ID is the node id.
func (r *Registry) ID() string { return r.info.ID }

// Incarnation identifies this process among all that ever used the node id.
func (r *Registry) Incarnation() uuid.UUID { return r.incarnation }

// Register upserts the node row under this incarnation. If the id belonged to an earlier
// process, everything that process still held is released in the same transaction: its leases
// end now, its building/uploading jobs return to the queue (or fail, past 3 retries), and its
// running evaluations are queued again.
func (r *Registry) Register(ctx context.Context) error {
	i := r.info
	var released []releasedJob
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
		var err error
		if released, err = releaseNodeClaims(ctx, tx, i.ID); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("register node %s: %w", i.ID, err)
	}
	if len(released) > 0 {
		r.logger.InfoContext(ctx, "released build jobs of the previous incarnation", "node_id", i.ID, "jobs", len(released))
	}
	return nil
}

type releasedJob struct {
	ID      int64
	Status  string
	System  string
	DrvPath string
}

// releaseNodeClaims returns a node's claimed builds and evaluations to their queues, propagates
// failures of jobs that ran out of retries, and queues the wake-up notifications (sent at commit).
func releaseNodeClaims(ctx context.Context, tx pgx.Tx, nodeID string) ([]releasedJob, error) {
	rows, err := tx.Query(ctx, sqlJobsReleaseNode, nodeID)
	if err != nil {
		return nil, fmt.Errorf("release build jobs: %w", err)
	}
	jobs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (releasedJob, error) {
		var j releasedJob
		return j, row.Scan(&j.ID, &j.Status, &j.System, &j.DrvPath)
	})
	if err != nil {
		return nil, fmt.Errorf("release build jobs: %w", err)
	}
	var failed []int64
	for _, j := range jobs {
		var payload []byte
		if j.Status == "failed" {
			failed = append(failed, j.ID)
			payload, _ = json.Marshal(map[string]string{"drv_path": j.DrvPath, "status": j.Status})
		} else {
			payload, _ = json.Marshal(map[string]string{"system": j.System})
		}
		if _, err := tx.Exec(ctx, sqlNotifyBuildJobs, string(payload)); err != nil {
			return nil, fmt.Errorf("notify build_jobs: %w", err)
		}
	}
	if len(failed) > 0 {
		rows, err := tx.Query(ctx, sqlJobsPropagateFailure, failed)
		if err != nil {
			return nil, fmt.Errorf("propagate failures: %w", err)
		}
		depFailed, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("propagate failures: %w", err)
		}
		for _, drv := range depFailed {
			payload, _ := json.Marshal(map[string]string{"drv_path": drv, "status": "dep-failed"})
			if _, err := tx.Exec(ctx, sqlNotifyBuildJobs, string(payload)); err != nil {
				return nil, fmt.Errorf("notify build_jobs: %w", err)
			}
		}
	}
	if _, err := tx.Exec(ctx, sqlEvalsReleaseNode, nodeID); err != nil {
		return nil, fmt.Errorf("release evaluations: %w", err)
	}
	return jobs, nil
}

// SetStatus records the lifecycle status this process is in (joining, active, draining).
// A draining flag set by an operator keeps the row draining whatever the process says.
func (r *Registry) SetStatus(ctx context.Context, status string) error {
	r.mu.Lock()
	r.status = status
	r.mu.Unlock()
	if _, err := r.pool.Exec(ctx, sqlNodeSetStatus, r.info.ID, r.incarnation, status); err != nil {
		return fmt.Errorf("set node %s status %s: %w", r.info.ID, status, err)
	}
	return nil
}

// StartDraining marks the node draining: it takes no new work from now on.
func (r *Registry) StartDraining(ctx context.Context) error {
	r.mu.Lock()
	r.status = StatusDraining
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
	status := r.status
	r.mu.Unlock()
	err = r.pool.QueryRow(ctx, sqlNodeBeat, r.info.ID, r.incarnation, status,
		load.CurrentJobs, load.CPU, load.Memory).Scan(&draining)
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
			i.Systems, i.Features, i.MaxJobs, i.Version, r.incarnation, status); err != nil {
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
func RequestDrain(ctx context.Context, q Querier, nodeID string) error {
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

// Querier is what read-only and single-statement helpers need: a pool, a connection or a tx.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// seconds turns a duration into the float seconds make_interval wants.
func seconds(d time.Duration) float64 { return d.Seconds() }
