package access

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
)

// ScopeKind says what a route carries, and so how it is checked.
type ScopeKind string

// The kinds of routes.
const (
	// KindFree routes carry no project's data (health, static files, login).
	KindFree ScopeKind = "free"
	// KindSigned routes answer only a caller who proved who it is with a node token, a webhook
	// signature or a presigned URL, and carry nothing of other projects to it.
	KindSigned ScopeKind = "signed"
	// KindAdmin routes answer admins only; the handler refuses anyone else.
	KindAdmin ScopeKind = "admin"
	// KindFiltered routes list several projects' data and pass each item through the Rule
	// (the handler's work): the dashboard, the queue, metrics.
	KindFiltered ScopeKind = "filtered"
	// KindProject, KindEval and KindJob routes carry one project's, evaluation's or build
	// job's data, named by a path value; Routes wraps them with the check, and a caller who
	// may not read it gets the same 404 as for one that does not exist.
	KindProject ScopeKind = "project"
	KindEval    ScopeKind = "eval"
	KindJob     ScopeKind = "job"
	// KindStorePath routes are the binary cache's: the handler checks each store path against
	// the projects that have it (cache.Visibility), and a caller who may not read a private
	// path gets the same 404 as for a path that does not exist.
	KindStorePath ScopeKind = "store-path"
	// KindPending routes carry project data without the check yet, for the reason recorded
	// (the binary cache, until Nix clients authenticate).
	KindPending ScopeKind = "pending"
)

// Scope is a route's declaration: what it carries, and for a checked route the path value
// that names the object and the answer to a caller who may not read it.
type Scope struct {
	Kind  ScopeKind
	Param string // the path value of KindProject, KindEval and KindJob
	Note  string // why, for KindPending
	deny  http.HandlerFunc
}

// Scopes of routes that need no argument.
var (
	Free     = Scope{Kind: KindFree}
	Signed   = Scope{Kind: KindSigned}
	Admin    = Scope{Kind: KindAdmin}
	Filtered = Scope{Kind: KindFiltered}
	// StorePaths is the binary cache's scope (KindStorePath).
	StorePaths = Scope{Kind: KindStorePath}
)

// Project is a route of the project named by path value param.
func Project(param string) Scope { return Scope{Kind: KindProject, Param: param} }

// Eval is a route of the evaluation whose id is path value param.
func Eval(param string) Scope { return Scope{Kind: KindEval, Param: param} }

// Job is a route of the build job whose id is path value param.
func Job(param string) Scope { return Scope{Kind: KindJob, Param: param} }

// Pending is a route that carries project data and is not checked yet, for reason.
func Pending(reason string) Scope { return Scope{Kind: KindPending, Note: reason} }

// Deny sets what a caller who may not read the object gets: it must be what the route answers
// for an object that does not exist. By default a JSON 404 "<kind> <id> not found".
func (s Scope) Deny(h http.HandlerFunc) Scope {
	s.deny = h
	return s
}

// Route is one registered pattern and its declaration.
type Route struct {
	Pattern string
	Scope   Scope
}

// CallerFunc tells who makes a request.
type CallerFunc func(*http.Request) Caller

// FrontFunc runs before every route's handler (and before its check): it may answer the
// request itself, or pass it on to next, with a request of its own (one whose context says who
// the caller is, say). route is the route the request matched.
type FrontFunc func(w http.ResponseWriter, r *http.Request, route Route, next http.Handler)

// gate is the rule and the caller function the checked routes use.
type gate struct {
	rule   *Rule
	caller CallerFunc
}

// Routes registers a node's HTTP routes on its mux, each with its Scope; List enumerates them
// so that a test can hold every route to a declaration.
type Routes struct {
	mux    *http.ServeMux
	logger *slog.Logger
	gate   atomic.Pointer[gate]
	front  atomic.Pointer[FrontFunc]
	// recheckEvery is Revoked's period in nanoseconds; 0: RecheckInterval.
	recheckEvery atomic.Int64

	mu     sync.Mutex
	routes []Route
}

// NewRoutes registers on mux; logger (nil: none) gets the checks' failures. Until Use, checked routes see
// every caller as anonymous, and nothing private is readable.
func NewRoutes(mux *http.ServeMux, logger *slog.Logger) *Routes {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	rt := &Routes{mux: mux, logger: logger}
	rt.gate.Store(&gate{rule: &Rule{}, caller: func(*http.Request) Caller { return Caller{} }})
	return rt
}

// Use sets the rule and how callers are identified; the frontend calls it with its sessions
// and its forges' answers. Safe while serving.
func (rt *Routes) Use(rule *Rule, caller CallerFunc) {
	rt.gate.Store(&gate{rule: rule, caller: caller})
}

// SetFront makes f run before every route (nil: none). Safe while serving.
func (rt *Routes) SetFront(f FrontFunc) {
	if f == nil {
		rt.front.Store(nil)
		return
	}
	rt.front.Store(&f)
}

// Rule is the rule in use.
func (rt *Routes) Rule() *Rule { return rt.gate.Load().rule }

// Caller is who makes r, as the routes' CallerFunc says.
func (rt *Routes) Caller(r *http.Request) Caller { return rt.gate.Load().caller(r) }

