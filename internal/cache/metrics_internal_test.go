package cache

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestMetricsDoNotAllocate: counting a request costs no allocation (the cache serves thousands
// of narinfos a second).
func TestMetricsDoNotAllocate(t *testing.T) {
	m := newCacheMetrics(prometheus.NewRegistry())
	if n := testing.AllocsPerRun(1000, func() {
		m.hit(kindNarinfo, 512)
		_ = m.failed(kindNarinfo, nil)
	}); n != 0 {
		t.Errorf("%v allocations per counted request, want 0", n)
	}
}
