package queue

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
)

// Claimer is what a worker offers: its node, systems and features.
type Claimer struct {
	NodeID   string
	Systems  []string
	Features []string
}

// ClaimForm selects the claim statement.
type ClaimForm int

const (
	// ClaimReady reads the maintained readiness (the default, and what nodes use).
	ClaimReady ClaimForm = iota
	// ClaimNotExists checks readiness with NOT EXISTS per candidate, in priority order, which
	// scans past every blocked job; kept so the benchmark can show why it is not used.
	ClaimNotExists
)

// ClaimJobs claims up to limit ready jobs for c in one statement: building, claimed by c's node,
// started now, attempt incremented. Callers must not claim while draining or with no free slot
// (the Worker enforces both).
func ClaimJobs(ctx context.Context, q db.DBTX, c Claimer, limit int) ([]Job, error) {
	return claimJobs(ctx, q, c, limit, ClaimReady)
}

func claimJobs(ctx context.Context, q db.DBTX, c Claimer, limit int, form ClaimForm) ([]Job, error) {
	if limit <= 0 {
		return nil, nil
	}
	var rows pgx.Rows
	var err error
	switch form {
	case ClaimNotExists:
		rows, err = q.Query(ctx, sqlClaimNotExists, c.Systems, c.features(), c.NodeID, limit)
	default:
		rows, err = q.Query(ctx, sqlClaim, c.Systems, c.features(), c.NodeID, limit, limit)
	}
	if err != nil {
		return nil, fmt.Errorf("claim jobs for %s: %w", c.NodeID, err)
	}
	jobs, err := collectJobs(rows, c.NodeID)
	if err != nil {
		return nil, fmt.Errorf("claim jobs for %s: %w", c.NodeID, err)
	}
	return jobs, nil
}

func (c Claimer) features() []string {
	if c.Features == nil {
		return []string{}
	}
	return c.Features
}

func collectJobs(rows pgx.Rows, node string) ([]Job, error) {
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Job, error) {
		j := Job{NodeID: node}
		err := row.Scan(&j.ID, &j.DrvPath, &j.System, &j.ProjectID, &j.Priority, &j.Attempt,
			&j.RetryCount, &j.RequiredFeatures, &j.ClaimedAt)
		return j, err
	})
}
