// Package apiv1 is the versioned read API under /api/v1/: projects, their branches and pull
// requests, evaluations with their attributes, builds, an evaluation's failures with their log
// tails, nodes and the queue, as JSON whose field names are stable. Every route is registered
// through access.Routes with the scope of the pages that show the same data, so a caller reads
// here exactly what the pages show them; openapi.json describes the routes from the same table
// that registers them.
package apiv1

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
)

// Prefix is where the API's routes live.
const Prefix = "/api/v1/"

// Paging bounds: a list answers DefaultLimit rows unless ?limit= asks for 1 to MaxLimit.
const (
	DefaultLimit = 50
	MaxLimit     = 200
)

// TailBytes is how much of the end of a failed build's log the failures list carries.
const TailBytes = 4 << 10

// TailFunc returns at most the last max bytes of build jobID's log, or ErrNoLog.
type TailFunc func(ctx context.Context, jobID int64, max int) (string, error)

// ErrNoLog means a build has no log (yet, or any more).
var ErrNoLog = errors.New("no log")

// Config is what the API needs from the node.
type Config struct {
	Pool *pgxpool.Pool
	// Tail reads the end of a build's log; nil: the failures list carries no log tails.
	Tail   TailFunc
	Logger *slog.Logger
}

// API serves the routes.
type API struct {
	cfg Config
	log *slog.Logger
	rt  *access.Routes
}

// New returns the API; Register mounts it.
func New(cfg Config) *API {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &API{cfg: cfg, log: logger.With("service", "apiv1")}
}

// Register mounts every route of the table on rt, with its scope.
func (a *API) Register(rt *access.Routes) {
	a.rt = rt
	for _, r := range a.routes() {
		h := r.handler
		rt.Handle("GET "+Prefix+r.path, r.scope, httpapi.Handle(a.log, httpapi.WithDBTimeout(h)))
	}
}

// caller is who asks.
func (a *API) caller(r *http.Request) access.Caller { return a.rt.Caller(r) }

// rule is the visibility rule in use.
func (a *API) rule() *access.Rule { return a.rt.Rule() }

// pathID is the positive integer path value name, or a 400 naming what it should be.
func pathID(r *http.Request, name, what string) (int64, error) {
	raw := r.PathValue(name)
	id, ok := positive(raw)
	if !ok {
		return 0, httpapi.Errorf(http.StatusBadRequest, "invalid %s id %q: want a positive integer", what, clip(raw))
	}
	return id, nil
}

// positive parses a positive decimal integer of ASCII digits only.
func positive(s string) (int64, bool) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n > 0
}

// clip shortens what a client sent before it is echoed in an error.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// limitOf is the request's ?limit=, DefaultLimit when absent.
func limitOf(r *http.Request) (int, error) {
	raw := r.URL.Query().Get("limit")
	if raw == "" {
		return DefaultLimit, nil
	}
	n, ok := positive(raw)
	if !ok || n > MaxLimit {
		return 0, httpapi.Errorf(http.StatusBadRequest, "invalid limit %q: want an integer from 1 to %d", clip(raw), MaxLimit)
	}
	return int(n), nil
}

// idCursor is the request's ?after= as an id; 0 when absent.
func idCursor(r *http.Request) (int64, error) {
	raw := r.URL.Query().Get("after")
	if raw == "" {
		return 0, nil
	}
	id, ok := positive(raw)
	if !ok {
		return 0, httpapi.Errorf(http.StatusBadRequest, "invalid after %q: want the id of the last row of the previous page", clip(raw))
	}
	return id, nil
}

// utc is t in UTC, so every time is written as RFC 3339 with a Z.
func utc(t time.Time) time.Time { return t.UTC() }

// utcp is utc for an optional time.
func utcp(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// notFound is the answer for what does not exist, the same as the route's check gives for
// what the caller may not read.
func notFound(what string, name any) error {
	return &httpapi.Error{Code: http.StatusNotFound, Msg: fmt.Sprintf("%s %v not found", what, name)}
}
