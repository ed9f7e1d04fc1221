package httpapi

import (
	"net/http"
	"strings"
)

// Accepts reports whether r's header (a comma-separated list such as Accept or
// Accept-Encoding, possibly over several lines) names value, ignoring case and parameters:
// Accepts(r, "Accept", "text/event-stream") is an EventSource's request.
func Accepts(r *http.Request, header, value string) bool {
	for _, v := range r.Header.Values(header) {
		for part := range strings.SplitSeq(v, ",") {
			name, _, _ := strings.Cut(part, ";")
			if strings.EqualFold(strings.TrimSpace(name), value) {
				return true
			}
		}
	}
	return false
}
