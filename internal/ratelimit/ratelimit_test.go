package ratelimit

import (
	"fmt"
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestBucket(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	l := New(2, 3, 0, c.now)
	for i := range 3 {
		if ok, _ := l.Allow("a"); !ok {
			t.Fatalf("request %d of the burst refused", i+1)
		}
	}
	ok, retry := l.Allow("a")
	if ok || retry != 1 {
		t.Fatalf("past the burst: ok %v, retry after %ds; want refused, 1s", ok, retry)
	}
	if ok, _ := l.Allow("b"); !ok {
		t.Fatal("another key shares the first one's bucket")
	}
	c.t = c.t.Add(500 * time.Millisecond) // one token back at 2/s
	if ok, _ := l.Allow("a"); !ok {
		t.Fatal("refused after the bucket refilled a token")
	}
	if ok, _ := l.Allow("a"); ok {
		t.Fatal("allowed a second request with one token refilled")
	}
}

func TestRetryAfterWholeSeconds(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	l := New(0.1, 1, 0, c.now) // one every 10s
	l.Allow("a")
	if ok, retry := l.Allow("a"); ok || retry != 10 {
		t.Fatalf("ok %v, retry after %d; want refused, 10", ok, retry)
	}
	c.t = c.t.Add(7500 * time.Millisecond)
	if ok, retry := l.Allow("a"); ok || retry != 3 {
		t.Fatalf("ok %v, retry after %d; want refused, 3 (2.5s rounded up)", ok, retry)
	}
}

func TestBounded(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	l := New(1, 5, 100, c.now)
	for i := range 1000 {
		l.Allow(fmt.Sprint("k", i))
	}
	if n := l.Len(); n != 100 {
		t.Fatalf("%d buckets kept, want at most 100", n)
	}
	c.t = c.t.Add(10 * time.Second) // every bucket full again: idle ones go
	l.Allow("new")
	if n := l.Len(); n != 1 {
		t.Fatalf("%d buckets kept after they refilled, want 1", n)
	}
}

func TestOff(t *testing.T) {
	l := New(0, 0, 0, nil)
	for range 1000 {
		if ok, _ := l.Allow("a"); !ok {
			t.Fatal("a limiter of rate 0 refused")
		}
	}
}
