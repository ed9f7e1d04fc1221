package eval

import (
	"fmt"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

// signalClock is a manual clock that tells when a timer is set, so a test advances time only
// once the batcher waits on it.
type signalClock struct {
	*clock.Manual
	set chan struct{}
}

func (c signalClock) After(d time.Duration) <-chan time.Time {
	ch := c.Manual.After(d)
	c.set <- struct{}{}
	return ch
}

// TestBatcher: a batch goes out when full, when its first attribute has waited long enough, and
// at close; never empty.
func TestBatcher(t *testing.T) {
	t.Parallel()
	type step struct {
		add     int  // attributes to add
		advance bool // let the wait pass (after the timer is set)
	}
	tests := []struct {
		name  string
		size  int
		steps []step
		want  []int // batch sizes, in order, after close
	}{
		{name: "nothing", size: 3, want: nil},
		{name: "full batches and the rest at close", size: 3, steps: []step{{add: 7}}, want: []int{3, 3, 1}},
		{name: "exactly full", size: 2, steps: []step{{add: 4}}, want: []int{2, 2}},
		{name: "the wait sends a partial batch", size: 10, steps: []step{{add: 4, advance: true}, {add: 2}}, want: []int{4, 2}},
		{name: "a full batch then a timed one", size: 2, steps: []step{{add: 3, advance: true}}, want: []int{2, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk := signalClock{Manual: clock.NewManual(time.Unix(0, 0)), set: make(chan struct{}, 100)}
			out := make(chan []Attr, 100)
			b := newBatcher(tt.size, time.Second, clk, out)
			next := 0
			for _, s := range tt.steps {
				for range s.add {
					b.add(Attr{Path: []string{fmt.Sprint(next)}})
					next++
				}
				if s.advance {
					select {
					case <-clk.set:
					case <-time.After(10 * time.Second):
						t.Fatal("the batcher set no timer")
					}
					before := len(out)
					clk.Advance(time.Second)
					waittest.For(t, 10*time.Second, func() bool { return len(out) > before }, "the timed batch")
				}
			}
			b.close()
			close(out)
			var got []int
			seen := 0
			for batch := range out {
				got = append(got, len(batch))
				for _, a := range batch {
					if a.Path[0] != fmt.Sprint(seen) {
						t.Errorf("attribute %s out of order, want %d", a.Path[0], seen)
					}
					seen++
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("batches %v, want %v", got, tt.want)
			}
		})
	}
}
