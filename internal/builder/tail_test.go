package builder_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/builder"
	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/logtest"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

const (
	tailInterval = 20 * time.Millisecond
	tailWait     = 10 * time.Second
)

// tailJob enqueues the fixture derivation called name and returns its job id, so a
// build_log_tails row may reference it.
func tailJob(t *testing.T, pool *pgxpool.Pool, name string) int64 {
	t.Helper()
	queuetest.Enqueue(t, pool, nil, queuetest.Drv(name, "x86_64-linux"))
	return queuetest.Job(t, pool, name).ID
}

// tailRow is a build_log_tails row; ok is false when there is none.
type tailRow struct {
	tail []byte
	seq  int64
	ok   bool
}

func tailRead(t *testing.T, pool *pgxpool.Pool, jobID int64) tailRow {
	t.Helper()
	var r tailRow
	err := pool.QueryRow(context.Background(),
		`SELECT log_tail, log_seq FROM build_log_tails WHERE build_job_id = $1`, jobID).Scan(&r.tail, &r.seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return r
	}
	if err != nil {
		t.Fatalf("read log tail of job %d: %v", jobID, err)
	}
	r.ok = true
	return r
}

// tailWaitFor waits until job jobID's row holds want and returns the row.
func tailWaitFor(t *testing.T, pool *pgxpool.Pool, jobID int64, want []byte) tailRow {
	t.Helper()
	var r tailRow
	// &r.tail is formatted only if the wait fails, so the message shows the last read.
	waittest.For(t, tailWait, func() bool {
		r = tailRead(t, pool, jobID)
		return r.ok && bytes.Equal(r.tail, want)
	}, "log tail of job %d to be %q (last seen %q)", jobID, want, &r.tail)
	return r
}

// tailStart starts a writer on the real clock, stopped at the end of the test.
func tailStart(t *testing.T, pool *pgxpool.Pool, cfg builder.TailConfig, logger *slog.Logger) *builder.TailWriter {
	t.Helper()
	w := builder.NewTailWriter(cfg, pool, logger, clock.Real{})
	if err := w.Start(context.Background()); err != nil {
		t.Fatalf("start tail writer: %v", err)
	}
	t.Cleanup(w.Stop)
	return w
}

func TestTailWriterStreamsLog(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	job := tailJob(t, pool, "streams")
	log := builder.NewLogBuffer(1<<20, clock.Real{})
	tailStart(t, pool, builder.TailConfig{JobID: job, Log: log, Interval: tailInterval}, queuetest.TestLogger(t))

	for i := range 3 {
		fmt.Fprintf(log, "line %d\n", i)
	}
	first := tailWaitFor(t, pool, job, log.Bytes())
	if !bytes.HasSuffix(first.tail, []byte("line 2\n")) || first.seq < 1 {
		t.Fatalf("tail %q seq %d", first.tail, first.seq)
	}

	// No output, no writes.
	waittest.Hold(t, 10*tailInterval, func() {
		if r := tailRead(t, pool, job); r.seq != first.seq {
			t.Fatalf("log_seq moved from %d to %d without output", first.seq, r.seq)
		}
	})

	fmt.Fprintf(log, "line 3\n")
	second := tailWaitFor(t, pool, job, log.Bytes())
	if second.seq != first.seq+1 {
		t.Errorf("log_seq %d after one change, want %d", second.seq, first.seq+1)
	}
}

func TestTailWriterNotifiesBuildLog(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	job := tailJob(t, pool, "notifies")
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatalf("connect listener: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, "LISTEN build_log"); err != nil {
		t.Fatalf("listen: %v", err)
	}
	log := builder.NewLogBuffer(1<<20, clock.Real{})
	tailStart(t, pool, builder.TailConfig{JobID: job, Log: log, Interval: tailInterval}, queuetest.TestLogger(t))

	// The first write inserts the row (migration 0004 announces inserts too), later ones update it.
	for _, line := range []string{"first", "second"} {
		fmt.Fprintln(log, line)
		wctx, cancel := context.WithTimeout(ctx, tailWait)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil {
			t.Fatalf("wait for the notification of %q: %v", line, err)
		}
		if n.Channel != "build_log" || n.Payload != strconv.FormatInt(job, 10) {
			t.Errorf("notification %s %q, want build_log %q", n.Channel, n.Payload, strconv.FormatInt(job, 10))
		}
		if r := tailRead(t, pool, job); !bytes.Equal(r.tail, log.Bytes()) {
			t.Errorf("after the notification the tail is %q, want %q", r.tail, log.Bytes())
		}
	}
}

func TestTailWriterTailSize(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	tests := []struct {
		name     string
		tailSize int
		logLines int
		want     int // bytes of the tail
	}{
		{"small tail of a long log", 100, 100, 100},
		{"default 64 KiB", 0, 10_000, 64 << 10},
		{"log shorter than the tail", 4096, 3, 3 * len("line 0000000\n")},
		{"truncated log ends with the marker", 50, 10_000, 50},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			job := tailJob(t, pool, strings.ReplaceAll(tt.name, " ", "-"))
			limit := int64(1 << 20)
			if strings.Contains(tt.name, "truncated") {
				limit = 1000
			}
			log := builder.NewLogBuffer(limit, clock.Real{})
			tailStart(t, pool, builder.TailConfig{JobID: job, Log: log, Interval: tailInterval, TailSize: tt.tailSize},
				queuetest.TestLogger(t))
			for i := range tt.logLines {
				fmt.Fprintf(log, "line %07d\n", i)
			}
			all := log.Bytes()
			r := tailWaitFor(t, pool, job, all[len(all)-tt.want:])
			if !bytes.HasSuffix(all, r.tail) || len(r.tail) != tt.want {
				t.Errorf("tail of %d bytes is not the log's last %d", len(r.tail), tt.want)
			}
			if log.Truncated() && !bytes.HasSuffix(r.tail, []byte("truncated at 1 KB]\n")) {
				t.Errorf("tail of a truncated log %q lacks the marker", r.tail)
			}
		})
	}
}

