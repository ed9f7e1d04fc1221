// Package ratelimit is a set of token buckets, one per key (an API token, an anonymous client's
// address), in memory and bounded: buckets idle long enough to be full again are dropped, and
// past MaxKeys the least recently used go first.
package ratelimit

import (
	"container/list"
	"math"
	"sync"
	"time"
)

// DefaultMaxKeys bounds the buckets a Limiter keeps.
const DefaultMaxKeys = 10000

// Limiter hands out tokens: Rate a second per key, up to Burst at once.
type Limiter struct {
	rate  float64
	burst float64
	max   int
	now   func() time.Time

	mu      sync.Mutex
	buckets map[string]*list.Element // of *bucket; front: most recently used
	lru     list.List
}

type bucket struct {
	key    string
	tokens float64
	at     time.Time
}

// New is a limiter of rate tokens a second and bursts of burst, keeping at most maxKeys buckets
// (0: DefaultMaxKeys); now is its clock (nil: time.Now). A rate of 0 or less allows everything.
func New(rate float64, burst, maxKeys int, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	return &Limiter{rate: rate, burst: float64(max(burst, 1)), max: maxKeys, now: now, buckets: map[string]*list.Element{}}
}

// Allow takes a token from key's bucket. When it is empty, Allow says how long until the next
// token, in whole seconds, at least 1.
func (l *Limiter) Allow(key string) (ok bool, retryAfter int) {
	if l == nil || l.rate <= 0 {
		return true, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	l.evictIdle(now)
	e, found := l.buckets[key]
	if !found {
		if len(l.buckets) >= l.max {
			oldest := l.lru.Back()
			delete(l.buckets, oldest.Value.(*bucket).key)
			l.lru.Remove(oldest)
		}
		e = l.lru.PushFront(&bucket{key: key, tokens: l.burst, at: now})
		l.buckets[key] = e
	}
	l.lru.MoveToFront(e)
	b := e.Value.(*bucket)
	if elapsed := now.Sub(b.at).Seconds(); elapsed > 0 {
		b.tokens = min(l.burst, b.tokens+elapsed*l.rate)
	}
	b.at = now
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	wait := (1 - b.tokens) / l.rate
	return false, max(1, int(math.Ceil(wait)))
}

// evictIdle drops the least recently used buckets that have refilled: forgetting them changes
// nothing, as a new bucket starts full.
func (l *Limiter) evictIdle(now time.Time) {
	full := time.Duration(l.burst / l.rate * float64(time.Second))
	for e := l.lru.Back(); e != nil; e = l.lru.Back() {
		b := e.Value.(*bucket)
		if now.Sub(b.at) < full {
			return
		}
		delete(l.buckets, b.key)
		l.lru.Remove(e)
	}
}

// Len is how many buckets the limiter keeps.
func (l *Limiter) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}
