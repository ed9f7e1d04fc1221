// Package metrics exports the cluster's queue, evaluation, node and project state as Prometheus
// gauges read from the database at scrape time (Collector), so every node's /metrics agrees on
// it. Counters and histograms of the code paths live in the packages that own those paths.
package metrics

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// ScrapeTimeout bounds the collector's query; a slower database yields no values and an error.
const ScrapeTimeout = 2 * time.Second

// Collector reports the cluster's state from the database with one query per scrape. Every node
// registers it: the query is cheap (partial indexes and small tables), and any node can then be
// scraped for the whole cluster.
type Collector struct {
	pool *pgxpool.Pool

	jobs         *prometheus.Desc
	ready        *prometheus.Desc
	blocked      *prometheus.Desc
	oldestReady  *prometheus.Desc
	nodeJobs     *prometheus.Desc
	nodeMaxJobs  *prometheus.Desc
	consumed     *prometheus.Desc
	evaluations  *prometheus.Desc
	gcSuccess    *prometheus.Desc
	scrapeErrors prometheus.Counter
}

// NewCollector builds the collector; register it with the node's registry.
func NewCollector(pool *pgxpool.Pool) *Collector {
	const cluster = " Read from the database at scrape time; the same on every node."
	return &Collector{
		pool: pool,
		jobs: prometheus.NewDesc("harmonia_ci_build_jobs",
			"Build jobs in a live status (pending, building, uploading) by status and system."+cluster,
			[]string{"status", "system"}, nil),
		ready: prometheus.NewDesc("harmonia_ci_build_jobs_ready",
			"Pending build jobs whose inputs have all succeeded (claimable)."+cluster, nil, nil),
		blocked: prometheus.NewDesc("harmonia_ci_build_jobs_blocked",
			"Pending build jobs waiting for at least one input job."+cluster, nil, nil),
		oldestReady: prometheus.NewDesc("harmonia_ci_oldest_ready_job_age_seconds",
			"Age since creation of the oldest ready build job; 0 when none is ready."+cluster, nil, nil),
		nodeJobs: prometheus.NewDesc("harmonia_ci_node_jobs",
			"Jobs a live builder node runs, as of its last heartbeat."+cluster, []string{"node"}, nil),
		nodeMaxJobs: prometheus.NewDesc("harmonia_ci_node_max_jobs",
			"Build slots of a live builder node."+cluster, []string{"node"}, nil),
		consumed: prometheus.NewDesc("harmonia_ci_project_consumed_seconds",
			"Builder time charged to a project, decayed over time (its fair-share usage); a private or disabled project is labelled #<id>, never by name."+cluster,
			[]string{"project"}, nil),
		gcSuccess: prometheus.NewDesc("harmonia_ci_gc_last_success_timestamp_seconds",
			"When the last garbage collection that succeeded finished (Unix time); absent before the first."+cluster, nil, nil),
		evaluations: prometheus.NewDesc("harmonia_ci_evaluations",
			"Evaluations queued or running."+cluster, []string{"status"}, nil),
		scrapeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "harmonia_ci_scrape_errors_total",
			Help: "Scrapes whose database query failed or timed out (they report no cluster state).",
		}),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.jobs, c.ready, c.blocked, c.oldestReady, c.nodeJobs, c.nodeMaxJobs, c.consumed, c.evaluations, c.gcSuccess} {
		ch <- d
	}
	c.scrapeErrors.Describe(ch)
}

type sample struct {
	desc   *prometheus.Desc
	value  float64
	labels []string
}

// Collect implements prometheus.Collector. On an error it reports only the error counter, never
// partial or stale values.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	samples, err := c.snapshot()
	if err != nil {
		c.scrapeErrors.Inc()
	}
	c.scrapeErrors.Collect(ch)
	for _, s := range samples {
		ch <- prometheus.MustNewConstMetric(s.desc, prometheus.GaugeValue, s.value, s.labels...)
	}
}

func (c *Collector) snapshot() ([]sample, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ScrapeTimeout)
	defer cancel()
	rows, err := c.pool.Query(ctx, sqlSnapshot)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	// Every live status is reported, 0 included, for each system that has a live job.
	jobs := map[[2]string]float64{}
	evals := map[string]float64{}
	for _, s := range status.UnfinishedEvals() {
		evals[string(s)] = 0
	}
	var out []sample
	for rows.Next() {
		var kind, a, b string
		var v float64
		if err := rows.Scan(&kind, &a, &b, &v); err != nil {
			return nil, err
		}
		switch kind {
		case "jobs":
			jobs[[2]string{a, b}] = v
		case "ready":
			out = append(out, sample{desc: c.ready, value: v})
		case "blocked":
			out = append(out, sample{desc: c.blocked, value: v})
		case "oldest_ready":
			out = append(out, sample{desc: c.oldestReady, value: v})
		case "node_jobs":
			out = append(out, sample{desc: c.nodeJobs, value: v, labels: []string{a}})
		case "node_max_jobs":
			out = append(out, sample{desc: c.nodeMaxJobs, value: v, labels: []string{a}})
		case "project":
			out = append(out, sample{desc: c.consumed, value: v, labels: []string{a}})
		case "evals":
			evals[a] = v
		case "gc_last_success":
			out = append(out, sample{desc: c.gcSuccess, value: v})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	systems := map[string]bool{}
	for k := range jobs {
		systems[k[1]] = true
	}
	for system := range systems {
		for _, s := range status.UnfinishedJobs() {
			out = append(out, sample{desc: c.jobs, value: jobs[[2]string{string(s), system}], labels: []string{string(s), system}})
		}
	}
	for s, v := range evals {
		out = append(out, sample{desc: c.evaluations, value: v, labels: []string{s}})
	}
	return out, nil
}
