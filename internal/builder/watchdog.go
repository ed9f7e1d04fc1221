package builder

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"time"
)

// buildStop is why a build was stopped.
type buildStop int

const (
	buildNotStopped buildStop = iota
	buildCancelled
	buildTimedOut
	buildSilent
)

// errLimit stops a build that went over a limit.
var errLimit = errors.New("the build went over a limit")

// watchdog stops the build (stop) when it goes over its wall-clock or silence limit, judged by
// the log it streams, and returns why; buildNotStopped when the build ended first (done) and
// buildCancelled when ctx ended.
func watchdog(ctx context.Context, limits BuildLimits, out *nixOutput, done <-chan struct{}, stop context.CancelCauseFunc) buildStop {
	var wall, silent <-chan time.Time
	if limits.Timeout > 0 {
		t := time.NewTimer(limits.Timeout)
		defer t.Stop()
		wall = t.C
	}
	var silentTimer *time.Timer
	if limits.MaxSilent > 0 {
		silentTimer = time.NewTimer(limits.MaxSilent)
		defer silentTimer.Stop()
		silent = silentTimer.C
	}
	for {
		select {
		case <-done:
			return buildNotStopped
		case <-ctx.Done():
			return buildCancelled
		case <-wall:
			stop(errLimit)
			return buildTimedOut
		case <-silent:
			// One timer re-armed from the last output, instead of a reset per line.
			if idle := out.idle(); idle < limits.MaxSilent {
				silentTimer.Reset(limits.MaxSilent - idle)
				continue
			}
			stop(errLimit)
			return buildSilent
		}
	}
}

// nixOutput passes a build's log on, noting when it last wrote: the watchdog's silence clock.
type nixOutput struct {
	w     io.Writer
	start time.Time
	last  atomic.Int64 // time of the last output, as nanoseconds since start (monotonic)
}

func (o *nixOutput) Write(p []byte) (int, error) {
	o.last.Store(int64(time.Since(o.start)))
	// A failing log must not stall the build's stream, so its errors are dropped.
	_, _ = o.w.Write(p)
	return len(p), nil
}

func (o *nixOutput) idle() time.Duration {
	return time.Since(o.start) - time.Duration(o.last.Load())
}
