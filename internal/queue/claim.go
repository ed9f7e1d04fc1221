package queue

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
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

// Querier runs queries; a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// ClaimJobs claims up to limit ready jobs for c in one statement: building, claimed by c's node,
// started now, attempt incremented. Callers must not claim while draining or with no free slot
// (the Worker enforces both).
func ClaimJobs(ctx context.Context, q Querier, c Claimer, limit int) ([]Job, error) {
	return claimJobs(ctx, q, c, limit, ClaimReady)
}

func claimJobs(ctx context.Context, q Querier, c Claimer, limit int, form ClaimForm) ([]Job, error) {
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

// SucceedAndClaim records c's success and claims up to limit jobs for next in one round trip
// and one transaction: a worker whose slot the success frees fills it without a second commit.
// The claim runs after the success within the transaction, so it already sees the
// dependents the success readied. A claim that no longer held returns the claimed jobs (they
// are next's either way) with an error wrapping ErrStale; any other error means nothing
// was recorded and nothing claimed.
func SucceedAndClaim(ctx context.Context, pool *pgxpool.Pool, c Claim, next Claimer, limit int) (Outcome, []Job, error) {
	b := &pgx.Batch{}
	b.Queue(sqlJobSucceed, c.JobID, c.NodeID, c.Attempt, nil, cluster.LockClass)
	b.Queue(sqlClaim, next.Systems, next.features(), next.NodeID, limit, limit)
	br := pool.SendBatch(ctx, b)
	out := Outcome{Status: status.JobSucceeded}
	err := br.QueryRow().Scan(&out.ProjectID, &out.Seconds, &out.DrvPath)
	stale := errors.Is(err, pgx.ErrNoRows)
	var jobs []Job
	if err == nil || stale {
		var rows pgx.Rows
		if rows, err = br.Query(); err == nil {
			jobs, err = collectJobs(rows, next.NodeID)
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
		return Outcome{}, nil, fmt.Errorf("succeed %s and claim: %w", c, err)
	case stale:
		return Outcome{}, jobs, fmt.Errorf("succeed %s: %w", c, ErrStale)
	}
	return out, jobs, nil
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
