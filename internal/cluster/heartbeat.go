package cluster

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/startstop"
)

// Liveness defaults (cluster.heartbeat in the configuration).
const (
	// DefaultHeartbeatInterval is how often a node beats.
	DefaultHeartbeatInterval = 30 * time.Second
	// DefaultDeadThreshold is the silence after which a node counts as dead: four missed
	// beats. Whatever judges liveness (the reaper, the signer and cache lookups) defaults to it.
	DefaultDeadThreshold = 2 * time.Minute
)

// HeartbeatConfig configures the heartbeat loop.
type HeartbeatConfig struct {
	// Interval between beats. Default DefaultHeartbeatInterval.
	Interval time.Duration
	// LoadFunc reports the node's load for each beat; nil reports zeros.
	LoadFunc func() Load
	// OnDrain is called once, from the loop, the first time a beat finds the node's draining
	// flag set (an operator ran `harmonia-ci drain` or POST /api/nodes/{id}/drain).
	OnDrain func()
	// OnSuperseded is called once if another process took over the node id; the node must stop.
	OnSuperseded func(err error)
	// BeatFunc is called after every beat with its error (nil on success); tests use it.
	BeatFunc func(err error)
}

// Heartbeat keeps the node's row alive. It never uses the node's clock for liveness: last_seen
// is the database's now().
type Heartbeat struct {
	startstop.Base
	cfg      HeartbeatConfig
	registry *Registry
	logger   *slog.Logger
	clock    clock.Clock
	metrics  *Metrics

	once sync.Once // OnDrain
}

// NewHeartbeat builds the loop; Start runs it.
func NewHeartbeat(cfg HeartbeatConfig, registry *Registry, metrics *Metrics, logger *slog.Logger, clk clock.Clock) *Heartbeat {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultHeartbeatInterval
	}
	return &Heartbeat{cfg: cfg, registry: registry, metrics: metrics, logger: logger.With("service", "heartbeat"), clock: clk}
}

// Start beats once right away (so a failure to reach the database shows at start) and then every
// Interval until Stop. A second Start is a no-op.
func (h *Heartbeat) Start(ctx context.Context) error {
	_, err := h.Launch(ctx, func() (func(context.Context), error) {
		stop := h.beat(ctx)
		return func(ctx context.Context) {
			for !stop {
				select {
				case <-ctx.Done():
					return
				case <-h.clock.After(h.cfg.Interval):
					stop = h.beat(ctx)
				}
			}
		}, nil
	})
	return err
}

// beat reports whether the loop must end.
func (h *Heartbeat) beat(ctx context.Context) (stop bool) {
	var load Load
	if h.cfg.LoadFunc != nil {
		load = h.cfg.LoadFunc()
	}
	bctx, cancel := context.WithTimeout(ctx, h.cfg.Interval)
	draining, err := h.registry.Beat(bctx, load)
	cancel()
	if h.cfg.BeatFunc != nil {
		h.cfg.BeatFunc(err)
	}
	switch {
	case errors.Is(err, ErrSuperseded):
		h.logger.Error("another process registered this node id; stopping", "node_id", h.registry.ID(), "error", err)
		if h.cfg.OnSuperseded != nil {
			h.cfg.OnSuperseded(err)
		}
		return true
	case err != nil:
		if ctx.Err() == nil {
			h.metrics.heartbeatFailures.Inc()
			h.logger.Warn("heartbeat failed", "error", err)
		}
	case draining && h.cfg.OnDrain != nil:
		h.once.Do(func() {
			h.logger.Info("drain requested for this node")
			h.cfg.OnDrain()
		})
	}
	return false
}
