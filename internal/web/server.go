// Package web is harmonia-ci's HTTP surface shared by every node: health, metrics, the cluster
// API and node administration. Role-specific handlers (signer, cache, UI) mount on the same mux.
package web

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
	"github.com/harmonia-ci/harmonia-ci/internal/startstop"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// Config is what the HTTP server needs from the node.
type Config struct {
	// NodeID is reported by /healthz.
	NodeID string
	// AdminToken authorises administrative requests (Authorization: Bearer). Empty disables
	// them: every such request gets 401.
	AdminToken string
	// Gatherer serves /metrics.
	Gatherer prometheus.Gatherer
	// StatusFunc reports the node's lifecycle status (joining, active, draining); /healthz
	// answers 200 only while it is active, so a load balancer sends nothing to a node that is
	// starting or leaving. Nil means always active.
	StatusFunc func() status.NodeStatus
	// Notifier is the process's LISTEN session; GET /api/builds/{id}/log subscribes to channel
	// build_log through it while a live log is streamed. Nil disables live logs: that endpoint
	// still redirects to a finished build's log, but answers 503 "live logs unavailable" for a
	// running one.
	Notifier *notify.Notifier
	// MaxLogStreams caps the live log streams open at once; a stream past it gets 503 "too many
	// live log streams" with Retry-After. Default DefaultMaxLogStreams (1000); -1: no cap.
	MaxLogStreams int
}

// Server serves the node's HTTP API on one listener.
type Server struct {
	startstop.Base
	cfg    Config
	pool   *pgxpool.Pool
	logger *slog.Logger
	routes *access.Routes
	srv    *http.Server
	ln     net.Listener
	logs   *logHub // nil without a Notifier
	// logStore serves finished builds' logs (ServeLogsFrom); nil: they are redirected to the
	// cache's /log/ path.
	logStore blob.Store

	adminHash httpapi.TokenHash
}

// NewServer builds the server on ln; Start serves. Every route is registered through
// access.Routes with its declaration; until the frontend installs its own (webui), callers are
// the admin token or anonymous, and private projects are the admin token's alone.
func NewServer(cfg Config, pool *pgxpool.Pool, ln net.Listener, logger *slog.Logger) *Server {
	s := &Server{cfg: cfg, pool: pool, ln: ln, logger: logger.With("service", "http")}
	s.routes = access.NewRoutes(http.NewServeMux(), s.logger)
	if cfg.AdminToken != "" {
		s.adminHash = httpapi.HashToken(cfg.AdminToken)
	}
	rule := &access.Rule{}
	if pool != nil {
		rule.DB = pool
	}
	s.routes.Use(rule, s.tokenCaller)
	rt := s.routes
	rt.Handle("GET /healthz", access.Free, s.wrap(s.handleHealthz))
	// Project labels name public, enabled projects only (internal/metrics).
	rt.Handle("GET /metrics", access.Filtered, promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{}))
	// Nodes, not projects: anonymous callers get the public view (publicStatus).
	rt.Handle("GET /api/cluster", access.Free, s.wrap(httpapi.WithDBTimeout(s.handleCluster)))
	rt.Handle("POST /api/nodes/{id}/drain", access.Admin, s.wrap(s.requireAdmin(httpapi.WithDBTimeout(s.handleDrain))))
	if cfg.Notifier != nil {
		maxStreams := cmp.Or(cfg.MaxLogStreams, DefaultMaxLogStreams)
		s.logs = newLogHub(cfg.Notifier, s.readBuildLog, maxStreams, s.logger)
	}
	// Not bounded as a whole: a stream lasts as long as its build. Each read is (logQueryTimeout).
	rt.Handle("GET /api/builds/{id}/log", access.Job("id"), s.wrap(s.handleBuildLog))
	s.srv = &http.Server{
		Handler:           rt,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.logger.Handler(), slog.LevelWarn),
	}
	return s
}

// Routes lets roles mount their handlers, each with its declaration.
func (s *Server) Routes() *access.Routes { return s.routes }

