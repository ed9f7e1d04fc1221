package builder

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
)

// logFakeClock is a clock whose Now moves only when the test says so.
type logFakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *logFakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *logFakeClock) After(time.Duration) <-chan time.Time { return nil }

func (c *logFakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestLogBufferTruncation(t *testing.T) {
	const limit = 10
	marker := "\n[... log truncated at 10 B]\n"
	tests := []struct {
		name      string
		writes    []string
		want      string
		truncated bool
		seq       int64
	}{
		{"empty", nil, "", false, 0},
		{"limit-1", []string{"123456789"}, "123456789", false, 1},
		{"limit", []string{"1234567890"}, "1234567890", false, 1},
		{"limit in pieces", []string{"12345", "67890"}, "1234567890", false, 2},
		{"limit+1", []string{"12345678901"}, "1234567890" + marker, true, 1},
		{"limit then one byte", []string{"1234567890", "1"}, "1234567890" + marker, true, 2},
		{"one big write across the limit", []string{"1234", "567890abcdefghij"}, "1234567890" + marker, true, 2},
		{"writes after truncation dropped", []string{"123456789012", "x", "yz\n"}, "1234567890" + marker, true, 1},
		{"empty writes add nothing", []string{"", "12", "", "34"}, "1234", false, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := NewLogBuffer(limit, clock.Real{})
			var total int64
			for _, w := range tt.writes {
				n, err := b.Write([]byte(w))
				if n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v; want %d, nil", w, n, err, len(w))
				}
				total += int64(len(w))
			}
			if got := string(b.Bytes()); got != tt.want {
				t.Errorf("Bytes() = %q, want %q", got, tt.want)
			}
			wantMarkers := 0
			if tt.truncated {
				wantMarkers = 1
			}
			if got := strings.Count(string(b.Bytes()), "log truncated"); got != wantMarkers {
				t.Errorf("marker appears %d times, want %d", got, wantMarkers)
			}
			if b.Truncated() != tt.truncated {
				t.Errorf("Truncated() = %v, want %v", b.Truncated(), tt.truncated)
			}
			if b.Size() != total {
				t.Errorf("Size() = %d, want %d (dropped bytes count)", b.Size(), total)
			}
			if b.Seq() != tt.seq {
				t.Errorf("Seq() = %d, want %d", b.Seq(), tt.seq)
			}
		})
	}
}

func TestLogBufferMarkerSize(t *testing.T) {
	tests := []struct {
		limit int64
		want  string
	}{
		{1, "1 B"},
		{123, "123 B"},
		{1000, "1 KB"},
		{1024, "1024 B"},
		{1500, "1500 B"},
		{2_500_000, "2500 KB"},
		{64_000_000, "64 MB"},
		{64 << 20, "67108864 B"},
		{4_000_000_000, "4 GB"},
		{2_000_000_000_000, "2 TB"},
	}
	for _, tt := range tests {
		if got := logHumanSize(tt.limit); got != tt.want {
			t.Errorf("logHumanSize(%d) = %q, want %q", tt.limit, got, tt.want)
		}
	}
	// The marker carries the size, end to end.
	b := NewLogBuffer(3000, clock.Real{})
	b.Write(bytes.Repeat([]byte("a"), 3001))
	if want := "\n[... log truncated at 3 KB]\n"; !bytes.HasSuffix(b.Bytes(), []byte(want)) {
		t.Errorf("log ends %q, want marker %q", b.Tail(40), want)
	}
	if got := NewLogBuffer(0, clock.Real{}).marker; string(got) != "\n[... log truncated at 64 MB]\n" {
		t.Errorf("default marker %q", got)
	}
}

