package commitstatus

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// reporterMetrics are the reporter's series, resolved per configured forge (its name bounds the
// label); nil (no registerer) records nothing.
type reporterMetrics struct {
	ok, failed map[string]prometheus.Counter
	latency    map[string]prometheus.Observer
}

func newReporterMetrics(reg prometheus.Registerer, forges []string) *reporterMetrics {
	if reg == nil {
		return nil
	}
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "harmonia_ci_commit_status_calls_total",
		Help: "Commit statuses this node sent to a forge, by forge and result (ok, error: the forge refused or did not answer; the delivery is retried).",
	}, []string{"forge", "result"})
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "harmonia_ci_commit_status_call_duration_seconds",
		Help:    "Latency of the commit status calls this node made to a forge, by forge.",
		Buckets: prometheus.ExponentialBuckets(0.01, 2.5, 10),
	}, []string{"forge"})
	reg.MustRegister(calls, latency)
	m := &reporterMetrics{ok: map[string]prometheus.Counter{}, failed: map[string]prometheus.Counter{},
		latency: map[string]prometheus.Observer{}}
	for _, f := range forges {
		m.ok[f] = calls.WithLabelValues(f, "ok")
		m.failed[f] = calls.WithLabelValues(f, "error")
		m.latency[f] = latency.WithLabelValues(f)
	}
	return m
}

// called records one forge call of forgeName that took elapsed and returned err.
func (m *reporterMetrics) called(forgeName string, elapsed time.Duration, err error) {
	if m == nil || m.latency[forgeName] == nil {
		return
	}
	m.latency[forgeName].Observe(elapsed.Seconds())
	if err != nil {
		m.failed[forgeName].Inc()
		return
	}
	m.ok[forgeName].Inc()
}
