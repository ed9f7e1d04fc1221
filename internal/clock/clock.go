// Package clock lets services read local time through an interface, so tests can control it.
// Coordination deadlines that other nodes must agree on never use it: they come from the
// database's now(). Local time only bounds what this process trusts on its own (for example how
// long a leader keeps acting without a successful lease renewal).
package clock

import "time"

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
