package httpapi

import (
	"net/http"
	"testing"
)

func TestAccepts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []string
		value  string
		want   bool
	}{
		{"alone", []string{"text/event-stream"}, "text/event-stream", true},
		{"in a list, with parameters", []string{"text/html;q=0.9, Text/Event-Stream ;q=1"}, "text/event-stream", true},
		{"on a second line", []string{"gzip", "br, zstd"}, "zstd", true},
		{"absent", []string{"text/html, application/json"}, "text/event-stream", false},
		{"a prefix is not a name", []string{"zstdx"}, "zstd", false},
		{"no header", nil, "zstd", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &http.Request{Header: http.Header{"X-List": tc.values}}
			if got := Accepts(r, "X-List", tc.value); got != tc.want {
				t.Errorf("Accepts(%q, %q) = %v, want %v", tc.values, tc.value, got, tc.want)
			}
		})
	}
}
