package queue

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// MaintenanceConfig configures the queue's leader-only tasks. Zero values take the defaults.
type MaintenanceConfig struct {
	// DeadThreshold: a node silent this long is dead and its claims are reaped. Default
	// cluster.DefaultDeadThreshold.
	DeadThreshold time.Duration
	// ReapInterval between reaper runs. Default 30s.
	ReapInterval time.Duration
	// ReapPage bounds the claims one reaper run releases (it runs again at once if full).
	// Default 1000.
	ReapPage int
	// UnsupportedInterval between unsupported-build checks. Default 5m.
	UnsupportedInterval time.Duration
	// UnsupportedGrace: a job must have waited this long before it can be failed as
	// unsupported, so nodes have time to register after a cluster restart. Default 30m.
	UnsupportedGrace time.Duration
	// DecayInterval between share decays. Default 1h.
	DecayInterval time.Duration
	// DecayFactor multiplies every project's consumed seconds each DecayInterval. Default 0.95.
	DecayFactor float64
	// AuditInterval between checks of the maintained readiness counts. Default 10m.
	AuditInterval time.Duration
	// Registerer, if set, receives the failures the tasks record (unsupported builds, dead
	// nodes' claims out of retries) in harmonia_ci_build_failures_total.
	Registerer prometheus.Registerer
}

func (c *MaintenanceConfig) withDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.DeadThreshold, cluster.DefaultDeadThreshold)
	def(&c.ReapInterval, 30*time.Second)
	def(&c.UnsupportedInterval, 5*time.Minute)
	def(&c.UnsupportedGrace, 30*time.Minute)
	def(&c.DecayInterval, time.Hour)
	def(&c.AuditInterval, 10*time.Minute)
	if c.ReapPage <= 0 {
		c.ReapPage = 1000
	}
	if c.DecayFactor <= 0 || c.DecayFactor > 1 {
		c.DecayFactor = 0.95
	}
}

// MaintenanceTasks returns the queue's leader-only tasks, each run inside the leader's fence:
// the dead-node reaper, unsupported-build detection, share decay, and an audit of the
// maintained readiness counts. Each must run on one node at a time, hence the leader.
func MaintenanceTasks(cfg MaintenanceConfig, logger *slog.Logger) []cluster.Task {
	cfg.withDefaults()
	// Counted once Run returns: the maintainer commits right after, and a rare commit that
	// fails (leadership lost) counts what was rolled back.
	m := newMaintenanceMetrics(cfg.Registerer)
	return []cluster.Task{
		{Name: "reap-dead-claims", Interval: cfg.ReapInterval, Run: func(ctx context.Context, tx pgx.Tx) (int64, error) {
			jobs, err := collectReleased(tx.Query(ctx, sqlReapDeadClaims, cfg.DeadThreshold.Seconds(), cfg.ReapPage))
			if err != nil {
				return 0, fmt.Errorf("reap dead claims: %w", err)
			}
			n, err := afterRelease(ctx, tx, jobs)
			if err != nil {
				return 0, err
			}
			tag, err := tx.Exec(ctx, sqlReapDeadEvals, cfg.DeadThreshold.Seconds())
			if err != nil {
				return 0, fmt.Errorf("reap dead evaluations: %w", err)
			}
			units, err := tx.Exec(ctx, sqlReapDeadUnits, cfg.DeadThreshold.Seconds())
			if err != nil {
				return 0, fmt.Errorf("reap dead evaluation units: %w", err)
			}
			if units.RowsAffected() > 0 {
				logger.Warn("put back the evaluation units of dead nodes", "units", units.RowsAffected())
			}
			m.released("transient", jobs, n)
			if len(jobs) > 0 {
				logger.Warn("reaped the claims of dead nodes", "jobs", len(jobs), "dep_failed", n-int64(len(jobs)))
			}
			return n + tag.RowsAffected() + units.RowsAffected(), nil
		}},
		{Name: "fail-unsupported", Interval: cfg.UnsupportedInterval, Run: func(ctx context.Context, tx pgx.Tx) (int64, error) {
			rows, err := tx.Query(ctx, sqlFailUnsupported, cfg.UnsupportedGrace.Seconds(), cfg.DeadThreshold.Seconds())
			if err != nil {
				return 0, fmt.Errorf("fail unsupported builds: %w", err)
			}
			failed, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (releasedJob, error) {
				j := releasedJob{Status: status.JobFailed}
				return j, row.Scan(&j.ID, &j.DrvPath)
			})
			if err != nil {
				return 0, fmt.Errorf("fail unsupported builds: %w", err)
			}
			for _, j := range failed {
				logger.Warn("failed a build no live node can run", "job_id", j.ID, "drv_path", j.DrvPath)
			}
			n, err := afterRelease(ctx, tx, failed)
			if err != nil {
				return 0, err
			}
			m.released("unsupported", failed, n)
			return n, nil
		}},
		{Name: "decay-shares", Interval: cfg.DecayInterval, Run: func(ctx context.Context, tx pgx.Tx) (int64, error) {
			tag, err := tx.Exec(ctx, sqlDecayShares, cfg.DecayFactor)
			if err != nil {
				return 0, fmt.Errorf("decay shares: %w", err)
			}
			return tag.RowsAffected(), nil
		}},
		{Name: "audit-readiness", Interval: cfg.AuditInterval, Run: func(ctx context.Context, tx pgx.Tx) (int64, error) {
			var fixed int64
			if err := tx.QueryRow(ctx, sqlReadinessAudit, 10000).Scan(&fixed); err != nil {
				return 0, fmt.Errorf("audit readiness: %w", err)
			}
			if fixed > 0 {
				logger.Error("readiness counts disagreed with the dependency graph; recounted", "jobs", fixed)
			}
			return fixed, nil
		}},
	}
}

