package builder

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/startstop"
)

const (
	tailDefaultInterval = 2 * time.Second
	tailDefaultSize     = 64 << 10
	// tailWriteTimeout bounds one upsert, so a hung connection holds neither the loop nor Stop
	// for long.
	tailWriteTimeout = 10 * time.Second
)

// TailConfig configures a TailWriter.
type TailConfig struct {
	JobID    int64
	Log      *LogBuffer
	Interval time.Duration // between writes; default 2s
	TailSize int           // bytes of the log's end to publish; default 64 KiB
}

// TailWriter keeps a running build's live log tail in build_log_tails for the web UI: every
// Interval it upserts the last TailSize bytes of the log, if the log changed since its last
// write. The table is UNLOGGED and the tail a convenience, so a failed write is logged and
// retried on the next tick but never fails the build.
type TailWriter struct {
	startstop.Base
	cfg    TailConfig
	pool   *pgxpool.Pool
	logger *slog.Logger
	clock  clock.Clock

	mu       sync.Mutex // serialises the loop's writes with Stop's last one
	written  int64      // the log's Seq at the last successful write
	failures int        // consecutive failed writes
}

// NewTailWriter builds the writer of job cfg.JobID's tail; Start runs it.
func NewTailWriter(cfg TailConfig, pool *pgxpool.Pool, logger *slog.Logger, clk clock.Clock) *TailWriter {
	if cfg.Interval <= 0 {
		cfg.Interval = tailDefaultInterval
	}
	if cfg.TailSize <= 0 {
		cfg.TailSize = tailDefaultSize
	}
	return &TailWriter{
		cfg:    cfg,
		pool:   pool,
		logger: logger.With("service", "log-tail", "job_id", cfg.JobID),
		clock:  clk,
	}
}

// Start writes the tail every Interval until Stop or the end of ctx.
func (w *TailWriter) Start(ctx context.Context) error {
	if w.cfg.Log == nil {
		return fmt.Errorf("start log tail of job %d: no log buffer", w.cfg.JobID)
	}
	w.Run(ctx, func(ctx context.Context) {
		for {
			select {
			case <-ctx.Done():
				return
			case <-w.clock.After(w.cfg.Interval):
				w.write(ctx)
			}
		}
	})
	return nil
}

// Stop ends the loop, then writes a last tail if the log changed since the previous write, so
// the table shows the build's final output until the full log is uploaded. Idempotent; a no-op
// before Start.
func (w *TailWriter) Stop() {
	if w.Done() == nil {
		return
	}
	w.Base.Stop()
	// The loop's context is gone; the last write gets its own.
	ctx, cancel := context.WithTimeout(context.Background(), tailWriteTimeout)
	defer cancel()
	w.write(ctx)
}

// write upserts the tail if the log changed since the last successful write.
func (w *TailWriter) write(ctx context.Context) {
	w.mu.Lock()
	defer w.mu.Unlock()
	tail, seq := w.cfg.Log.tailSeq(w.cfg.TailSize)
	if seq == w.written {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, tailWriteTimeout)
	_, err := w.pool.Exec(wctx, sqlUpsertTail, w.cfg.JobID, tail)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return // stopping: Stop makes the last write
		}
		w.failures++
		err = fmt.Errorf("upsert log tail of job %d: %w", w.cfg.JobID, err)
		// Once per streak: a job row that is gone fails every tick for the rest of the build.
		if w.failures == 1 {
			w.logger.Warn("could not write the live log tail; retrying every interval", "error", err)
		} else {
			w.logger.Debug("could not write the live log tail", "error", err, "failures", w.failures)
		}
		return
	}
	if w.failures > 0 {
		w.logger.Info("live log tail written again", "failed_writes", w.failures)
		w.failures = 0
	}
	w.written = seq
}
