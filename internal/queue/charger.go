package queue

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
)

// Charger adds builder time to projects' consumed_seconds, the measure fair shares are computed
// from, in batches:
// one statement per flush for all projects, instead of one row update per finished job, which
// would make every finishing worker of a project queue on that project's row.
type Charger struct {
	mu      sync.Mutex
	pending map[int64]float64
}

// Add records seconds of builder time for project (nil: no project, nothing to charge).
func (c *Charger) Add(project *int64, seconds float64) {
	if project == nil || seconds <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending == nil {
		c.pending = map[int64]float64{}
	}
	c.pending[*project] += seconds
}

// Flush writes what was recorded since the last flush. On failure the amounts are kept for the
// next flush.
func (c *Charger) Flush(ctx context.Context, q db.DBTX) error {
	c.mu.Lock()
	pending := c.pending
	c.pending = nil
	c.mu.Unlock()
	if len(pending) == 0 {
		return nil
	}
	// Rows are locked in id order so that concurrent flushes cannot deadlock.
	ids := slices.Sorted(maps.Keys(pending))
	secs := make([]float64, len(ids))
	for i, id := range ids {
		secs[i] = pending[id]
	}
	if _, err := q.Exec(ctx, sqlProjectsCharge, ids, secs); err != nil {
		c.mu.Lock()
		for i, id := range ids {
			if c.pending == nil {
				c.pending = map[int64]float64{}
			}
			c.pending[id] += secs[i]
		}
		c.mu.Unlock()
		return fmt.Errorf("charge builder time to projects: %w", err)
	}
	return nil
}
