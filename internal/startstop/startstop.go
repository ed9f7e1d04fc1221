// Package startstop gives every long-running loop the same lifecycle: Start launches it,
// Stop cancels it and waits for it to return. Both are safe to call more than once and in any
// order, so shutdown paths never need to know what actually started.
package startstop

import (
	"context"
	"errors"
	"sync"
)

// Service is a long-running loop.
type Service interface {
	// Start launches the loop and returns once it runs; the loop lives until ctx ends or Stop.
	Start(ctx context.Context) error
	// Stop cancels the loop and waits for it. Idempotent; a no-op before Start.
	Stop()
}

// ErrStopped is the cause of a service context cancelled by Stop.
var ErrStopped = errors.New("service stopped")

// Base implements the lifecycle for a service that embeds it.
type Base struct {
	// starting serialises Launch, so that of two concurrent Starts only one prepares.
	starting sync.Mutex

	mu     sync.Mutex
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// Run starts fn in a goroutine with a context that Stop cancels. It reports false, and does
// nothing, if the service is already running.
func (b *Base) Run(ctx context.Context, fn func(ctx context.Context)) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.runningLocked() {
		return false
	}
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	b.cancel, b.done = cancel, done
	go func() {
		defer close(done)
		defer cancel(nil)
		fn(ctx)
	}()
	return true
}

// Launch is Run for a service whose Start does work before its loop (subscribes, checks the
// database): prepare runs only if the service is not running, and returns the loop, or an error
// that Launch returns without starting anything. A second Start is thus a no-op that opens
// nothing. Launch reports whether it started the loop.
func (b *Base) Launch(ctx context.Context, prepare func() (func(ctx context.Context), error)) (bool, error) {
	b.starting.Lock()
	defer b.starting.Unlock()
	b.mu.Lock()
	running := b.runningLocked()
	b.mu.Unlock()
	if running {
		return false, nil
	}
	fn, err := prepare()
	if err != nil {
		return false, err
	}
	return b.Run(ctx, fn), nil
}

func (b *Base) runningLocked() bool {
	if b.done == nil {
		return false
	}
	select {
	case <-b.done:
		return false
	default:
		return true
	}
}

// Stop cancels the running loop, if any, and waits for it to return.
func (b *Base) Stop() {
	b.mu.Lock()
	cancel, done := b.cancel, b.done
	b.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel(ErrStopped)
	<-done
}

// Done is closed when the current loop has returned; nil before the first Run.
func (b *Base) Done() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.done
}

// StopAll stops services in order.
func StopAll(services ...Service) {
	for _, s := range services {
		if s != nil {
			s.Stop()
		}
	}
}
