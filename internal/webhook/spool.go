package webhook

import (
	"bytes"
	"fmt"
	"io"
	"os"
)

// spoolMemory is how much of a delivery's body is kept in memory before the rest goes to a
// temporary file: real deliveries mostly fit, and a flood of large unsigned ones costs each
// this much memory at most.
const spoolMemory = 64 << 10

// spool holds a delivery's body while its signature is unknown: the first spoolMemory bytes in
// memory, the rest in an unlinked temporary file.
type spool struct {
	mem  bytes.Buffer
	file *os.File
	size int64
}

// Write implements io.Writer.
func (s *spool) Write(p []byte) (int, error) {
	n := len(p)
	if s.file == nil && s.mem.Len()+len(p) <= spoolMemory {
		s.mem.Write(p)
		s.size += int64(n)
		return n, nil
	}
	if s.file == nil {
		f, err := os.CreateTemp("", "harmonia-ci-webhook-*")
		if err != nil {
			return 0, fmt.Errorf("spool delivery: %w", err)
		}
		// Unlinked at once: the space is freed when the file is closed, or the process dies.
		if err := os.Remove(f.Name()); err != nil {
			f.Close()
			return 0, fmt.Errorf("spool delivery: %w", err)
		}
		s.file = f
	}
	if _, err := s.file.Write(p); err != nil {
		return 0, fmt.Errorf("spool delivery: %w", err)
	}
	s.size += int64(n)
	return n, nil
}

// bytes reads the whole body back (once it is known genuine).
func (s *spool) bytes() ([]byte, error) {
	if s.file == nil {
		return s.mem.Bytes(), nil
	}
	buf := make([]byte, s.size)
	n := copy(buf, s.mem.Bytes())
	if _, err := s.file.ReadAt(buf[n:], 0); err != nil && err != io.EOF {
		return nil, fmt.Errorf("read spooled delivery: %w", err)
	}
	return buf, nil
}

// Close drops the body.
func (s *spool) Close() {
	if s.file != nil {
		s.file.Close()
	}
}
