// Package waittest is how tests wait: poll a condition until it holds or a deadline passes, or
// check that a state holds for a whole window. Never a sleep standing in for synchronisation.
package waittest

import (
	"fmt"
	"testing"
	"time"
)

// For polls cond every few milliseconds until it holds, failing the test after timeout with
// the formatted description of what it waited for.
func For(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for: %s", timeout, fmt.Sprintf(format, args...))
		}
		<-tick.C
	}
}

// Hold calls check every few milliseconds for d: a window over which a state must hold, not a
// wait for something to happen.
func Hold(t testing.TB, d time.Duration, check func()) {
	t.Helper()
	end := time.After(d)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		check()
		select {
		case <-end:
			return
		case <-tick.C:
		}
	}
}
