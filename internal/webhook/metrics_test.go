package webhook_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/githubtest"
)

// TestDeliveryMetrics: each delivery counts once by forge, event kind and what the receiver
// decided.
func TestDeliveryMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	b.gh.SetPullRequest(hello.FullName, githubtest.PR{Number: 4, User: "alice", HeadSHA: sha(4), HeadRef: "f"})
	steps := []struct {
		name   string
		send   func() answer
		code   int
		series string // event,result
	}{
		{"push", func() answer { return b.deliverID(t, "push", "m-1", push(hello, "main", sha(1))) }, http.StatusAccepted, "push,accepted"},
		{"replay", func() answer { return b.deliverID(t, "push", "m-1", push(hello, "main", sha(1))) }, http.StatusOK, "push,replayed"},
		{"ping", func() answer { return b.deliver(t, "ping", map[string]any{"zen": "hi", "hook_id": 1}) }, http.StatusOK, "ignored,ignored"},
		{"unsigned", func() answer {
			return b.post(t, b.url, http.Header{"X-GitHub-Event": {"push"}, "X-GitHub-Delivery": {"m-2"}}, []byte("{}"))
		}, http.StatusUnauthorized, "unknown,rejected"},
		{"forge down", func() answer {
			b.down.Store(true)
			defer b.down.Store(false)
			return b.deliverID(t, "pull_request", "m-3",
				pullRequest("opened", githubtest.PR{Number: 4, User: "alice", HeadSHA: sha(4), HeadRef: "f"}))
		}, http.StatusBadGateway, "pull_request,error"},
	}
	want := map[string]float64{}
	for _, s := range steps {
		if got := s.send(); got.code != s.code {
			t.Fatalf("%s: answered %+v, want %d", s.name, got, s.code)
		}
		want[s.series]++
		got := deliveries(t, b.reg)
		if _, ok := got[s.series]; !ok {
			t.Errorf("after %s: no series %s", s.name, s.series)
		}
		for series, n := range got {
			if n != want[series] {
				t.Errorf("after %s: deliveries{forge=github,%s} = %v, want %v", s.name, series, n, want[series])
			}
		}
	}
}

// deliveries reads harmonia_ci_webhook_deliveries_total of forge github by "event,result".
func deliveries(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "harmonia_ci_webhook_deliveries_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["forge"] != "github" {
				t.Errorf("a series of forge %q", l["forge"])
			}
			out[strings.Join([]string{l["event"], l["result"]}, ",")] = m.GetCounter().GetValue()
		}
	}
	return out
}
