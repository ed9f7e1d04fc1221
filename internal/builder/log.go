package builder

import (
	"strconv"
	"sync"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
)

// logDefaultMax is the default max_log_size, 64 MB.
const logDefaultMax = 64_000_000

// LogBuffer holds a build's combined output in memory until it is uploaded. It is an io.Writer
// that is safe for concurrent writes (stdout and stderr) and reads (the tail writer, the
// max-silent timeout).
//
// Past its limit the buffer keeps what it has, appends a truncation marker once and drops the
// rest (the cap limits the log, it does not fail the build), while still counting the dropped bytes and
// recording when output last arrived.
type LogBuffer struct {
	max    int64
	marker []byte
	clock  clock.Clock

	mu         sync.Mutex
	buf        []byte // the kept log, plus the marker once truncated
	truncated  bool
	size       int64 // every byte written, dropped ones included
	seq        int64
	lastOutput time.Time
}

// NewLogBuffer keeps the whole log up to limit bytes (limit <= 0: the default, 64 MB); past
// that it appends the marker "\n[... log truncated at <limit, e.g. 64 MB>]\n" once and drops
// the rest. Write still reports success then: the build goes on.
func NewLogBuffer(limit int64, clk clock.Clock) *LogBuffer {
	if limit <= 0 {
		limit = logDefaultMax
	}
	return &LogBuffer{
		max:        limit,
		marker:     []byte("\n[... log truncated at " + logHumanSize(limit) + "]\n"),
		clock:      clk,
		lastOutput: clk.Now(),
	}
}

// Write appends p to the log, or as much of it as the limit allows. It never fails.
func (b *LogBuffer) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	now := b.clock.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.size += int64(len(p))
	// Dropped output still counts as output: the build is not silent.
	b.lastOutput = now
	if b.truncated {
		return len(p), nil
	}
	room := b.max - int64(len(b.buf))
	if int64(len(p)) <= room {
		b.buf = append(b.buf, p...)
	} else {
		b.buf = append(b.buf, p[:room]...)
		b.buf = append(b.buf, b.marker...)
		b.truncated = true
	}
	b.seq++
	return len(p), nil
}

// Bytes returns a copy of the kept log, with the marker if it was truncated.
func (b *LogBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.buf...)
}

// Tail returns a copy of the last n bytes of the kept log (all of it if shorter).
func (b *LogBuffer) Tail(n int) []byte {
	tail, _ := b.tailSeq(n)
	return tail
}

// tailSeq returns Tail(n) and the Seq it belongs to, read together.
func (b *LogBuffer) tailSeq(n int) ([]byte, int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n = max(0, min(n, len(b.buf)))
	return append([]byte(nil), b.buf[len(b.buf)-n:]...), b.seq
}

// Truncated reports whether output was dropped at the limit.
func (b *LogBuffer) Truncated() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.truncated
}

// Size is the number of bytes written in total, dropped ones included.
func (b *LogBuffer) Size() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.size
}

// Seq increases on every Write that changed the kept log, so readers can skip an unchanged
// tail.
func (b *LogBuffer) Seq() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.seq
}

// LastOutput is the clock time of the last non-empty Write (the creation time before any);
// the max-silent timeout measures from it.
func (b *LogBuffer) LastOutput() time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lastOutput
}

// logSizeUnits are the powers of 1000 the configuration's sizes use, largest first.
var logSizeUnits = []struct {
	name string
	size int64
}{
	{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3},
}

// logHumanSize prints n exactly, in the largest power-of-1000 unit that divides it ("64 MB"),
// else in bytes ("123 B").
func logHumanSize(n int64) string {
	for _, u := range logSizeUnits {
		if n >= u.size && n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + " " + u.name
		}
	}
	return strconv.FormatInt(n, 10) + " B"
}
