package signer

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
)

// Endpoints of the signer (label endpoint).
const (
	endpointUploadSlots   = "upload-slots"
	endpointBuildComplete = "build-complete"
	endpointPublish       = "publish"
	endpointCacheLookup   = "cache-lookup"
	endpointEvalTicket    = "eval-ticket"
	endpointCheckTicket   = "eval-ticket-check"
	endpointCheckNode     = "node-token-check"
)

var (
	endpoints = []string{endpointUploadSlots, endpointBuildComplete, endpointPublish, endpointCacheLookup, endpointEvalTicket, endpointCheckTicket, endpointCheckNode}
	// codeNames are the classes the signer answers with: JSON or an error, never 1xx or 3xx.
	codeNames = [...]string{"2xx", "4xx", "5xx"}
)

// signerMetrics are the signer's series; nil (no registerer) records nothing.
type signerMetrics struct {
	requests  map[string]*[len(codeNames)]prometheus.Counter // by endpoint, then code class
	narinfos  map[publishResult]prometheus.Counter
	uploadNAR prometheus.Counter
	uploadLog prometheus.Counter
	uploadDrv prometheus.Counter
	flaky     prometheus.Counter
}

func newSignerMetrics(reg prometheus.Registerer) *signerMetrics {
	if reg == nil {
		return nil
	}
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "harmonia_ci_signer_requests_total",
		Help: "Requests this node's signer answered, by endpoint (upload-slots, build-complete, publish, cache-lookup, eval-ticket, eval-ticket-check) and HTTP status class (2xx, 4xx, 5xx).",
	}, []string{"endpoint", "code"})
	narinfos := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "harmonia_ci_signer_narinfos_total",
		Help: "Narinfos this node's signer published, by result: written (signed and stored), skipped (the cache had it with the same NAR hash), conflict (the cache had another NAR: a non-reproducible build, the first is kept), rewritten (a trusted build replaced a quarantined output's narinfo with another NAR).",
	}, []string{"result"})
	uploads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "harmonia_ci_signer_upload_bytes_total",
		Help: "Bytes written to the cache through this node's signer, by kind: nar and log are the declared sizes of the uploads it presigned (the store enforces them), drv the .drv NARs it wrote itself.",
	}, []string{"kind"})
	flaky := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "harmonia_ci_builds_flaky_total",
		Help: "Builds this node's signer recorded as succeeded after an earlier attempt at the same derivation failed (flaky builds).",
	})
	reg.MustRegister(requests, narinfos, uploads, flaky)
	m := &signerMetrics{
		requests: map[string]*[len(codeNames)]prometheus.Counter{},
		narinfos: map[publishResult]prometheus.Counter{
			written: narinfos.WithLabelValues("written"), skipped: narinfos.WithLabelValues("skipped"),
			conflict: narinfos.WithLabelValues("conflict"), rewritten: narinfos.WithLabelValues("rewritten"),
		},
		uploadNAR: uploads.WithLabelValues("nar"), uploadLog: uploads.WithLabelValues("log"),
		uploadDrv: uploads.WithLabelValues("drv"), flaky: flaky,
	}
	for _, e := range endpoints {
		var byCode [len(codeNames)]prometheus.Counter
		for i, c := range codeNames {
			byCode[i] = requests.WithLabelValues(e, c)
		}
		m.requests[e] = &byCode
	}
	return m
}

// answered counts a request of endpoint answered with code.
func (m *signerMetrics) answered(endpoint string, code int) {
	if m == nil {
		return
	}
	class := 2 // 5xx, and anything unexpected
	switch code / 100 {
	case 2:
		class = 0
	case 4:
		class = 1
	}
	m.requests[endpoint][class].Inc()
}

func (m *signerMetrics) published(results []publishResult) {
	if m == nil {
		return
	}
	for _, r := range results {
		m.narinfos[r].Inc()
	}
}

// The upload counters; each takes a size in bytes.
func (m *signerMetrics) narGranted(n int64) {
	if m != nil {
		m.uploadNAR.Add(float64(n))
	}
}

func (m *signerMetrics) logGranted(n int64) {
	if m != nil {
		m.uploadLog.Add(float64(n))
	}
}

// flakySucceeded counts a success of a job that failed before.
func (m *signerMetrics) flakySucceeded() {
	if m != nil {
		m.flaky.Inc()
	}
}

func (m *signerMetrics) drvWritten(n int64) {
	if m != nil {
		m.uploadDrv.Add(float64(n))
	}
}

// statusRecorder remembers the status code a handler answered with.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
