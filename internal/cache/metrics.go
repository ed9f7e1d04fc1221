package cache

import (
	"errors"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
)

// objectKind is what a request asked for (label kind). The cache serves no realisations
// (content-addressed derivations are not built), so there is no such kind.
type objectKind int

const (
	kindNarinfo objectKind = iota
	kindNAR
	kindListing
	kindLog
	kindCacheInfo
	numKinds
)

var kindNames = [numKinds]string{"narinfo", "nar", "ls", "log", "nix-cache-info"}

// result is how a request was answered (label result).
type result int

const (
	resultHit   result = iota // the object was sent (or its headers, for HEAD)
	resultMiss                // 404, or a name that cannot be in the cache (400)
	resultError               // the store failed (5xx)
	numResults
)

var resultNames = [numResults]string{"hit", "miss", "error"}

// cacheMetrics are the cache's series, every one resolved at start: a Nix client asks for
// thousands of narinfos a second, and a request costs two atomic adds, no label lookup. nil
// (no registerer) records nothing.
type cacheMetrics struct {
	requests [numKinds][numResults]prometheus.Counter
	sent     [numKinds]prometheus.Counter
}

func newCacheMetrics(reg prometheus.Registerer) *cacheMetrics {
	if reg == nil {
		return nil
	}
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "harmonia_ci_cache_requests_total",
		Help: "Binary cache requests this node answered, by object kind (narinfo, nar, ls, log, nix-cache-info) and result (hit, miss: not found or not a valid name, error: the store failed).",
	}, []string{"kind", "result"})
	bytes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "harmonia_ci_cache_response_bytes_total",
		Help: "Body bytes this node's binary cache sent, by object kind (logs as sent: compressed or not).",
	}, []string{"kind"})
	reg.MustRegister(requests, bytes)
	m := &cacheMetrics{}
	for k := range numKinds {
		for r := range numResults {
			m.requests[k][r] = requests.WithLabelValues(kindNames[k], resultNames[r])
		}
		m.sent[k] = bytes.WithLabelValues(kindNames[k])
	}
	return m
}

// hit counts an answered request that sent n body bytes.
func (m *cacheMetrics) hit(k objectKind, n int64) {
	if m == nil {
		return
	}
	m.requests[k][resultHit].Inc()
	m.bytes(k, n)
}

// bytes counts n body bytes sent.
func (m *cacheMetrics) bytes(k objectKind, n int64) {
	if m != nil && n > 0 {
		m.sent[k].Add(float64(n))
	}
}

// failed counts a request that ended in err (nil: nothing to count) and returns err.
func (m *cacheMetrics) failed(k objectKind, err error) error {
	if m == nil || err == nil {
		return err
	}
	r := resultError
	var he *httpapi.Error
	if errors.As(err, &he) && he.Code < http.StatusInternalServerError {
		r = resultMiss
	}
	m.requests[k][r].Inc()
	return err
}
