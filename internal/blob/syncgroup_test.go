package blob

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestSyncGroupCoalesces: callers that ask while a flush runs are served together by the next
// flush, never by the one already running (it may have started before their writes), and a
// flush's error reaches exactly the callers it served.
func TestSyncGroupCoalesces(t *testing.T) {
	var g syncGroup
	var flushes atomic.Int32
	release := make(chan error)
	started := make(chan struct{}, 10)
	flush := func() error {
		flushes.Add(1)
		started <- struct{}{}
		return <-release
	}

	first := make(chan error, 1)
	go func() { first <- g.do(flush) }()
	<-started // the first flush runs

	const waiting = 5
	var wg sync.WaitGroup
	errs := make(chan error, waiting)
	for range waiting {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- g.do(flush) }()
	}
	// Polling a condition with a deadline (no signal says "blocked in do").
	deadline := time.Now().Add(10 * time.Second)
	for {
		g.mu.Lock()
		joined := g.pending != nil && g.pending.members == waiting
		g.mu.Unlock()
		if joined {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiting callers did not join the next round")
		}
		time.Sleep(time.Millisecond)
	}
	release <- nil // the first flush ends well
	if err := <-first; err != nil {
		t.Fatalf("the first caller: %v", err)
	}
	<-started // the second flush, for the waiting callers
	boom := errors.New("disk on fire")
	release <- boom
	wg.Wait()
	close(errs)
	n := 0
	for err := range errs {
		n++
		if !errors.Is(err, boom) {
			t.Errorf("a caller served by the failed flush got %v", err)
		}
	}
	if got := flushes.Load(); got != 2 {
		t.Errorf("%d flushes for 1 + %d callers, want 2", got, waiting)
	}
	if n != waiting {
		t.Fatalf("%d of %d waiting callers returned", n, waiting)
	}
}
