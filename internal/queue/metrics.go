package queue

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// workerMetrics are a builder's queue series; nil (no registerer) records nothing.
type workerMetrics struct {
	claims      prometheus.Counter
	claimTime   prometheus.Histogram
	claimedJobs *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	failures    *prometheus.CounterVec
}

// BuildDurationBuckets are the buckets of harmonia_ci_build_duration_seconds: 1 s to about 4.5 h.
var BuildDurationBuckets = prometheus.ExponentialBuckets(1, 2.5, 10)

func newWorkerMetrics(reg prometheus.Registerer) *workerMetrics {
	if reg == nil {
		return nil
	}
	m := &workerMetrics{
		claims: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "harmonia_ci_claims_total", Help: "Claim statements this node's builder ran (each may claim several jobs, or none).",
		}),
		claimTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "harmonia_ci_claim_duration_seconds", Help: "Latency of this node's builder's claim statements.",
			Buckets: prometheus.ExponentialBuckets(0.001, 3, 10),
		}),
		claimedJobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "harmonia_ci_claimed_jobs_total", Help: "Build jobs this node's builder claimed, by system.",
		}, []string{"system"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "harmonia_ci_build_duration_seconds", Help: "Wall time of a build attempt on this node, from claim to recorded result, by system and result (succeeded or failed).",
			Buckets: BuildDurationBuckets,
		}, []string{"system", "result"}),
	}
	reg.MustRegister(m.claims, m.claimTime, m.claimedJobs, m.duration)
	m.failures = failureCounter(reg)
	return m
}

// failureKinds are the kinds of harmonia_ci_build_failures_total, every one exported from the
// start.
var failureKinds = []string{"permanent", "transient", "timeout", "unsupported", "dep-failed"}

// failureCounter registers harmonia_ci_build_failures_total with reg, or returns the one
// registered already: a builder's worker and the maintenance leader of the same node share it.
func failureCounter(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "harmonia_ci_build_failures_total",
		Help: "Build failures recorded by this node, by kind: a builder's failed attempts (permanent, transient, timeout), " +
			"the maintenance leader's (unsupported: no live node can run the build; transient: a dead node's claim out of retries), " +
			"and the jobs either marked dep-failed (dep-failed). Each failure counts once, on the node that recorded it.",
	}, []string{"kind"})
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			panic(err)
		}
		c = are.ExistingCollector.(*prometheus.CounterVec)
	}
	for _, k := range failureKinds {
		c.WithLabelValues(k)
	}
	return c
}

// maintenanceMetrics count the failures the maintenance leader records; nil records nothing.
type maintenanceMetrics struct {
	failures *prometheus.CounterVec
}

func newMaintenanceMetrics(reg prometheus.Registerer) *maintenanceMetrics {
	if reg == nil {
		return nil
	}
	return &maintenanceMetrics{failures: failureCounter(reg)}
}

// released counts what a maintenance task did to jobs: those it failed count as kind (the others
// went back to the queue), and changed minus jobs, the dependents marked dep-failed.
func (m *maintenanceMetrics) released(kind string, jobs []releasedJob, changed int64) {
	if m == nil {
		return
	}
	for _, j := range jobs {
		if j.Status == status.JobFailed {
			m.failures.WithLabelValues(kind).Inc()
		}
	}
	m.failures.WithLabelValues("dep-failed").Add(float64(changed - int64(len(jobs))))
}

func (m *workerMetrics) claimed(latency time.Duration, jobs []Job) {
	if m == nil {
		return
	}
	m.claims.Inc()
	m.claimTime.Observe(latency.Seconds())
	for _, j := range jobs {
		m.claimedJobs.WithLabelValues(j.System).Inc()
	}
}

// finished records an attempt whose result was recorded: res.Err nil is a success.
func (m *workerMetrics) finished(job Job, res Result, elapsed time.Duration, depFailed int) {
	if m == nil {
		return
	}
	if res.Err == nil {
		m.duration.WithLabelValues(job.System, "succeeded").Observe(elapsed.Seconds())
		return
	}
	m.duration.WithLabelValues(job.System, "failed").Observe(elapsed.Seconds())
	m.failures.WithLabelValues(failureKind(res)).Inc()
	if depFailed > 0 {
		m.failures.WithLabelValues("dep-failed").Add(float64(depFailed))
	}
}

// failureKind is "timeout" for an error that says it timed out (a build over its time or
// silence limit), else the kind the handler gave.
func failureKind(res Result) string {
	var to interface{ Timeout() bool }
	if errors.As(res.Err, &to) && to.Timeout() {
		return "timeout"
	}
	if res.Kind == Permanent {
		return "permanent"
	}
	return "transient"
}
