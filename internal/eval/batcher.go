package eval

import (
	"sync"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
)

// batcher groups the attributes a walk reports into batches for ingestion: a batch goes out at
// size attributes, or wait after its first one, so a slow walk still feeds ingestion. Sending
// blocks while ingestion is behind, which slows the walk rather than buffering without bound.
type batcher struct {
	size  int
	wait  time.Duration
	clock clock.Clock
	out   chan<- []Attr

	mu    sync.Mutex
	batch []Attr

	kick       chan struct{} // the first attribute of a batch starts its timer
	stop, done chan struct{}
}

// newBatcher starts a batcher that sends to out; close sends the rest and stops it.
func newBatcher(size int, wait time.Duration, clk clock.Clock, out chan<- []Attr) *batcher {
	b := &batcher{size: size, wait: wait, clock: clk, out: out,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go b.timer()
	return b
}

func (b *batcher) timer() {
	defer close(b.done)
	var due <-chan time.Time
	for {
		select {
		case <-b.stop:
			return
		case <-b.kick:
			due = b.clock.After(b.wait)
		case <-due:
			b.mu.Lock()
			b.send()
			b.mu.Unlock()
			due = nil
		}
	}
}

// add puts a into the current batch, sending the batch once it is full.
func (b *batcher) add(a Attr) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.batch = append(b.batch, a)
	if len(b.batch) == 1 {
		select {
		case b.kick <- struct{}{}:
		default:
		}
	}
	if len(b.batch) >= b.size {
		b.send()
	}
}

// close stops the timer and sends what is left. It does not close out.
func (b *batcher) close() {
	close(b.stop)
	<-b.done
	b.mu.Lock()
	defer b.mu.Unlock()
	b.send()
}

// send sends the current batch, if any; b.mu is held.
func (b *batcher) send() {
	if len(b.batch) > 0 {
		b.out <- b.batch
		b.batch = nil
	}
}
