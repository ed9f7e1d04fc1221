package gc

import "github.com/prometheus/client_golang/prometheus"

// Metrics counts what the collector did on this node (the GC leader's). When the cluster last
// collected successfully is exported from the database by every node (package metrics), so an
// alert does not depend on which node leads.
type Metrics struct {
	runs          *prometheus.CounterVec
	rows          *prometheus.CounterVec
	objects       *prometheus.CounterVec
	bytes         *prometheus.CounterVec
	scanned       prometheus.Counter
	duration      prometheus.Histogram
	liveSetQuery  prometheus.Histogram
	narInfoReads  prometheus.Counter
	succeededRuns prometheus.Counter
	failedRuns    prometheus.Counter
}

// NewMetrics registers the collector's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "harmonia_ci_gc_runs_total", Help: "Garbage collections run on this node, by result.",
		}, []string{"result"}),
		rows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "harmonia_ci_gc_deleted_rows_total", Help: "Database rows the garbage collector deleted, by table (build_logs: logs expired).",
		}, []string{"table"}),
		objects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "harmonia_ci_gc_deleted_objects_total", Help: "Cache objects the garbage collector deleted, by kind.",
		}, []string{"kind"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "harmonia_ci_gc_deleted_bytes_total", Help: "Bytes of the cache objects the garbage collector deleted, by kind.",
		}, []string{"kind"}),
		scanned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "harmonia_ci_gc_scanned_objects_total", Help: "Cache objects the garbage collector listed.",
		}),
		narInfoReads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "harmonia_ci_gc_narinfo_reads_total", Help: "Narinfos the garbage collector read to follow references.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "harmonia_ci_gc_duration_seconds", Help: "Duration of a garbage collection.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 8), // 1s .. ~4.5h
		}),
		liveSetQuery: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "harmonia_ci_gc_live_set_query_seconds", Help: "Database time of the garbage collector's live-set query.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 8), // 10ms .. ~3min
		}),
	}
	reg.MustRegister(m.runs, m.rows, m.objects, m.bytes, m.scanned, m.narInfoReads, m.duration, m.liveSetQuery)
	m.succeededRuns, m.failedRuns = m.runs.WithLabelValues("succeeded"), m.runs.WithLabelValues("failed")
	for _, k := range []string{kindNarInfo, kindNAR, kindListing, kindLog, kindRealisation} {
		m.objects.WithLabelValues(k)
		m.bytes.WithLabelValues(k)
	}
	for _, t := range []string{"evaluations", "build_jobs", "derivations", "build_logs", "webhook_deliveries"} {
		m.rows.WithLabelValues(t)
	}
	return m
}

// observe records a finished run.
func (m *Metrics) observe(r *Report, err error) {
	if m == nil || r == nil {
		return
	}
	if err != nil {
		m.failedRuns.Inc()
	} else {
		m.succeededRuns.Inc()
	}
	m.rows.WithLabelValues("evaluations").Add(float64(r.Evaluations))
	m.rows.WithLabelValues("build_jobs").Add(float64(r.Jobs))
	m.rows.WithLabelValues("derivations").Add(float64(r.Derivations))
	m.rows.WithLabelValues("build_logs").Add(float64(r.LogsExpired))
	m.rows.WithLabelValues("webhook_deliveries").Add(float64(r.Deliveries))
	for k, c := range r.Deleted {
		m.objects.WithLabelValues(k).Add(float64(c.Objects))
		m.bytes.WithLabelValues(k).Add(float64(c.Bytes))
	}
	m.scanned.Add(float64(r.Scanned))
	m.narInfoReads.Add(float64(r.NarInfoReads))
	m.duration.Observe(r.Duration.Seconds())
	m.liveSetQuery.Observe(r.LiveSetQuery.Seconds())
}
