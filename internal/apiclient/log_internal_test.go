package apiclient

import (
	"strings"
	"testing"
)

// Successive views of a log's end print each line once: a live tail's last line waits for a
// later view, a view that overlaps what was printed adds only what follows, one after a gap
// says so, and the whole log at the end completes it.
func TestLogPrinter(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("0123456789abcdef\n", 200) // more than anchorBytes
	for _, tc := range []struct {
		name  string
		tails []string
		final string // "": none
		want  string
	}{
		{"growing", []string{"a\nb\nc", "a\nb\nc\nd\ne"}, "a\nb\nc\nd\ne\nf", "a\nb\nc\nd\ne\nf\n"},
		{"partial line grows", []string{"a\nbu", "a\nbuilding\nx"}, "", "a\nbuilding\n"},
		{"window slides", []string{"1\n2\n3\n4\n", "3\n4\n5\n"}, "", "1\n2\n3\n4\n5\n"},
		{"repeated lines", []string{"x\nx\n", "x\nx\nx\n"}, "x\nx\nx\nx\n", "x\nx\nx\nx\n"},
		{"gap", []string{"1\n2\n", "8\n9\n"}, "", "1\n2\n[… log lines not received …]\n8\n9\n"},
		{"window slides past the anchor's start", []string{long + "end\n", long[500:] + "end\nmore\n"}, "", long + "end\nmore\n"},
		{"no tail, then the log", nil, "only\nthe log", "only\nthe log\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			p := &logPrinter{w: &out}
			for _, tail := range tc.tails {
				p.show(tail, false)
			}
			if tc.final != "" {
				p.show(tc.final, true)
			}
			if out.String() != tc.want {
				t.Errorf("printed %q, want %q", out.String(), tc.want)
			}
		})
	}
}
