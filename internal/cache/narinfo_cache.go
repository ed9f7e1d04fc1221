package cache

import (
	"strconv"
	"sync"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
)

// narinfoEntryOverhead is what an entry costs besides its key and body: the entry itself, its
// Content-Length value and its slot in the map. An estimate, so that a cache of many small
// narinfos stays near its bound.
const narinfoEntryOverhead = 160

// narinfoCache keeps the bodies of narinfos read from the store in memory, so that a repeated
// request costs no store access. A narinfo is written once and never changed, but the garbage
// collector may delete it: an entry is served until ttl after the read that filled it began,
// then the store is asked again. Misses are not kept, so a narinfo published after a 404 is
// served at once. Entries are evicted least recently used first to keep the total cost (keys,
// bodies and narinfoEntryOverhead each) within maxBytes.
//
// All methods are safe for concurrent use.
type narinfoCache struct {
	clock    clock.Clock
	maxBytes int64
	ttl      time.Duration

	mu      sync.Mutex
	bytes   int64 // total cost of entries
	entries map[string]*narinfoEntry
	recent  narinfoEntry // sentinel of the recency ring: recent.next is the most recently used
}

// narinfoEntry is one remembered narinfo. key, body, length and expires never change once the
// entry is in the cache, so a caller may use them without the lock.
type narinfoEntry struct {
	key     string
	body    []byte
	length  []string // the Content-Length header value, built once
	expires time.Time
	cost    int64

	prev, next *narinfoEntry // recency ring, under narinfoCache.mu
}

func newNarinfoCache(maxBytes int64, ttl time.Duration, clk clock.Clock) *narinfoCache {
	c := &narinfoCache{clock: clk, maxBytes: maxBytes, ttl: ttl, entries: make(map[string]*narinfoEntry)}
	c.recent.prev, c.recent.next = &c.recent, &c.recent
	return c
}

// get returns the entry for key if there is one that has not expired.
func (c *narinfoCache) get(key string) *narinfoEntry {
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[key]
	if e == nil {
		return nil
	}
	if !now.Before(e.expires) {
		c.remove(e)
		return nil
	}
	c.unlink(e)
	c.pushFront(e)
	return e
}

// put remembers body as key's narinfo, read from the store by a read that began at readStart,
// and returns the entry. The cache keeps body: the caller must not change it afterwards. A body
// too large for the whole cache is not kept (the entry is returned all the same).
func (c *narinfoCache) put(key string, body []byte, readStart time.Time) *narinfoEntry {
	length := strconv.Itoa(len(body))
	e := &narinfoEntry{
		key:     key,
		body:    body,
		length:  []string{length},
		expires: readStart.Add(c.ttl),
		cost:    int64(len(key)+len(body)+len(length)) + narinfoEntryOverhead,
	}
	if e.cost > c.maxBytes {
		return e
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.entries[key]; old != nil {
		c.remove(old)
	}
	c.entries[key] = e
	c.pushFront(e)
	c.bytes += e.cost
	for c.bytes > c.maxBytes {
		c.remove(c.recent.prev)
	}
	return e
}

// usage returns the total cost of the entries and their number.
func (c *narinfoCache) usage() (bytes int64, entries int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes, len(c.entries)
}

// remove drops e; c.mu is held.
func (c *narinfoCache) remove(e *narinfoEntry) {
	c.unlink(e)
	delete(c.entries, e.key)
	c.bytes -= e.cost
}

// unlink takes e out of the recency ring; c.mu is held.
func (c *narinfoCache) unlink(e *narinfoEntry) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

// pushFront makes e the most recently used; c.mu is held.
func (c *narinfoCache) pushFront(e *narinfoEntry) {
	e.prev, e.next = &c.recent, c.recent.next
	c.recent.next.prev = e
	c.recent.next = e
}
