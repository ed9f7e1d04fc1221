package access

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

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
	rt.mu.Lock()
	rt.routes = append(rt.routes, Route{Pattern: pattern, Scope: scope})
	rt.mu.Unlock()
	rt.mux.Handle(pattern, h)
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
// A malformed id goes on to h, which answers it (there is no data behind it).
func (rt *Routes) check(scope Scope, h http.Handler) http.Handler {
	what := map[ScopeKind]string{KindProject: "project", KindEval: "evaluation", KindJob: "build"}[scope.Kind]
	return httpapi.Handle(rt.logger, func(w http.ResponseWriter, r *http.Request) error {
		g := rt.gate.Load()
		name := r.PathValue(scope.Param)
		c := g.caller(r)
		if c.Admin || c.Kind == Node { // may read anything: the handler says what exists
			h.ServeHTTP(w, r)
			return nil
		}
		ctx, cancel := context.WithTimeout(r.Context(), CheckTimeout)
		defer cancel()
		var ok bool
		var err error
		switch scope.Kind {
		case KindProject:
			ok, err = g.rule.MayReadProject(ctx, c, name)
		default:
			id, perr := strconv.ParseInt(name, 10, 64)
			if perr != nil || id <= 0 {
				h.ServeHTTP(w, r)
				return nil
			}
			name = strconv.FormatInt(id, 10)
			if scope.Kind == KindEval {
				ok, err = g.rule.MayReadEval(ctx, c, id)
			} else {
				ok, err = g.rule.MayReadJob(ctx, c, id)
			}
		}
		switch {
		case err != nil:
			return err
		case !ok && scope.deny != nil:
			scope.deny(w, r)
		case !ok:
			return &httpapi.Error{Code: http.StatusNotFound, Msg: fmt.Sprintf("%s %s not found", what, name)}
		default:
			h.ServeHTTP(w, r)
		}
		return nil
	})
}
