package cluster

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// Metrics are the cluster's Prometheus series: leadership per role plus membership.
type Metrics struct {
	isLeader          *prometheus.GaugeVec
	elections         *prometheus.CounterVec
	failovers         *prometheus.CounterVec
	tenure            *prometheus.GaugeVec
	stepDowns         *prometheus.CounterVec
	fencedWrites      *prometheus.CounterVec
	heartbeatFailures prometheus.Counter
}

// NewMetrics registers the cluster series with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		isLeader: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "harmonia_ci_leader_is_leader", Help: "1 if this node leads the role, else 0.",
		}, []string{"role"}),
		elections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "harmonia_ci_leader_elections_total", Help: "Election attempts made by this node.",
		}, []string{"role"}),
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "harmonia_ci_leader_failovers_total", Help: "Times this node took over a role whose previous leader had not resigned.",
		}, []string{"role"}),
		tenure: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "harmonia_ci_leader_tenure_seconds", Help: "How long this node has led the role; 0 when it does not.",
		}, []string{"role"}),
		stepDowns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "harmonia_ci_leader_step_downs_total", Help: "Terms ended by this node, by kind (resign or lost).",
		}, []string{"role", "kind"}),
		fencedWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "harmonia_ci_leader_fenced_writes_total", Help: "Leader-only writes refused because the term no longer held.",
		}, []string{"role"}),
		heartbeatFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "harmonia_ci_heartbeat_failures_total", Help: "Heartbeats that failed to reach the database.",
		}),
	}
	reg.MustRegister(m.isLeader, m.elections, m.failovers, m.tenure, m.stepDowns, m.fencedWrites, m.heartbeatFailures)
	return m
}

// NodeCountCollector reports harmonia_ci_nodes{status} from the database at scrape time, so
// every node's /metrics agrees on the cluster's membership.
type NodeCountCollector struct {
	pool *pgxpool.Pool
	desc *prometheus.Desc
	up   *prometheus.Desc
}

// NewNodeCountCollector builds the collector; register it with the node's registry.
func NewNodeCountCollector(pool *pgxpool.Pool) *NodeCountCollector {
	return &NodeCountCollector{
		pool: pool,
		desc: prometheus.NewDesc("harmonia_ci_nodes", "Nodes in the cluster by status.", []string{"status"}, nil),
		up:   prometheus.NewDesc("harmonia_ci_database_up", "1 if the database answered the last scrape.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *NodeCountCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc; ch <- c.up }

// Collect implements prometheus.Collector.
func (c *NodeCountCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	counts := map[status.NodeStatus]int64{}
	for _, s := range status.AllNodes() {
		counts[s] = 0
	}
	rows, err := c.pool.Query(ctx, sqlNodesCountByStatus)
	if err == nil {
		err = forEachRow(rows, func(row pgx.CollectableRow) error {
			var s status.NodeStatus
			var n int64
			if err := row.Scan(&s, &n); err != nil {
				return err
			}
			counts[s] = n
			return nil
		})
	}
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	for s, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), string(s))
	}
}

func forEachRow(rows pgx.Rows, fn func(pgx.CollectableRow) error) error {
	_, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (struct{}, error) {
		return struct{}{}, fn(row)
	})
	return err
}
