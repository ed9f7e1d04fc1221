package cluster

import (
	"context"
	"sync"
)

// InFlight counts the work a node is doing, so draining can wait for it. Once closed it admits
// nothing new: that is what "stop taking new work" means for every role.
type InFlight struct {
	mu     sync.Mutex
	n      int
	closed bool
	idle   chan struct{} // closed when n reaches 0 after Close
}

// Acquire admits one unit of work and returns its release func, or false once the node drains.
func (f *InFlight) Acquire() (release func(), ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, false
	}
	f.n++
	var once sync.Once
	return func() { once.Do(f.done) }, true
}

func (f *InFlight) done() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n--
	if f.closed && f.n == 0 && f.idle != nil {
		close(f.idle)
		f.idle = nil
	}
}

// Count is the work in flight now.
func (f *InFlight) Count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

// Close stops admitting work. Idempotent.
func (f *InFlight) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
}

// Closed reports whether Close was called.
func (f *InFlight) Closed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

// Wait closes the gate and waits until nothing is in flight or ctx ends; it returns how much
// work was still running when it gave up (0 on a clean drain).
func (f *InFlight) Wait(ctx context.Context) int {
	f.mu.Lock()
	f.closed = true
	if f.n == 0 {
		f.mu.Unlock()
		return 0
	}
	if f.idle == nil {
		f.idle = make(chan struct{})
	}
	idle := f.idle
	f.mu.Unlock()
	select {
	case <-idle:
		return 0
	case <-ctx.Done():
		return f.Count()
	}
}