// Handle registers h for pattern under scope; a checked scope wraps h with the rule.
func (rt *Routes) Handle(pattern string, scope Scope, h http.Handler) {
	switch scope.Kind {
	case KindFree, KindSigned, KindAdmin, KindFiltered, KindStorePath, KindPending:
	case KindProject, KindEval, KindJob:
		if scope.Param == "" {
			panic(fmt.Sprintf("access: route %s: %s scope without a path value", pattern, scope.Kind))
		}
		h = rt.check(scope, h)
	default:
		panic(fmt.Sprintf("access: route %s: no scope", pattern))
	}
	route := Route{Pattern: pattern, Scope: scope}
	rt.mu.Lock()
	rt.routes = append(rt.routes, route)
	rt.mu.Unlock()
	rt.mux.Handle(pattern, rt.withFront(route, h))
}

// withFront runs the FrontFunc in use, if any, before h.
func (rt *Routes) withFront(route Route, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f := rt.front.Load(); f != nil {
			(*f)(w, r, route, h)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Path is the path of the route's pattern, without its method and host.
func (r Route) Path() string {
	p := r.Pattern
	if _, rest, ok := strings.Cut(p, " "); ok {
		p = rest
	}
	if i := strings.Index(p, "/"); i > 0 {
		p = p[i:]
	}
	return p
}

// List is every route registered, in order.
func (rt *Routes) List() []Route {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return slices.Clone(rt.routes)
}

// ServeHTTP serves the mux.
func (rt *Routes) ServeHTTP(w http.ResponseWriter, r *http.Request) { rt.mux.ServeHTTP(w, r) }

// CheckTimeout bounds a route's check (its database reads and the forge's answer), as a page's
// work is bounded; the handler's own deadlines start after it (a stream has none as a whole).
const CheckTimeout = httpapi.DBTimeout

// check wraps h: the object named by the scope's path value must be readable by the caller.
// A malformed id goes on to h, which answers it (there is no data behind it). h's request
// carries the check, for Recheck.
func (rt *Routes) check(scope Scope, h http.Handler) http.Handler {
	what := map[ScopeKind]string{KindProject: "project", KindEval: "evaluation", KindJob: "build"}[scope.Kind]
	return httpapi.Handle(rt.logger, func(w http.ResponseWriter, r *http.Request) error {
		ctx, cancel := context.WithTimeout(r.Context(), CheckTimeout)
		defer cancel()
		ok, name, err := rt.allows(ctx, scope, r)
		switch {
		case err != nil:
			return err
		case !ok && scope.deny != nil:
			scope.deny(w, r)
		case !ok:
			return &httpapi.Error{Code: http.StatusNotFound, Msg: fmt.Sprintf("%s %s not found", what, name)}
		default:
			h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), recheckKey{}, recheck{rt, scope})))
		}
		return nil
	})
}

// allows reports whether r's caller may read what scope names in r (ok for a malformed id,
// which the handler answers), and the object's name for the refusal.
func (rt *Routes) allows(ctx context.Context, scope Scope, r *http.Request) (ok bool, name string, err error) {
	g := rt.gate.Load()
	name = r.PathValue(scope.Param)
	c := g.caller(r)
	if c.Admin || c.Kind == Node { // may read anything: the handler says what exists
		return true, name, nil
	}
	if scope.Kind == KindProject {
		ok, err = g.rule.MayReadProject(ctx, c, name)
		return ok, name, err
	}
	id, perr := strconv.ParseInt(name, 10, 64)
	if perr != nil || id <= 0 {
		return true, name, nil
	}
	name = strconv.FormatInt(id, 10)
	if scope.Kind == KindEval {
		ok, err = g.rule.MayReadEval(ctx, c, id)
	} else {
		ok, err = g.rule.MayReadJob(ctx, c, id)
	}
	return ok, name, err
}

// RecheckInterval is how often a long answer (an event stream, a live log) is checked again
// (Revoked): a logout or a withdrawn forge permission ends it within this, plus the forge
// answer's cache.
const RecheckInterval = time.Minute

type recheckKey struct{}

// recheck is the check a request passed, kept in its context.
type recheck struct {
	rt    *Routes
	scope Scope
}

// SetRecheckInterval sets how often Revoked checks again (default RecheckInterval); for tests.
func (rt *Routes) SetRecheckInterval(d time.Duration) { rt.recheckEvery.Store(int64(d)) }

// Revoked returns a channel closed once the caller of r, a request its route's check let
// through, may no longer read what the route names: the session ended, the forge withdrew
// access. It is asked again every RecheckInterval until r's context ends; a check that fails
// counts as revoked (the client reconnects and is answered afresh). For a route without a
// check (free, filtered or signed data) the channel is never closed.
func Revoked(r *http.Request) <-chan struct{} {
	done := make(chan struct{})
	rc, ok := r.Context().Value(recheckKey{}).(recheck)
	if !ok {
		return done
	}
	every := time.Duration(rc.rt.recheckEvery.Load())
	if every <= 0 {
		every = RecheckInterval
	}
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-r.Context().Done():
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(r.Context(), CheckTimeout)
			ok, _, err := rc.rt.allows(ctx, rc.scope, r)
			cancel()
			if r.Context().Err() != nil {
				return
			}
			if err != nil {
				rc.rt.logger.Warn("access check of an open stream failed: ending it", "path", r.URL.Path, "err", err)
			}
			if !ok || err != nil {
				close(done)
				return
			}
		}
	}()
	return done
}