func TestLogBufferTail(t *testing.T) {
	b := NewLogBuffer(10, clock.Real{})
	b.Write([]byte("abcdefghijKLMNOP"))
	kept := "abcdefghij\n[... log truncated at 10 B]\n"
	tests := []struct {
		n    int
		want string
	}{
		{-1, ""},
		{0, ""},
		{5, kept[len(kept)-5:]},
		{len(kept) - 7, kept[7:]}, // across the marker: "hij" and all of it
		{len(kept), kept},
		{1000, kept},
	}
	for _, tt := range tests {
		if got := string(b.Tail(tt.n)); got != tt.want {
			t.Errorf("Tail(%d) = %q, want %q", tt.n, got, tt.want)
		}
	}

	// Tail and Bytes hand out copies.
	tail, all := b.Tail(3), b.Bytes()
	tail[0], all[0] = 'X', 'X'
	if got := string(b.Bytes()); got != kept {
		t.Errorf("log changed through a returned slice: %q", got)
	}
}

func TestLogBufferConcurrentWriters(t *testing.T) {
	const writers, lines = 8, 500
	tests := []struct {
		name      string
		limit     int64
		truncated bool
	}{
		{"under the limit", 1 << 20, false},
		{"across the limit", 4000, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := NewLogBuffer(tt.limit, clock.Real{})
			var wg sync.WaitGroup
			stop := make(chan struct{})
			var readers sync.WaitGroup
			readers.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					_, _, _, _ = b.Tail(64), b.Bytes(), b.Seq(), b.Size()
					_, _ = b.Truncated(), b.LastOutput()
				}
			})
			var total int64
			for w := range writers {
				for i := range lines {
					total += int64(len(fmt.Sprintf("writer %d line %d\n", w, i)))
				}
				wg.Go(func() {
					for i := range lines {
						fmt.Fprintf(b, "writer %d line %d\n", w, i)
					}
				})
			}
			wg.Wait()
			close(stop)
			readers.Wait()

			if b.Size() != total {
				t.Errorf("Size() = %d, want %d", b.Size(), total)
			}
			if b.Truncated() != tt.truncated {
				t.Fatalf("Truncated() = %v, want %v", b.Truncated(), tt.truncated)
			}
			log := string(b.Bytes())
			if tt.truncated {
				if strings.Count(log, "log truncated") != 1 {
					t.Errorf("marker appears %d times", strings.Count(log, "log truncated"))
				}
				if int64(len(log)) != tt.limit+int64(len(b.marker)) {
					t.Errorf("kept %d bytes, want limit %d + marker", len(log), tt.limit)
				}
				return
			}
			if b.Seq() != writers*lines {
				t.Errorf("Seq() = %d, want %d", b.Seq(), writers*lines)
			}
			// Each Write lands whole: every line is there once, intact.
			seen := map[string]int{}
			for l := range strings.Lines(log) {
				seen[l]++
			}
			for w := range writers {
				for i := range lines {
					if l := fmt.Sprintf("writer %d line %d\n", w, i); seen[l] != 1 {
						t.Fatalf("line %q appears %d times", l, seen[l])
					}
				}
			}
		})
	}
}

func TestLogBufferLastOutput(t *testing.T) {
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	clk := &logFakeClock{now: t0}
	b := NewLogBuffer(10, clk)
	steps := []struct {
		advance time.Duration
		write   string
		want    time.Time
	}{
		{0, "", t0}, // creation time before any output
		{time.Minute, "", t0},
		{time.Minute, "abc", t0.Add(2 * time.Minute)},
		{30 * time.Minute, "", t0.Add(2 * time.Minute)},
		{time.Second, "0123456789", t0.Add(32*time.Minute + time.Second)}, // truncates
		{time.Hour, "dropped", t0.Add(92*time.Minute + time.Second)},      // dropped output is output
	}
	for i, s := range steps {
		clk.Advance(s.advance)
		b.Write([]byte(s.write))
		if got := b.LastOutput(); !got.Equal(s.want) {
			t.Errorf("step %d (write %q): LastOutput() = %s, want %s", i, s.write, got, s.want)
		}
	}
}
