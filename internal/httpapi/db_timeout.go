package httpapi

import (
	"context"
	"net/http"
	"time"
)

// DBTimeout bounds the database work of one request: connecting, waiting for a pooled
// connection and every statement.
const DBTimeout = 5 * time.Second

// WithDBTimeout bounds h's request context by DBTimeout, so a handler whose database is
// unreachable or paused fails within the bound, answered 503 "database unavailable" by Handle,
// instead of holding its client for as long as the outage lasts. A long-lived response (the
// live log stream) bounds each of its reads instead.
func WithDBTimeout(h HandlerFunc) HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		ctx, cancel := context.WithTimeout(r.Context(), DBTimeout)
		defer cancel()
		return h(w, r.WithContext(ctx))
	}
}
