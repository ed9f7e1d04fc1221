package cache

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
)

// newFakeClock is a clock that moves only when told to.
func newFakeClock() *clock.Manual {
	return clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
}

// entryCost is what put charges for key with a body of n bytes.
func entryCost(key string, n int) int64 {
	return int64(len(key)+n+len(fmt.Sprint(n))) + narinfoEntryOverhead
}

// checkUsage checks that the cache's byte count is the sum of the costs of exactly the keys
// want, and that it is within the bound.
func checkUsage(t *testing.T, c *narinfoCache, want ...string) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	var sum int64
	for _, k := range want {
		e := c.entries[k]
		if e == nil {
			t.Errorf("%s is not cached", k)
			continue
		}
		sum += e.cost
	}
	if len(c.entries) != len(want) {
		t.Errorf("%d entries cached, want %d (%q)", len(c.entries), len(want), want)
	}
	if c.bytes != sum {
		t.Errorf("cache counts %d bytes, its entries cost %d", c.bytes, sum)
	}
	if c.bytes > c.maxBytes {
		t.Errorf("cache holds %d bytes, bound %d", c.bytes, c.maxBytes)
	}
	// The recency ring holds exactly the entries.
	n := 0
	for e := c.recent.next; e != &c.recent; e = e.next {
		if c.entries[e.key] != e {
			t.Errorf("ring holds %s, which the map does not", e.key)
		}
		n++
	}
	if n != len(c.entries) {
		t.Errorf("ring holds %d entries, map %d", n, len(c.entries))
	}
}

func key(i int) string { return fmt.Sprintf("%032d.narinfo", i) }

// TestNarinfoCacheBound: the entries' cost never exceeds the bound, the least recently used
// go first, and the count matches what is held.
func TestNarinfoCacheBound(t *testing.T) {
	t.Parallel()
	body := []byte(strings.Repeat("x", 600))
	perEntry := entryCost(key(0), len(body))

	for _, c := range []struct {
		name    string
		fits    int // entries the bound holds
		puts    []int
		gets    []int // after the puts: refresh these, then put one more
		want    []int // cached at the end
		evicted []int
	}{
		{name: "under the bound", fits: 4, puts: []int{1, 2, 3}, want: []int{1, 2, 3, 100}},
		{name: "oldest evicted", fits: 3, puts: []int{1, 2, 3, 4, 5}, want: []int{4, 5, 100}, evicted: []int{1, 2, 3}},
		{name: "used entry kept", fits: 3, puts: []int{1, 2, 3}, gets: []int{1}, want: []int{1, 3, 100}, evicted: []int{2}},
		{name: "replaced entry counted once", fits: 3, puts: []int{1, 1, 1, 2}, want: []int{1, 2, 100}},
		{name: "many times the bound", fits: 10, puts: seq(1, 1000), want: append(seq(992, 1000), 100), evicted: append(seq(1, 99), seq(101, 991)...)},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			nc := newNarinfoCache(int64(c.fits)*perEntry, time.Minute, newFakeClock())
			for _, i := range c.puts {
				nc.put(key(i), body, nc.clock.Now())
				checkUsage(t, nc, keysOf(nc)...)
			}
			for _, i := range c.gets {
				if nc.get(key(i)) == nil {
					t.Fatalf("get(%d) missed", i)
				}
			}
			nc.put(key(100), body, nc.clock.Now())
			var want []string
			for _, i := range c.want {
				want = append(want, key(i))
			}
			checkUsage(t, nc, want...)
			for _, i := range c.evicted {
				if nc.get(key(i)) != nil {
					t.Errorf("get(%d) hit, want it evicted", i)
				}
			}
			if bytes, n := nc.usage(); bytes != int64(len(c.want))*perEntry || n != len(c.want) {
				t.Errorf("usage() = %d bytes, %d entries; want %d, %d", bytes, n, int64(len(c.want))*perEntry, len(c.want))
			}
		})
	}
}

// TestNarinfoCacheTooLarge: a body larger than the whole bound is returned but not kept, and
// evicts nothing.
func TestNarinfoCacheTooLarge(t *testing.T) {
	t.Parallel()
	nc := newNarinfoCache(2000, time.Minute, newFakeClock())
	nc.put(key(1), make([]byte, 100), nc.clock.Now())
	e := nc.put(key(2), make([]byte, 5000), nc.clock.Now())
	if len(e.body) != 5000 || e.length[0] != "5000" {
		t.Errorf("put returned a body of %d bytes, Content-Length %q", len(e.body), e.length)
	}
	checkUsage(t, nc, key(1))
}

// TestNarinfoCacheTTL: an entry is served until ttl after its read began, and not at or after
// that instant; an expired entry no longer counts against the bound.
func TestNarinfoCacheTTL(t *testing.T) {
	t.Parallel()
	const ttl = 10 * time.Second
	clk := newFakeClock()
	nc := newNarinfoCache(1<<20, ttl, clk)
	readStart := clk.Now()
	clk.Advance(3 * time.Second) // a slow read: the TTL runs from its start
	nc.put(key(1), []byte("StorePath: x\n"), readStart)

	clk.Advance(ttl - 3*time.Second - time.Nanosecond)
	if nc.get(key(1)) == nil {
		t.Fatal("entry expired before its TTL")
	}
	clk.Advance(time.Nanosecond)
	if nc.get(key(1)) != nil {
		t.Fatal("entry served at its TTL")
	}
	checkUsage(t, nc)
}

func seq(from, to int) []int {
	var s []int
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

func keysOf(c *narinfoCache) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var k []string
	for key := range c.entries {
		k = append(k, key)
	}
	return k
}
