package builder

import (
	"context"
	"sync"
)

// sessionPool keeps the builder's daemon sessions: a job takes an idle one or opens one, and
// gives it back after; there are never more than build slots (plus jobs whose outputs are
// still being read) at once. A session whose connection failed is closed instead of kept.
//
// Retire closes them all before the store's garbage collection: each daemon holds temporary
// roots on every path it built or added, which would keep the collector from freeing them.
type sessionPool struct {
	mu     sync.Mutex
	idle   []*Session
	gen    int // sessions of an older generation are closed when given back
	gens   map[*Session]int
	closed bool
}

func newSessionPool() *sessionPool { return &sessionPool{gens: map[*Session]int{}} }

// get returns an idle session of st that trusts st's keys, or opens one. Its substituters
// become st's.
func (p *sessionPool) get(ctx context.Context, st Store) (*Session, error) {
	p.mu.Lock()
	for len(p.idle) > 0 {
		ss := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		if ss.Broken() || !ss.Trusts(st.TrustedKeys) {
			delete(p.gens, ss)
			p.mu.Unlock()
			ss.Close()
			p.mu.Lock()
			continue
		}
		p.mu.Unlock()
		ss.store = &st
		return ss, nil
	}
	gen := p.gen
	p.mu.Unlock()
	ss, err := st.Open(ctx)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.gens[ss] = gen
	p.mu.Unlock()
	return ss, nil
}

// put gives a session back: kept for the next job unless it is broken, retired or the pool is
// closed.
func (p *sessionPool) put(ss *Session) {
	p.mu.Lock()
	if ss.Broken() || p.closed || p.gens[ss] != p.gen {
		delete(p.gens, ss)
		p.mu.Unlock()
		ss.Close()
		return
	}
	p.idle = append(p.idle, ss)
	p.mu.Unlock()
}

// retire closes the idle sessions, and the busy ones when they are given back.
func (p *sessionPool) retire() {
	p.mu.Lock()
	p.gen++
	idle := p.idle
	p.idle = nil
	for _, ss := range idle {
		delete(p.gens, ss)
	}
	p.mu.Unlock()
	for _, ss := range idle {
		ss.Close()
	}
}

// close retires every session for good: the builder stops.
func (p *sessionPool) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.retire()
}
