// Package overview is what an operator reads first (harmonia-ci status): the queue by system
// and status, ready and blocked jobs, the oldest ready job, evaluations, builders busy and idle,
// leaders and the last garbage collection, read from the database in one consistent snapshot and
// rendered as one screen of text or as JSON.
package overview

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// Overview is the cluster at one moment (ReadAt, the database's clock).
type Overview struct {
	ReadAt time.Time `json:"read_at"`
	// Queue has one row per system with a live job, ordered by system.
	Queue []SystemQueue `json:"queue"`
	// Ready and Blocked split the pending jobs: ready ones have every input succeeded.
	Ready   int64 `json:"ready"`
	Blocked int64 `json:"blocked"`
	// OldestReadySeconds is how long the oldest ready job has waited since it was created; 0
	// when none is ready. A value that keeps growing means builders do not take work.
	OldestReadySeconds float64     `json:"oldest_ready_seconds"`
	Evaluations        Evaluations `json:"evaluations"`
	// Builders are the nodes with the builder role, dead ones included, ordered by id.
	Builders []Builder              `json:"builders"`
	Leaders  []cluster.LeaderStatus `json:"leaders"`
	GC       GC                     `json:"gc"`
}

// SystemQueue counts a system's live jobs.
type SystemQueue struct {
	System    string `json:"system"`
	Pending   int64  `json:"pending"`
	Building  int64  `json:"building"`
	Uploading int64  `json:"uploading"`
}

// Evaluations counts the evaluations not finished yet.
type Evaluations struct {
	Queued  int64 `json:"queued"`
	Running int64 `json:"running"`
}

// Builder is a builder node's load as of its last heartbeat.
type Builder struct {
	ID                 string            `json:"id"`
	Status             status.NodeStatus `json:"status"`
	State              string            `json:"state"` // busy, idle, draining, joining or dead
	Draining           bool              `json:"draining"`
	CurrentJobs        int               `json:"current_jobs"`
	MaxJobs            int               `json:"max_jobs"`
	LastSeenSecondsAgo float64           `json:"last_seen_seconds_ago"`
}

// Builder states, one per builder: what the summary line counts.
const (
	StateBusy     = "busy"     // live, not draining, runs at least one job
	StateIdle     = "idle"     // active, not draining, runs nothing: it could take work now
	StateDraining = "draining" // finishing its work before leaving
	StateJoining  = "joining"  // starting up
	StateDead     = "dead"     // silent too long: the maintenance leader declared it dead
)

// builderState is the one state a builder node is counted in.
func builderState(n cluster.NodeStatus) string {
	switch {
	case n.Status == status.NodeDead:
		return StateDead
	case n.Draining || n.Status == status.NodeDraining:
		return StateDraining
	case n.CurrentJobs > 0:
		return StateBusy
	case n.Status == status.NodeJoining:
		return StateJoining
	default:
		return StateIdle
	}
}

// GC is the garbage collector's record: the newest run, whatever its outcome, and when the
// newest successful run finished. Last is nil if no collection ever ran, LastSucceededAt if
// none ever succeeded.
type GC struct {
	Last            *GCRun     `json:"last"`
	LastSucceededAt *time.Time `json:"last_succeeded_at"`
}

// GCRun is one row of gc_runs.
type GCRun struct {
	ID                 int64              `json:"id"`
	NodeID             string             `json:"node_id"`
	Status             status.GCRunStatus `json:"status"`
	StartedAt          time.Time          `json:"started_at"`
	FinishedAt         *time.Time         `json:"finished_at"`
	Error              string             `json:"error,omitempty"`
	EvaluationsDeleted int64              `json:"evaluations_deleted"`
	JobsDeleted        int64              `json:"jobs_deleted"`
	DerivationsDeleted int64              `json:"derivations_deleted"`
	LogsExpired        int64              `json:"logs_expired"`
	DeliveriesDeleted  int64              `json:"deliveries_deleted"`
	ObjectsScanned     int64              `json:"objects_scanned"`
	ObjectsDeleted     int64              `json:"objects_deleted"`
	BytesDeleted       int64              `json:"bytes_deleted"`
}

