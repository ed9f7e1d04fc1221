package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/status"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
)

// NodeStatus is one row of the nodes table as operators see it.
type NodeStatus struct {
	ID                 string            `json:"id"`
	Status             status.NodeStatus `json:"status"`
	Roles              []string          `json:"roles"`
	Draining           bool              `json:"draining"`
	LastSeen           time.Time         `json:"last_seen"`
	LastSeenSecondsAgo float64           `json:"last_seen_seconds_ago"`
	CurrentJobs        int               `json:"current_jobs"`
	MaxJobs            int               `json:"max_jobs"`
	Endpoint           string            `json:"endpoint"`
	Hostname           string            `json:"hostname"`
	Version            string            `json:"version"`
	Incarnation        uuid.UUID         `json:"incarnation"`
	StartedAt          time.Time         `json:"started_at"`
	Systems            []string          `json:"systems"`
	Features           []string          `json:"features"`
	CPUUsage           float32           `json:"cpu_usage"`
	MemoryUsage        float32           `json:"memory_usage"`
	NixInfo
}

// LeaderStatus is one row of the leaders table. Valid is false once the lease has run out or
// was resigned: the role then has no leader until a standby takes it.
type LeaderStatus struct {
	Role        string    `json:"role"`
	NodeID      string    `json:"node_id"`
	Incarnation uuid.UUID `json:"incarnation"`
	Epoch       int64     `json:"epoch"`
	AcquiredAt  time.Time `json:"acquired_at"`
	RenewedAt   time.Time `json:"renewed_at"`
	LeaseUntil  time.Time `json:"lease_until"`
	Valid       bool      `json:"valid"`
}

// Status is the cluster as `harmonia-ci cluster status` shows it.
type Status struct {
	Nodes   []NodeStatus              `json:"nodes"`
	Leaders []LeaderStatus            `json:"leaders"`
	Counts  map[status.NodeStatus]int `json:"counts"`
}

// ListNodes reads every node row, ordered by id.
func ListNodes(ctx context.Context, q db.DBTX) ([]NodeStatus, error) {
	rows, err := q.Query(ctx, sqlNodesList)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	nodes, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (NodeStatus, error) {
		var n NodeStatus
		err := row.Scan(&n.ID, &n.Status, &n.Roles, &n.Draining, &n.LastSeen, &n.CurrentJobs, &n.MaxJobs,
			&n.Endpoint, &n.Hostname, &n.Version, &n.Incarnation, &n.StartedAt, &n.Systems, &n.Features,
			&n.CPUUsage, &n.MemoryUsage, &n.LastSeenSecondsAgo, &n.NixInfo.Version, &n.NixInfo.Protocol)
		return n, err
	})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return nodes, nil
}

// ListLeaders reads every leader role's lease row, ordered by role.
func ListLeaders(ctx context.Context, q db.DBTX) ([]LeaderStatus, error) {
	rows, err := q.Query(ctx, sqlLeadersList)
	if err != nil {
		return nil, fmt.Errorf("list leaders: %w", err)
	}
	leaders, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (LeaderStatus, error) {
		var l LeaderStatus
		err := row.Scan(&l.Role, &l.NodeID, &l.Incarnation, &l.Epoch, &l.AcquiredAt, &l.RenewedAt, &l.LeaseUntil, &l.Valid)
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("list leaders: %w", err)
	}
	return leaders, nil
}

// ReadStatus reads nodes and leaders.
func ReadStatus(ctx context.Context, q db.DBTX) (Status, error) {
	var s Status
	var err error
	if s.Nodes, err = ListNodes(ctx, q); err != nil {
		return s, err
	}
	if s.Leaders, err = ListLeaders(ctx, q); err != nil {
		return s, err
	}
	s.Counts = map[status.NodeStatus]int{}
	for _, st := range status.AllNodes() {
		s.Counts[st] = 0
	}
	for _, n := range s.Nodes {
		s.Counts[n.Status]++
	}
	return s, nil
}
