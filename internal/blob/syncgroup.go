package blob

import "sync"

// syncGroup coalesces flushes, as a database's group commit does: a caller is served by a flush
// that starts after it asked, so callers that ask while one runs share the next one. Under load
// (builds completing on every slot at once) a flush of the whole file system per caller was
// most of the signer's time.
type syncGroup struct {
	flushing sync.Mutex // one flush at a time
	mu       sync.Mutex
	pending  *syncRound // the round new callers join; it has not started
}

// syncRound is one flush and the callers it serves.
type syncRound struct {
	done    chan struct{}
	err     error
	members int // callers that joined (for tests)
}

// do runs flush, or waits for one that started after this call, and returns its error.
func (g *syncGroup) do(flush func() error) error {
	g.mu.Lock()
	if g.pending == nil {
		g.pending = &syncRound{done: make(chan struct{})}
	}
	r := g.pending
	r.members++
	g.mu.Unlock()

	g.flushing.Lock()
	defer g.flushing.Unlock()
	select {
	case <-r.done: // another caller of this round flushed it
		return r.err
	default:
	}
	// The round starts: whoever asks from now on waits for the next one.
	g.mu.Lock()
	if g.pending == r {
		g.pending = nil
	}
	g.mu.Unlock()
	r.err = flush()
	close(r.done)
	return r.err
}
