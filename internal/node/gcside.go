package node

import (
	"log/slog"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/gc"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
)

// gcElector stands the node for the GC leader role: only nodes holding the cache's blob store
// with the signer role (the zone that may write, and so delete, cache objects) collect.
func (n *node) gcElector(store blob.Store, notifier *notify.Notifier, lockConn *cluster.LockConn, id cluster.Identity, clusterMetrics *cluster.Metrics) (*cluster.Elector, error) {
	r := n.cfg.Retention
	collector, err := gc.New(gc.Config{
		Store: store, Retention: r.Default.Duration, MaxRetention: r.Max.Duration, LogRetention: r.LogRetention.Duration,
		Grace: r.Grace.Duration, Logger: n.logger, Metrics: gc.NewMetrics(n.reg),
	}, n.pool)
	if err != nil {
		return nil, err
	}
	wake, err := notifier.Subscribe(gc.WakeChannel)
	if err != nil {
		return nil, err
	}
	maint := cluster.NewMaintainer(n.pool, []cluster.Task{gc.Task(collector, n.pool, r.GCInterval.Duration, wake.C)}, n.logger, n.clock)
	le := n.cfg.Cluster.LeaderElection
	return cluster.NewElector(cluster.ElectorConfig{
		Role: cluster.RoleGC, CheckInterval: le.CheckInterval.Duration,
		LeaseDuration: le.LeaseDuration.Duration, RefreshInterval: le.RefreshInterval.Duration,
		LeaderFunc: maint.Lead, Notifier: notifier,
	}, n.pool, lockConn, id, clusterMetrics, n.logger, n.clock)
}

// OpenStore opens the binary cache's blob store as configured, for one-shot commands
// (harmonia-ci gc --dry-run) that read it.
func OpenStore(cfg *config.Config, logger *slog.Logger) (blob.Store, error) {
	st, _, err := openStore(cfg, "", logger)
	return st, err
}
