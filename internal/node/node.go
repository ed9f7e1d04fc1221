// Package node runs one harmonia-ci node: it opens (or starts) the database, migrates it,
// registers the node, starts the services of its roles and, on a signal or a drain request,
// shuts them down in the order that loses nothing.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/builder"
	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/eval"
	"github.com/harmonia-ci/harmonia-ci/internal/metrics"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/startstop"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/web"
)

// Options are the parts of a node that do not come from the configuration.
type Options struct {
	// Version is recorded in the nodes table.
	Version string
	// Force, when closed during a drain, stops waiting for in-flight work (a second signal).
	Force <-chan struct{}
	// Clock defaults to the real clock.
	Clock clock.Clock
	// BuildObserver, if set, receives the step timings of every job this node builds (the
	// end-to-end benchmark runs nodes in-process for these).
	BuildObserver func(builder.Timings)
	// ClaimObserver, if set, receives the latency of every claim this node's builder makes.
	ClaimObserver func(latency time.Duration, jobs []queue.Job)
	// Ready, if set, is called once, when every role has started and the node is registered
	// active: what in-process callers (the benchmarks) wait for instead of polling the nodes
	// table.
	Ready func()
	// Routes, if set, is given the node's HTTP routes once every role has mounted its own, before
	// they are served: a test enumerates them (each with its access.Scope) and serves them.
	Routes func(*access.Routes)
}

// Run runs the node until ctx ends (a signal), an operator drains it, or it cannot go on.
// A drain ends with a nil error: the process should exit 0.
func Run(ctx context.Context, cfg *config.Config, logger *slog.Logger, opts Options) error {
	clk := opts.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	pool, closeDB, err := OpenDatabase(ctx, cfg, logger, true)
	if err != nil {
		return err
	}
	defer closeDB()

	res, err := db.Migrate(ctx, pool, cfg.Node.ID)
	if err != nil {
		return err
	}
	if len(res.Applied) > 0 {
		logger.Info("applied database migrations", "versions", res.Applied, "schema_version", res.Current)
	}

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	defer ln.Close()

	n := &node{cfg: cfg, logger: logger, pool: pool, clock: clk, drainReq: make(chan struct{}), fatal: make(chan error, 1), opts: opts}
	return n.run(ctx, ln, opts)
}

type node struct {
	cfg    *config.Config
	opts   Options
	logger *slog.Logger
	pool   *pgxpool.Pool
	clock  clock.Clock

	reg         *prometheus.Registry // the node's /metrics
	inFlight    cluster.InFlight
	buildWorker *queue.Worker    // nil unless the node builds
	builder     *builder.Builder // nil unless the node builds
	evaluator   *eval.Evaluator  // nil unless the node evaluates
	active      atomic.Bool      // set once every service runs
	drainOnce   sync.Once
	drainReq    chan struct{}
	fatal       chan error
}

// nixInfo is the Nix the node runs, once its roles started: the builder's daemon (what builds
// here), else the evaluator's Nix.
func (n *node) nixInfo() cluster.NixInfo {
	switch {
	case n.builder != nil:
		d := n.builder.Daemon()
		return cluster.NixInfo{Version: d.Version, Protocol: d.Protocol}
	case n.evaluator != nil:
		return cluster.NixInfo{Version: n.evaluator.NixVersion()}
	}
	return cluster.NixInfo{}
}

func (n *node) requestDrain() { n.drainOnce.Do(func() { close(n.drainReq) }) }

// status is the node's lifecycle status as its health check reports it.
func (n *node) status() status.NodeStatus {
	switch {
	case n.inFlight.Closed():
		return status.NodeDraining
	case n.active.Load():
		return status.NodeActive
	default:
		return status.NodeJoining
	}
}

