package eval

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of an evaluation run as the evaluator records them (label outcome).
const (
	outcomeSucceeded = "succeeded"
	outcomeFailed    = "failed"
	outcomeTimeout   = "timeout"   // failed: over its eval-timeout
	outcomeCancelled = "cancelled" // cancelled, superseded or reaped while it ran: no longer ours
	outcomeReleased  = "released"  // handed back to the queue at shutdown or drain
	outcomeConflict  = "conflict"  // a pull request that conflicts with its base: not evaluated
)

var evalOutcomes = []string{outcomeSucceeded, outcomeFailed, outcomeTimeout, outcomeCancelled, outcomeReleased, outcomeConflict}

// EvalDurationBuckets are the buckets of harmonia_ci_evaluation_duration_seconds: 0.5 s to
// about 2.5 h.
var EvalDurationBuckets = prometheus.ExponentialBuckets(0.5, 2.5, 10)

// evalMetrics are an evaluator's series; nil (no registerer) records nothing. Each outcome's
// series is resolved once: an evaluation is rare, but this keeps the label set fixed and
// every series exported from the start.
type evalMetrics struct {
	finished map[string]prometheus.Counter
	duration map[string]prometheus.Observer
	restarts prometheus.Counter
}

func newEvalMetrics(reg prometheus.Registerer) *evalMetrics {
	if reg == nil {
		return nil
	}
	finished := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "harmonia_ci_evaluations_finished_total",
		Help: "Evaluation runs this node's evaluator ended, by outcome: succeeded, failed, timeout (failed over its time limit), cancelled (cancelled, superseded or reaped while it ran), released (handed back to the queue on shutdown), conflict (a pull request that conflicts with its base, not evaluated).",
	}, []string{"outcome"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "harmonia_ci_evaluation_duration_seconds",
		Help:    "Wall time of an evaluation run on this node, from claim to recorded outcome, by outcome.",
		Buckets: EvalDurationBuckets,
	}, []string{"outcome"})
	restarts := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "harmonia_ci_eval_worker_restarts_total",
		Help: "Walker processes this node's evaluator killed and restarted for going past eval.max_memory_per_worker.",
	})
	reg.MustRegister(finished, duration, restarts)
	m := &evalMetrics{finished: map[string]prometheus.Counter{}, duration: map[string]prometheus.Observer{}, restarts: restarts}
	for _, o := range evalOutcomes {
		m.finished[o] = finished.WithLabelValues(o)
		m.duration[o] = duration.WithLabelValues(o)
	}
	return m
}

func (m *evalMetrics) ended(outcome string, elapsed time.Duration) {
	if m == nil {
		return
	}
	m.finished[outcome].Inc()
	m.duration[outcome].Observe(elapsed.Seconds())
}

func (m *evalMetrics) restarted() {
	if m == nil {
		return
	}
	m.restarts.Inc()
}
