// Package logtest holds a buffer that tests hand to loggers and processes and read while they
// still write.
package logtest

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe for concurrent writers and readers.
type Buffer struct {
	// Limit, if positive, keeps only the first Limit bytes or so (whole writes, until the
	// buffer holds Limit): a chatty process cannot fill the test's memory.
	Limit int

	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.Limit > 0 && b.buf.Len() >= b.Limit {
		return len(p), nil
	}
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
