package clock

import (
	"testing"
	"time"
)

// TestManual: the clock moves only when advanced, and an After channel fires once the clock
// has moved past its deadline, not before.
func TestManual(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := NewManual(start)
	c := m.After(2 * time.Second)
	select {
	case <-m.After(0):
	default:
		t.Fatal("After(0) did not fire at once")
	}
	for _, tt := range []struct {
		advance time.Duration
		fired   bool
	}{{time.Second, false}, {999 * time.Millisecond, false}, {time.Millisecond, true}} {
		m.Advance(tt.advance)
		select {
		case got := <-c:
			if !tt.fired || !got.Equal(start.Add(2*time.Second)) {
				t.Fatalf("at %s: fired with %s", m.Now().Sub(start), got)
			}
		default:
			if tt.fired {
				t.Fatalf("at %s: the 2s After has not fired", m.Now().Sub(start))
			}
		}
	}
	if got := m.Now(); !got.Equal(start.Add(2 * time.Second)) {
		t.Fatalf("Now = %s, want start + 2s", got)
	}
}