// releasedJob is a claim given back or failed by maintenance.
type releasedJob struct {
	ID      int64
	Status  status.JobStatus
	System  string
	DrvPath string
}

func collectReleased(rows pgx.Rows, err error) ([]releasedJob, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (releasedJob, error) {
		var j releasedJob
		return j, row.Scan(&j.ID, &j.Status, &j.System, &j.DrvPath)
	})
}

// afterRelease wakes workers for requeued jobs, announces failed ones and propagates their
// failure. It returns the jobs changed, dependents included.
func afterRelease(ctx context.Context, tx pgx.Tx, jobs []releasedJob) (int64, error) {
	var failed []int64
	systems := map[string]bool{}
	for _, j := range jobs {
		if j.Status == status.JobFailed {
			failed = append(failed, j.ID)
			if err := notifyJobs(ctx, tx, map[string]string{"drv_path": j.DrvPath, "status": string(status.JobFailed)}); err != nil {
				return 0, err
			}
		} else if !systems[j.System] {
			systems[j.System] = true
			if err := notifyJobs(ctx, tx, map[string]string{"system": j.System}); err != nil {
				return 0, err
			}
		}
	}
	n, err := propagateFailure(ctx, tx, failed)
	return int64(len(jobs) + n), err
}

// ReleaseNode returns everything a node id holds to the queues: its building and uploading jobs
// go back to pending with a retry counted (or fail, with their dependents, once retries run
// out), its running evaluations are queued again. The registry calls it, in the registration
// transaction, when a node id comes back under a new incarnation.
func ReleaseNode(ctx context.Context, tx pgx.Tx, nodeID string) error {
	jobs, err := collectReleased(tx.Query(ctx, sqlReleaseNodeClaims, nodeID))
	if err != nil {
		return fmt.Errorf("release claims of node %s: %w", nodeID, err)
	}
	if _, err := afterRelease(ctx, tx, jobs); err != nil {
		return fmt.Errorf("release claims of node %s: %w", nodeID, err)
	}
	if _, err := tx.Exec(ctx, sqlReleaseNodeEvals, nodeID); err != nil {
		return fmt.Errorf("release evaluations of node %s: %w", nodeID, err)
	}
	if _, err := tx.Exec(ctx, sqlReleaseNodeUnits, nodeID); err != nil {
		return fmt.Errorf("release evaluation units of node %s: %w", nodeID, err)
	}
	return nil
}