func (n *node) run(ctx context.Context, ln net.Listener, opts Options) error {
	cfg := n.cfg
	endpoint := cfg.Node.Endpoint
	if endpoint == "" {
		endpoint = endpointFor(ln.Addr())
	}
	hostname, _ := os.Hostname()

	reg := prometheus.NewRegistry()
	n.reg = reg
	// Every node reports the cluster's state (one cheap query per scrape), so any node can be
	// scraped for it.
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		cluster.NewNodeCountCollector(n.pool), metrics.NewCollector(n.pool))
	clusterMetrics := cluster.NewMetrics(reg)

	registry := cluster.NewRegistry(n.pool, cluster.NodeInfo{
		ID: cfg.Node.ID, Roles: cfg.Node.Roles, Endpoint: endpoint, Hostname: hostname,
		Systems: cfg.Node.Systems, Features: cfg.Node.Features, MaxJobs: cfg.Node.MaxJobs,
		MaxEvals: cfg.Node.MaxEvals, Version: opts.Version,
	}, n.logger)
	registry.OnReregister(queue.ReleaseNode)
	if err := registry.Register(ctx); err != nil {
		return err
	}
	id := cluster.Identity{NodeID: cfg.Node.ID, Incarnation: registry.Incarnation()}

	var sampler loadSampler
	heartbeat := cluster.NewHeartbeat(cluster.HeartbeatConfig{
		Interval: cfg.Cluster.Heartbeat.Interval.Duration,
		LoadFunc: func() cluster.Load {
			l := cluster.Load{CurrentJobs: n.inFlight.Count(), CPU: sampler.cpu(), Memory: memory()}
			if n.buildWorker != nil {
				l.SpeedFactor = n.buildWorker.SpeedFactor()
			}
			return l
		},
		OnDrain:      n.requestDrain,
		OnSuperseded: func(err error) { n.fatal <- err },
	}, registry, clusterMetrics, n.logger, n.clock)

	// One LISTEN connection per process; role services and log streams subscribe to it.
	notifier := notify.New(notify.Config{}, n.pool, n.logger, n.clock)
	defer notifier.Stop()

	httpServer := web.NewServer(web.Config{
		NodeID: cfg.Node.ID, AdminToken: cfg.Auth.AdminToken, Gatherer: reg,
		StatusFunc: n.status, Notifier: notifier,
	}, n.pool, ln, n.logger)
	// Finished builds are announced in batches (see queue.Announcer).
	announcer := queue.NewAnnouncer(n.pool, 0, n.logger)
	store, err := mountRoles(ctx, cfg, httpServer.Routes(), n.pool, endpoint, announcer, n.logger, reg)
	if err != nil {
		return err
	}

	lockConn := cluster.NewLockConn(n.pool, n.logger)
	defer lockConn.Close()
	var electors, frontend []startstop.Service
	if cfg.HasRole(config.RoleFrontend) {
		reporter, forgeTasks, err := n.forgeSide(httpServer, notifier, endpoint, store)
		if err != nil {
			return err
		}
		if reporter != nil {
			frontend = append(frontend, reporter)
		}
		le := cfg.Cluster.LeaderElection
		hb := cfg.Cluster.Heartbeat
		q := cfg.Queue
		tasks := append(cluster.NodeTasks(cluster.NodeTasksConfig{
			Interval: hb.Interval.Duration, DeadThreshold: hb.DeadThreshold.Duration,
			DeadRetention: hb.DeadRetention.Duration,
		}, n.logger), queue.MaintenanceTasks(queue.MaintenanceConfig{
			DeadThreshold: hb.DeadThreshold.Duration, ReapInterval: q.ReapInterval.Duration,
			UnsupportedInterval: q.UnsupportedInterval.Duration, UnsupportedGrace: q.UnsupportedGrace.Duration,
			DecayInterval: q.ShareDecayInterval.Duration, AuditInterval: q.ReadinessAuditInterval.Duration,
			Registerer: reg,
		}, n.logger)...)
		tasks = append(tasks, forgeTasks...)
		maint := cluster.NewMaintainer(n.pool, tasks, n.logger, n.clock)
		e, err := cluster.NewElector(cluster.ElectorConfig{
			Role: cluster.RoleMaintenance, CheckInterval: le.CheckInterval.Duration,
			LeaseDuration: le.LeaseDuration.Duration, RefreshInterval: le.RefreshInterval.Duration,
			LeaderFunc: maint.Lead, Notifier: notifier,
		}, n.pool, lockConn, id, clusterMetrics, n.logger, n.clock)
		if err != nil {
			return err
		}
		electors = append(electors, e)
	}

	if cfg.HasRole(config.RoleSigner) && store != nil {
		e, err := n.gcElector(store, notifier, lockConn, id, clusterMetrics)
		if err != nil {
			return err
		}
		electors = append(electors, e)
	}

	workers, err := n.roleWorkers(notifier, announcer)
	if err != nil {
		return err
	}
	if opts.Routes != nil {
		opts.Routes(httpServer.Routes())
	}
	// The reporter stops with the workers: what it delivers is recorded before each call.
	workers = append(workers, frontend...)

	// Services start in dependency order and stop in reverse (see shutdown).
	services := append(append([]startstop.Service{announcer, httpServer, notifier, heartbeat}, electors...), workers...)
	for _, s := range services {
		if err := s.Start(ctx); err != nil {
			startstop.StopAll(services...)
			return err
		}
	}
	// A signal arriving now must not fail the start half-way: finish it, then shut down below.
	if nix := n.nixInfo(); nix.Version != "" {
		if err := registry.SetNix(context.WithoutCancel(ctx), nix); err != nil {
			startstop.StopAll(services...)
			return err
		}
	}
	if err := registry.SetStatus(context.WithoutCancel(ctx), status.NodeActive); err != nil {
		startstop.StopAll(services...)
		return err
	}
	n.active.Store(true)
	if opts.Ready != nil {
		opts.Ready()
	}
	n.logger.Info("node ready", "node_id", cfg.Node.ID, "incarnation", id.Incarnation.String(),
		"roles", strings.Join(cfg.Node.Roles, ","), "listen", ln.Addr().String(), "endpoint", endpoint)

	var fatalErr error
	select {
	case <-ctx.Done():
		n.logger.Info("shutting down: signal received")
	case <-n.drainReq:
		n.logger.Info("shutting down: drain requested")
	case fatalErr = <-n.fatal:
		n.logger.Error("shutting down", "error", fatalErr)
	}
	return n.shutdown(registry, workers, electors, heartbeat, httpServer, announcer, opts.Force, fatalErr)
}

