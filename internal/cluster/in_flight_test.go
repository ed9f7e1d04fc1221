package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
)

func TestInFlightCountsAndDrains(t *testing.T) {
	t.Parallel()
	var f cluster.InFlight

	if left := f.Wait(context.Background()); left != 0 {
		// Wait closes the gate; use a fresh gate for the rest.
		t.Fatalf("Wait on an idle gate = %d, want 0", left)
	}
	if _, ok := f.Acquire(); ok {
		t.Fatal("Acquire admitted work after Wait closed the gate")
	}

	var g cluster.InFlight
	r1, ok1 := g.Acquire()
	r2, ok2 := g.Acquire()
	if !ok1 || !ok2 || g.Count() != 2 {
		t.Fatalf("two acquires: ok %v %v, count %d", ok1, ok2, g.Count())
	}
	r1()
	r1() // releasing twice is harmless
	if g.Count() != 1 {
		t.Fatalf("count after releasing one unit (twice) = %d, want 1", g.Count())
	}
	if g.Closed() {
		t.Fatal("gate closed before Close")
	}

	g.Close()
	g.Close() // idempotent
	if !g.Closed() {
		t.Fatal("Closed() false after Close")
	}
	if release, ok := g.Acquire(); ok || release != nil {
		t.Fatal("Acquire admitted work after Close")
	}

	// Wait returns 0 once the remaining work finishes.
	done := make(chan int, 1)
	go func() { done <- g.Wait(context.Background()) }()
	r2()
	select {
	case left := <-done:
		if left != 0 {
			t.Fatalf("Wait after the work finished = %d, want 0", left)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return after the last unit was released")
	}
	r2() // harmless after the drain too
	if g.Count() != 0 {
		t.Fatalf("count = %d after a double release, want 0", g.Count())
	}
}

func TestInFlightWaitTimesOut(t *testing.T) {
	t.Parallel()
	var f cluster.InFlight
	var releases []func()
	for range 3 {
		r, ok := f.Acquire()
		if !ok {
			t.Fatal("Acquire refused on an open gate")
		}
		releases = append(releases, r)
	}
	releases[0]()

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if left := f.Wait(ctx); left != 2 {
		t.Fatalf("Wait with work stuck = %d, want 2", left)
	}
	if !f.Closed() {
		t.Fatal("Wait did not close the gate")
	}
	if _, ok := f.Acquire(); ok {
		t.Fatal("Acquire admitted work after Wait")
	}

	// A later Wait still sees the drain complete.
	done := make(chan int, 1)
	go func() { done <- f.Wait(context.Background()) }()
	releases[1]()
	releases[2]()
	select {
	case left := <-done:
		if left != 0 {
			t.Fatalf("second Wait = %d, want 0", left)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("second Wait did not return after the work finished")
	}
}

func TestInFlightConcurrentWaiters(t *testing.T) {
	t.Parallel()
	var f cluster.InFlight
	release, _ := f.Acquire()
	done := make(chan int, 3)
	for range 3 {
		go func() { done <- f.Wait(context.Background()) }()
	}
	waitFor(t, 5*time.Second, f.Closed, "a waiter to close the gate")
	release()
	for range 3 {
		select {
		case left := <-done:
			if left != 0 {
				t.Fatalf("Wait = %d, want 0", left)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a waiter did not return")
		}
	}
}
