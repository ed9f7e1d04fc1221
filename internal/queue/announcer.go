package queue

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/startstop"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// Announcer sends the build_jobs notifications of finished jobs in batches. A transaction that
// issues NOTIFY takes one database-wide lock at commit, so with a NOTIFY in every finish the
// finishes queued on that lock (measured: half of a finish's time). Batching makes one
// notifying transaction per flush serve every job finished meanwhile, at the cost of up to
// Interval of extra wake-up latency. A payload is
//
//	{"status":"succeeded","drv_paths":["/nix/store/…drv", …]}
//
// NOTIFY is a wake-up, not a record: it is lost if the process dies before the flush, as it is
// for a listener that is disconnected, so consumers always reconcile from the tables.
type Announcer struct {
	startstop.Base
	pool     *pgxpool.Pool
	interval time.Duration
	logger   *slog.Logger

	mu      sync.Mutex
	pending map[status.JobStatus][]string // drv paths by the status they reached
	kick    chan struct{}
}

// NewAnnouncer batches for interval (default 5ms) before sending.
func NewAnnouncer(pool *pgxpool.Pool, interval time.Duration, logger *slog.Logger) *Announcer {
	if interval <= 0 {
		interval = 5 * time.Millisecond
	}
	return &Announcer{pool: pool, interval: interval, logger: logger.With("service", "announcer"), kick: make(chan struct{}, 1)}
}

// Finished queues the announcement of a job that reached status st.
func (a *Announcer) Finished(drvPath string, st status.JobStatus) {
	a.mu.Lock()
	if a.pending == nil {
		a.pending = map[status.JobStatus][]string{}
	}
	a.pending[st] = append(a.pending[st], drvPath)
	a.mu.Unlock()
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// Start sends batches until Stop, which sends what is left.
func (a *Announcer) Start(ctx context.Context) error {
	a.Run(ctx, func(ctx context.Context) {
		defer a.Flush(context.WithoutCancel(ctx))
		for {
			select {
			case <-ctx.Done():
				return
			case <-a.kick:
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(a.interval):
			}
			if err := a.Flush(ctx); err != nil && ctx.Err() == nil {
				a.logger.Warn("could not send job notifications", "error", err)
			}
		}
	})
	return nil
}

// maxPayload keeps each notification under PostgreSQL's 8000-byte payload limit.
const maxPayload = 7800

// Flush sends everything queued, in as few notifications as the payload limit allows, from one
// statement.
func (a *Announcer) Flush(ctx context.Context) error {
	a.mu.Lock()
	pending := a.pending
	a.pending = nil
	a.mu.Unlock()
	var payloads []string
	for st, paths := range pending {
		payloads = append(payloads, batchPayloads(st, paths)...)
	}
	if len(payloads) == 0 {
		return nil
	}
	_, err := a.pool.Exec(ctx, sqlNotifyMany, payloads)
	return err
}

func batchPayloads(st status.JobStatus, paths []string) []string {
	var out []string
	type payload struct {
		Status   status.JobStatus `json:"status"`
		DrvPaths []string         `json:"drv_paths"`
	}
	start, size := 0, 40
	for i, p := range paths {
		if size+len(p)+3 > maxPayload && i > start {
			b, _ := json.Marshal(payload{st, paths[start:i]})
			out = append(out, string(b))
			start, size = i, 40
		}
		size += len(p) + 3
	}
	b, _ := json.Marshal(payload{st, paths[start:]})
	return append(out, string(b))
}
