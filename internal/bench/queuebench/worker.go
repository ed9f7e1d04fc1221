package queuebench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// WorkerOptions configures `harmonia-ci bench worker`: a builder node whose builds do nothing,
// to load a real queue from a separate process.
type WorkerOptions struct {
	DatabaseURL string
	NodeID      string
	Systems     []string
	Slots       int
	// UntilEmpty stops the worker once no job is pending or in progress.
	UntilEmpty bool
	Logger     *slog.Logger
}

// Worker registers a builder node, claims and succeeds jobs with Slots build slots, and
// deregisters when ctx ends (or the queue is empty, with UntilEmpty). It returns the number of
// jobs it built.
func Worker(ctx context.Context, o WorkerOptions) (int64, error) {
	if o.DatabaseURL == "" {
		return 0, fmt.Errorf("bench worker: --database-url is required")
	}
	pool, err := db.Connect(ctx, o.DatabaseURL, db.PoolConfig{ApplicationName: "harmonia-ci bench worker " + o.NodeID, MaxConns: int32(o.Slots + 4)})
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	host, _ := os.Hostname()
	reg := cluster.NewRegistry(pool, cluster.NodeInfo{
		ID: o.NodeID, Roles: []string{"builder"}, Endpoint: "http://bench.invalid", Hostname: host,
		Systems: o.Systems, Features: []string{}, MaxJobs: o.Slots, MaxEvals: 1, Version: "bench",
	}, o.Logger)
	reg.OnReregister(queue.ReleaseNode)
	if err := reg.Register(ctx); err != nil {
		return 0, err
	}
	defer reg.Deregister(context.WithoutCancel(ctx))
	notifier := notify.New(notify.Config{}, pool, o.Logger, clock.Real{})
	if err := notifier.Start(ctx); err != nil {
		return 0, err
	}
	defer notifier.Stop()
	var built atomic.Int64
	w, err := queue.NewWorker(queue.WorkerConfig{
		Claimer: queue.Claimer{NodeID: o.NodeID, Systems: o.Systems}, MaxJobs: o.Slots,
		PollInterval: 500 * time.Millisecond, Notifier: notifier,
		Handler:   func(context.Context, queue.Job) queue.Result { return queue.Result{} },
		ClaimFunc: func(_ time.Duration, jobs []queue.Job) { built.Add(int64(len(jobs))) },
	}, pool, o.Logger, clock.Real{})
	if err != nil {
		return 0, err
	}
	hb := cluster.NewHeartbeat(cluster.HeartbeatConfig{Interval: time.Second, LoadFunc: func() cluster.Load {
		return cluster.Load{CurrentJobs: w.Running(), SpeedFactor: w.SpeedFactor()}
	}}, reg, cluster.NewMetrics(prometheus.NewRegistry()), o.Logger, clock.Real{})
	if err := hb.Start(ctx); err != nil {
		return 0, err
	}
	defer hb.Stop()
	if err := reg.SetStatus(ctx, status.NodeActive); err != nil {
		return 0, err
	}
	if err := w.Start(ctx); err != nil {
		return 0, err
	}
	defer w.Stop()
	if !o.UntilEmpty {
		<-ctx.Done()
		return built.Load(), nil
	}
	err = waitDone(ctx, pool, 24*time.Hour)
	return built.Load(), err
}
