package cache_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/cache"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

// TestMetrics: every answered request counts once under its object kind and result, and the
// body bytes sent under its kind; store failures count as errors.
func TestMetrics(t *testing.T) {
	store := newLocal(t)
	compressedLog := fill(t, store)
	rec := &recordingStore{Store: store}
	reg := prometheus.NewRegistry()
	mux := http.NewServeMux()
	cache.New(cache.Config{Store: rec, Registerer: reg}).Register(access.NewRoutes(mux, nil))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	type key struct{ kind, result string }
	cases := []struct {
		method, path, accept string
		failing              bool // the store fails
		count                key  // zero: counted nowhere
		bytes                int
	}{
		{method: "GET", path: "/nix-cache-info", count: key{"nix-cache-info", "hit"}, bytes: len("StoreDir: /nix/store\nWantMassQuery: 1\nPriority: 30\n")},
		{method: "HEAD", path: "/nix-cache-info", count: key{"nix-cache-info", "hit"}},
		{method: "GET", path: "/" + kNarinfo, count: key{"narinfo", "hit"}, bytes: len(narinfoBody)},
		{method: "HEAD", path: "/" + kNarinfo, count: key{"narinfo", "hit"}},
		{method: "GET", path: "/" + miss32 + ".narinfo", count: key{"narinfo", "miss"}},
		{method: "GET", path: "/" + h32[1:] + ".narinfo", count: key{"narinfo", "miss"}},
		{method: "GET", path: "/" + kNarinfo, failing: true, count: key{"narinfo", "error"}},
		{method: "GET", path: "/" + kListing, count: key{"ls", "hit"}, bytes: len(listingBody)},
		{method: "GET", path: "/" + miss32 + ".ls", count: key{"ls", "miss"}},
		{method: "GET", path: "/" + kNar, count: key{"nar", "hit"}, bytes: len(narBody)},
		{method: "GET", path: "/nar/" + miss52 + ".nar.zst", count: key{"nar", "miss"}},
		{method: "HEAD", path: "/" + kNar, failing: true, count: key{"nar", "error"}},
		{method: "GET", path: "/" + kLog, count: key{"log", "hit"}, bytes: len(logText)},
		{method: "GET", path: "/" + kLog, accept: "zstd", count: key{"log", "hit"}, bytes: len(compressedLog)},
		{method: "HEAD", path: "/" + kLog, count: key{"log", "hit"}},
		{method: "GET", path: "/log/" + miss32 + "-hello.drv", count: key{"log", "miss"}},
		{method: "GET", path: "/log/" + h32 + "-hello", count: key{"log", "miss"}},
		{method: "GET", path: "/" + kLog, failing: true, count: key{"log", "error"}},
		{method: "GET", path: "/index.html"},
		{method: "GET", path: "/realisations/" + h32 + "!out.doi"},
	}
	for _, c := range cases {
		beforeReq, beforeBytes := cacheSeries(t, reg)
		rec.err = nil
		if c.failing {
			rec.err = errors.New("store down")
		}
		do(t, c.method, srv.URL+c.path, http.Header{"Accept-Encoding": {c.accept}})
		// A request is counted once its body is written, which the client may see finish
		// first: wait for the count it should make, then check every series.
		afterReq, afterBytes := cacheSeries(t, reg)
		if c.count != (key{}) {
			waittest.For(t, 5*time.Second, func() bool {
				afterReq, afterBytes = cacheSeries(t, reg)
				return afterReq[[2]string{c.count.kind, c.count.result}] > beforeReq[[2]string{c.count.kind, c.count.result}]
			}, "%s %s to be counted", c.method, c.path)
		}
		for k, v := range afterReq {
			want := beforeReq[k]
			if (key{k[0], k[1]}) == c.count {
				want++
			}
			if v != want {
				t.Errorf("%s %s: requests%v = %v, want %v", c.method, c.path, k, v, want)
			}
		}
		for kind, v := range afterBytes {
			want := beforeBytes[kind]
			if kind == c.count.kind {
				want += float64(c.bytes)
			}
			if v != want {
				t.Errorf("%s %s: bytes{%s} = %v, want %v", c.method, c.path, kind, v, want)
			}
		}
	}
	if reqs, _ := cacheSeries(t, reg); len(reqs) != 5*3 {
		t.Errorf("%d request series, want every kind and result from the start (15)", len(reqs))
	}
}

// cacheSeries reads the cache's requests by [kind, result] and bytes by kind.
func cacheSeries(t *testing.T, reg *prometheus.Registry) (map[[2]string]float64, map[string]float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	reqs, bytes := map[[2]string]float64{}, map[string]float64{}
	label := func(m *dto.Metric, name string) string {
		for _, l := range m.GetLabel() {
			if l.GetName() == name {
				return l.GetValue()
			}
		}
		return ""
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "harmonia_ci_cache_requests_total":
				reqs[[2]string{label(m, "kind"), label(m, "result")}] = m.GetCounter().GetValue()
			case "harmonia_ci_cache_response_bytes_total":
				bytes[label(m, "kind")] = m.GetCounter().GetValue()
			}
		}
	}
	return reqs, bytes
}