// tokenCaller is the caller of a node without the frontend's sessions: the admin token, or
// anonymous.
func (s *Server) tokenCaller(r *http.Request) access.Caller {
	if s.cfg.AdminToken == "" {
		return access.Caller{}
	}
	if token, ok := httpapi.BearerToken(r); ok && s.adminHash.Matches(token) {
		return access.Caller{Kind: access.AdminToken, Admin: true}
	}
	return access.Caller{}
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Start serves until Stop. Stop ends live log streams first: Shutdown waits for open
// responses, and a stream is one that never finishes on its own.
func (s *Server) Start(ctx context.Context) error {
	s.Run(ctx, func(ctx context.Context) {
		if s.logs != nil {
			hctx, cancel := context.WithCancel(ctx)
			hubDone := make(chan struct{})
			go func() {
				defer close(hubDone)
				s.logs.run(hctx)
			}()
			defer func() { cancel(); <-hubDone }()
		}
		errc := make(chan error, 1)
		go func() { errc <- s.srv.Serve(s.ln) }()
		select {
		case err := <-errc:
			if !errors.Is(err, http.ErrServerClosed) {
				s.logger.Error("http server stopped", "error", err)
			}
			return
		case <-ctx.Done():
		}
		if s.logs != nil {
			<-s.logs.quit // the hub saw ctx end too: streams are returning
		}
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.srv.Shutdown(sctx)
		<-errc
	})
	return nil
}

// healthPingTimeout bounds /healthz's database ping: shorter than httpapi.DBTimeout, since load
// balancers probe with short timeouts of their own.
const healthPingTimeout = 2 * time.Second

func (s *Server) handleHealthz(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), healthPingTimeout)
	defer cancel()
	if err := s.pool.Ping(ctx); err != nil {
		return &httpapi.Error{Code: http.StatusServiceUnavailable, Msg: "database unavailable", Err: err}
	}
	word, code := "ok", http.StatusOK
	if s.cfg.StatusFunc != nil {
		if st := s.cfg.StatusFunc(); st != status.NodeActive {
			word, code = string(st), http.StatusServiceUnavailable
		}
	}
	httpapi.WriteJSON(w, code, map[string]string{"status": word, "node_id": s.cfg.NodeID})
	return nil
}

// handleCluster is GET /api/cluster: the whole status for admins and logged-in users, and to
// anyone else what the web UI shows them (publicStatus).
func (s *Server) handleCluster(w http.ResponseWriter, r *http.Request) error {
	st, err := cluster.ReadStatus(r.Context(), s.pool)
	if err != nil {
		return err
	}
	if c := s.routes.Caller(r); c.Kind == access.Anonymous {
		httpapi.WriteJSON(w, http.StatusOK, publicStatus(st))
		return nil
	}
	httpapi.WriteJSON(w, http.StatusOK, st)
	return nil
}

// PublicNode is a node as anonymous callers see it: what it does and how busy it is; not where
// it is (endpoint, hostname) nor what it runs (versions), which help an attacker more than a
// user.
type PublicNode struct {
	ID          string            `json:"id"`
	Status      status.NodeStatus `json:"status"`
	Roles       []string          `json:"roles"`
	Draining    bool              `json:"draining"`
	LastSeen    time.Time         `json:"last_seen"`
	CurrentJobs int               `json:"current_jobs"`
	MaxJobs     int               `json:"max_jobs"`
	Systems     []string          `json:"systems"`
	Features    []string          `json:"features"`
}

// PublicLeader is a leader role as anonymous callers see it.
type PublicLeader struct {
	Role   string `json:"role"`
	NodeID string `json:"node_id"`
	Valid  bool   `json:"valid"`
}

// PublicStatus is GET /api/cluster for anonymous callers.
type PublicStatus struct {
	Nodes   []PublicNode              `json:"nodes"`
	Leaders []PublicLeader            `json:"leaders"`
	Counts  map[status.NodeStatus]int `json:"counts"`
}

func publicStatus(st cluster.Status) PublicStatus {
	p := PublicStatus{Nodes: []PublicNode{}, Leaders: []PublicLeader{}, Counts: st.Counts}
	for _, n := range st.Nodes {
		p.Nodes = append(p.Nodes, PublicNode{ID: n.ID, Status: n.Status, Roles: n.Roles, Draining: n.Draining,
			LastSeen: n.LastSeen, CurrentJobs: n.CurrentJobs, MaxJobs: n.MaxJobs, Systems: n.Systems, Features: n.Features})
	}
	for _, l := range st.Leaders {
		p.Leaders = append(p.Leaders, PublicLeader{Role: l.Role, NodeID: l.NodeID, Valid: l.Valid})
	}
	return p
}

var nodeIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

func (s *Server) handleDrain(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if !nodeIDPattern.MatchString(id) {
		return &httpapi.Error{Code: http.StatusBadRequest, Msg: "invalid node id: letters, digits, '.', '_', '-'; at most 63 characters"}
	}
	err := cluster.RequestDrain(r.Context(), s.pool, id)
	if errors.Is(err, cluster.ErrNodeNotFound) {
		return &httpapi.Error{Code: http.StatusNotFound, Msg: "no live node " + id}
	}
	if err != nil {
		return err
	}
	s.logger.Info("drain requested through the API", "node_id", id, "remote", r.RemoteAddr)
	httpapi.WriteJSON(w, http.StatusAccepted, map[string]string{"node_id": id, "status": "draining requested"})
	return nil
}

// wrap is httpapi.Handle with the server's logger.
func (s *Server) wrap(h httpapi.HandlerFunc) http.Handler { return httpapi.Handle(s.logger, h) }

// requireAdmin lets a request through only with the admin bearer token.
func (s *Server) requireAdmin(h httpapi.HandlerFunc) httpapi.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if s.cfg.AdminToken == "" {
			return httpapi.Unauthorized(w, "admin API disabled: no admin token configured (auth.admin_token_file or HARMONIA_ADMIN_TOKEN)")
		}
		token, ok := httpapi.BearerToken(r)
		if !ok || !s.adminHash.Matches(token) {
			return httpapi.Unauthorized(w, "missing or invalid admin token")
		}
		return h(w, r)
	}
}