func TestTailWriterStop(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := context.Background()

	t.Run("writes the final tail", func(t *testing.T) {
		job := tailJob(t, pool, "final")
		log := builder.NewLogBuffer(1<<20, clock.Real{})
		// The loop never ticks: whatever is written, Stop wrote.
		w := tailStart(t, pool, builder.TailConfig{JobID: job, Log: log, Interval: time.Hour}, queuetest.TestLogger(t))
		fmt.Fprintln(log, "last words")
		w.Stop()
		r := tailRead(t, pool, job)
		if !r.ok || !bytes.Equal(r.tail, log.Bytes()) || r.seq != 1 {
			t.Fatalf("after Stop: row %v tail %q seq %d", r.ok, r.tail, r.seq)
		}
		w.Stop() // idempotent, and nothing changed
		if r := tailRead(t, pool, job); r.seq != 1 {
			t.Errorf("second Stop wrote again: seq %d", r.seq)
		}
	})

	t.Run("skips an unchanged tail", func(t *testing.T) {
		job := tailJob(t, pool, "unchanged")
		log := builder.NewLogBuffer(1<<20, clock.Real{})
		w := tailStart(t, pool, builder.TailConfig{JobID: job, Log: log, Interval: tailInterval}, queuetest.TestLogger(t))
		fmt.Fprintln(log, "done")
		before := tailWaitFor(t, pool, job, log.Bytes())
		w.Stop()
		if r := tailRead(t, pool, job); r.seq != before.seq {
			t.Errorf("Stop rewrote an unchanged tail: seq %d → %d", before.seq, r.seq)
		}
	})

	t.Run("empty log writes nothing", func(t *testing.T) {
		job := tailJob(t, pool, "empty")
		w := tailStart(t, pool, builder.TailConfig{JobID: job, Log: builder.NewLogBuffer(0, clock.Real{}), Interval: tailInterval},
			queuetest.TestLogger(t))
		w.Stop()
		if r := tailRead(t, pool, job); r.ok {
			t.Errorf("row %q for an empty log", r.tail)
		}
	})

	t.Run("before Start", func(t *testing.T) {
		job := tailJob(t, pool, "unstarted")
		log := builder.NewLogBuffer(0, clock.Real{})
		fmt.Fprintln(log, "output")
		builder.NewTailWriter(builder.TailConfig{JobID: job, Log: log}, pool, queuetest.TestLogger(t), clock.Real{}).Stop()
		if r := tailRead(t, pool, job); r.ok {
			t.Errorf("Stop before Start wrote %q", r.tail)
		}
	})

	t.Run("without a log", func(t *testing.T) {
		w := builder.NewTailWriter(builder.TailConfig{JobID: 7}, pool, queuetest.TestLogger(t), clock.Real{})
		if err := w.Start(ctx); err == nil || !strings.Contains(err.Error(), "job 7") {
			t.Errorf("Start without a log buffer: %v", err)
		}
		w.Stop()
	})
}

func TestTailWriterSurvivesMissingJob(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	tests := []struct {
		name string
		// setup returns the job id to write for, once any earlier tail is in place.
		setup func(t *testing.T, log *builder.LogBuffer, start func(job int64)) int64
	}{
		{"job never existed", func(t *testing.T, log *builder.LogBuffer, start func(int64)) int64 {
			start(1 << 40)
			return 1 << 40
		}},
		{"job deleted while building", func(t *testing.T, log *builder.LogBuffer, start func(int64)) int64 {
			job := tailJob(t, pool, "vanishing")
			start(job)
			fmt.Fprintln(log, "before the delete")
			tailWaitFor(t, pool, job, log.Bytes())
			queuetest.Exec(t, pool, `DELETE FROM build_jobs WHERE id = $1`, job)
			if tailRead(t, pool, job).ok {
				t.Fatal("ON DELETE CASCADE left the tail")
			}
			return job
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sink := &logtest.Buffer{}
			logger := slog.New(slog.NewTextHandler(sink, &slog.HandlerOptions{Level: slog.LevelDebug}))
			log := builder.NewLogBuffer(0, clock.Real{})
			var w *builder.TailWriter
			job := tt.setup(t, log, func(job int64) {
				w = tailStart(t, pool, builder.TailConfig{JobID: job, Log: log, Interval: tailInterval}, logger)
			})
			fmt.Fprintln(log, "nobody reads this")

			// Every tick retries; only the first failure of the streak warns.
			failures := func() int { return strings.Count(sink.String(), "could not write the live log tail") }
			waittest.For(t, tailWait, func() bool { return failures() >= 3 }, "3 failed writes (log: %s)", sink)
			out := sink.String()
			if n := strings.Count(out, "level=WARN"); n != 1 {
				t.Errorf("%d warnings, want 1:\n%s", n, out)
			}
			if want := fmt.Sprintf("upsert log tail of job %d: ", job); !strings.Contains(out, want) || !strings.Contains(out, "SQLSTATE 23503") {
				t.Errorf("log lacks %q and the foreign key violation:\n%s", want, out)
			}
			select {
			case <-w.Done():
				t.Fatal("the writer's loop ended")
			default:
			}
			w.Stop()
			if tailRead(t, pool, job).ok {
				t.Error("a tail row without its job")
			}
		})
	}
}
