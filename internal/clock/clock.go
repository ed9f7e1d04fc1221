// Package clock lets services read local time through an interface, so tests can control it.
// Coordination deadlines that other nodes must agree on never use it: they come from the
// database's now(). Local time only bounds what this process trusts on its own (for example how
// long a leader keeps acting without a successful lease renewal).
package clock

import (
	"sync"
	"time"
)

// Clock is the time source services use for local, monotonic decisions.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

// Real is the system clock. time.Now carries a monotonic reading, so comparisons between two
// Now values are immune to wall-clock steps.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// After returns time.After(d).
func (Real) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Manual is a clock that moves only when Advance is called: tests drive time-based decisions
// with it. The zero value starts at the zero time; set the start with NewManual.
type Manual struct {
	mu      sync.Mutex
	now     time.Time
	waiters []manualWaiter
}

type manualWaiter struct {
	at time.Time
	c  chan time.Time
}

// NewManual returns a Manual clock reading start.
func NewManual(start time.Time) *Manual { return &Manual{now: start} }

// Now returns the clock's time.
func (m *Manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

// After returns a channel that receives the time once Advance has moved the clock d forward.
func (m *Manual) After(d time.Duration) <-chan time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := make(chan time.Time, 1)
	if d <= 0 {
		c <- m.now
		return c
	}
	m.waiters = append(m.waiters, manualWaiter{at: m.now.Add(d), c: c})
	return c
}

// Advance moves the clock forward by d and fires the After channels that are due.
func (m *Manual) Advance(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.now = m.now.Add(d)
	kept := m.waiters[:0]
	for _, w := range m.waiters {
		if w.at.After(m.now) {
			kept = append(kept, w)
			continue
		}
		w.c <- m.now
	}
	m.waiters = kept
}