// shutdown stops in the order that loses nothing: stop taking work, mark the node draining,
// wait for in-flight work (bounded), stop leader work and resign, stop the heartbeat,
// deregister, and only then close the HTTP server, so health checks see "draining" throughout.
func (n *node) shutdown(registry *cluster.Registry, workers, electors []startstop.Service, heartbeat, httpServer, announcer startstop.Service, force <-chan struct{}, fatalErr error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n.inFlight.Close()
	superseded := errors.Is(fatalErr, cluster.ErrSuperseded)
	if !superseded {
		if err := registry.StartDraining(ctx); err != nil {
			n.logger.Warn("could not mark the node draining", "error", err)
		}
	}

	timeout := n.cfg.Cluster.Shutdown.DrainTimeout.Duration
	wctx, wcancel := context.WithTimeout(context.Background(), timeout)
	go func() {
		select {
		case <-force:
			n.logger.Warn("second signal: not waiting for in-flight work")
			wcancel()
		case <-wctx.Done():
		}
	}()
	if left := n.inFlight.Wait(wctx); left > 0 {
		n.logger.Warn("drain timeout: work still in flight", "in_flight", left, "drain_timeout", timeout.String())
	}
	wcancel()

	startstop.StopAll(workers...)  // what is still running is killed and handed back
	startstop.StopAll(electors...) // resigns: leader work has stopped by then
	heartbeat.Stop()
	if !superseded {
		if err := registry.Deregister(ctx); err != nil {
			n.logger.Warn("could not deregister", "error", err)
		} else {
			n.logger.Info("deregistered", "node_id", registry.ID())
		}
	}
	httpServer.Stop()
	announcer.Stop()
	return fatalErr
}

// endpointFor derives the URL other nodes use to reach this one from the listen address.
func endpointFor(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "http://" + addr.String()
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil {
			host = h
		}
	}
	return "http://" + net.JoinHostPort(host, port)
}
