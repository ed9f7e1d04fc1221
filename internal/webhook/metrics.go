package webhook

import (
	"errors"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
)

// Results of a delivery (label result).
const (
	resultAccepted = "accepted" // an evaluation was queued or exists, or discovery started
	resultIgnored  = "ignored"  // verified, but nothing to do (no project, not a build event, …)
	resultReplayed = "replayed" // a delivery id received before
	resultRejected = "rejected" // refused: bad signature, malformed, too large (4xx)
	resultError    = "error"    // the database or the forge failed (5xx)
)

// eventUnknown is the event label of a delivery refused before its event was parsed.
const eventUnknown = "unknown"

var (
	deliveryResults = []string{resultAccepted, resultIgnored, resultReplayed, resultRejected, resultError}
	eventKinds      = []forge.EventKind{forge.EventPush, forge.EventPullRequest, forge.EventComment,
		forge.EventInstallation, forge.EventIgnored}
)

// receiverMetrics are the receiver's series; nil (no registerer) records nothing.
type receiverMetrics struct {
	deliveries *prometheus.CounterVec
	inFlight   prometheus.Gauge
}

func newReceiverMetrics(reg prometheus.Registerer, forges forge.Set) *receiverMetrics {
	if reg == nil {
		return nil
	}
	m := &receiverMetrics{deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "harmonia_ci_webhook_deliveries_total",
		Help: "Webhook deliveries this node received from a configured forge, by forge, event kind (push, pull_request, comment, installation, ignored; unknown when refused before parsing) and result (accepted, ignored, replayed, rejected, error).",
	}, []string{"forge", "event", "result"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "harmonia_ci_webhook_deliveries_in_flight",
			Help: "Webhook deliveries this node is handling now (bounded by frontend.max_webhooks_in_flight).",
		})}
	reg.MustRegister(m.deliveries, m.inFlight)
	// The series an alert watches exist from the start.
	for _, name := range forges.Names() {
		m.deliveries.WithLabelValues(name, eventUnknown, resultRejected)
		for _, k := range eventKinds {
			m.deliveries.WithLabelValues(name, string(k), resultAccepted)
			m.deliveries.WithLabelValues(name, string(k), resultError)
		}
	}
	return m
}

// delivered counts a delivery of a configured forge (its name bounds the label) that ended in
// err, or in result if err is nil.
func (m *receiverMetrics) delivered(forgeName, event, result string, err error) {
	if m == nil {
		return
	}
	if err != nil {
		result = resultError
		var he *httpapi.Error
		if errors.As(err, &he) && he.Code < http.StatusInternalServerError {
			result = resultRejected
		}
	}
	m.deliveries.WithLabelValues(forgeName, event, result).Inc()
}

// flight adds d to the deliveries in flight.
func (m *receiverMetrics) flight(d float64) {
	if m != nil {
		m.inFlight.Add(d)
	}
}