// Read reads the overview in one read-only transaction, so its numbers agree with each other.
func Read(ctx context.Context, pool *pgxpool.Pool) (Overview, error) {
	var o Overview
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		return o.read(ctx, tx)
	})
	if err != nil {
		return Overview{}, fmt.Errorf("read overview: %w", err)
	}
	return o, nil
}

func (o *Overview) read(ctx context.Context, tx pgx.Tx) error {
	var oldest *float64
	if err := tx.QueryRow(ctx, sqlReadiness).Scan(&o.Ready, &o.Blocked, &oldest, &o.ReadAt); err != nil {
		return fmt.Errorf("readiness: %w", err)
	}
	if oldest != nil {
		o.OldestReadySeconds = max(*oldest, 0)
	}
	if err := o.readQueue(ctx, tx); err != nil {
		return err
	}
	if err := tx.QueryRow(ctx, sqlEvaluations).Scan(&o.Evaluations.Queued, &o.Evaluations.Running); err != nil {
		return fmt.Errorf("evaluations: %w", err)
	}
	nodes, err := cluster.ListNodes(ctx, tx)
	if err != nil {
		return err
	}
	o.Builders = []Builder{}
	for _, n := range nodes {
		if slices.Contains(n.Roles, config.RoleBuilder) {
			o.Builders = append(o.Builders, Builder{ID: n.ID, Status: n.Status, State: builderState(n), Draining: n.Draining,
				CurrentJobs: n.CurrentJobs, MaxJobs: n.MaxJobs, LastSeenSecondsAgo: n.LastSeenSecondsAgo})
		}
	}
	if o.Leaders, err = cluster.ListLeaders(ctx, tx); err != nil {
		return err
	}
	return o.readGC(ctx, tx)
}

func (o *Overview) readQueue(ctx context.Context, tx pgx.Tx) error {
	rows, err := tx.Query(ctx, sqlQueue)
	if err != nil {
		return fmt.Errorf("queue: %w", err)
	}
	defer rows.Close()
	o.Queue = []SystemQueue{}
	for rows.Next() {
		var system string
		var st status.JobStatus
		var n int64
		if err := rows.Scan(&system, &st, &n); err != nil {
			return fmt.Errorf("queue: %w", err)
		}
		// Rows come ordered by system: a new system starts a new row.
		if len(o.Queue) == 0 || o.Queue[len(o.Queue)-1].System != system {
			o.Queue = append(o.Queue, SystemQueue{System: system})
		}
		q := &o.Queue[len(o.Queue)-1]
		switch st {
		case status.JobPending:
			q.Pending = n
		case status.JobBuilding:
			q.Building = n
		case status.JobUploading:
			q.Uploading = n
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("queue: %w", err)
	}
	return nil
}

func (o *Overview) readGC(ctx context.Context, tx pgx.Tx) error {
	var r GCRun
	err := tx.QueryRow(ctx, sqlLastGC).Scan(&r.ID, &r.NodeID, &r.Status, &r.StartedAt, &r.FinishedAt, &r.Error,
		&r.EvaluationsDeleted, &r.JobsDeleted, &r.DerivationsDeleted, &r.LogsExpired, &r.DeliveriesDeleted,
		&r.ObjectsScanned, &r.ObjectsDeleted, &r.BytesDeleted, &o.GC.LastSucceededAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // never collected
	}
	if err != nil {
		return fmt.Errorf("last garbage collection: %w", err)
	}
	o.GC.Last = &r
	return nil
}

// Slots sums the jobs running and the build slots of the builders that are not dead.
func (o Overview) Slots() (used, total int) {
	for _, b := range o.Builders {
		if b.State != StateDead {
			used += b.CurrentJobs
			total += b.MaxJobs
		}
	}
	return used, total
}

// BuilderStates counts the builders in each state; every state is present.
func (o Overview) BuilderStates() map[string]int {
	m := map[string]int{StateBusy: 0, StateIdle: 0, StateDraining: 0, StateJoining: 0, StateDead: 0}
	for _, b := range o.Builders {
		m[b.State]++
	}
	return m
}

// Totals sums the queue over all systems.
func (o Overview) Totals() SystemQueue {
	t := SystemQueue{System: "total"}
	for _, q := range o.Queue {
		t.Pending += q.Pending
		t.Building += q.Building
		t.Uploading += q.Uploading
	}
	return t
}
