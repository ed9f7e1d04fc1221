package apiv1

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/klauspost/compress/zstd"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// Build is a build job.
type Build struct {
	ID      int64            `json:"id"`
	Name    string           `json:"name"` // the derivation's name
	DrvPath string           `json:"drv_path"`
	System  string           `json:"system"`
	Status  status.JobStatus `json:"status"`
	// Project is the project it was queued for; "" for none, or one the caller may not read
	// (the build is theirs through another project's evaluation).
	Project    string     `json:"project"`
	Priority   int        `json:"priority"`
	Attempt    int        `json:"attempt"`     // claims so far
	RetryCount int        `json:"retry_count"` // transient failures so far
	Builder    string     `json:"builder"`     // the node that holds or held it
	CreatedAt  time.Time  `json:"created_at"`
	StartedAt  *time.Time `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
	// DurationSeconds is how long it ran (so far, for a running one); null before it started.
	DurationSeconds *float64 `json:"duration_seconds"`
	ExitCode        *int     `json:"exit_code"`
	Error           string   `json:"error"`
	// LogURL is the finished log on a cache node ("/log/<drv>"; "": none); LiveLogURL the
	// event stream of a running build's log.
	LogURL     string `json:"log_url"`
	LiveLogURL string `json:"live_log_url"`
	// Flaky: it succeeded after a build failure of the same derivation; Failures counts its
	// build failures, retried or not.
	Flaky    bool `json:"flaky"`
	Failures int  `json:"failures"`
	// RetryLimit is how many build failures its retry policy retries; RetryAt, while a retry
	// waits for its backoff, when it may be claimed.
	RetryLimit int        `json:"retry_limit"`
	RetryAt    *time.Time `json:"retry_at"`
	// Actions are the rebuilds and cancels of the build, newest first (at most MaxActions).
	Actions []Action `json:"actions"`
}

// Action is a recorded write on a build: who did what, when.
type Action struct {
	Action string `json:"action"` // rebuild, cancel
	// Actor is who: "forge:login" (a user, through a session or their token), "machine
	// token N", or "the admin token".
	Actor     string    `json:"actor"`
	TokenID   *int64    `json:"token_id"`   // the API token it was done with; null: none
	TokenName *string   `json:"token_name"` // that token's name
	Message   string    `json:"message"`    // what the action answered
	At        time.Time `json:"at"`
}

// MaxActions bounds a build's actions listed.
const MaxActions = 50

// build is GET /api/v1/builds/{id}.
func (a *API) build(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r, "id", "build")
	if err != nil {
		return err
	}
	ctx := r.Context()
	j, err := queue.GetJob(ctx, a.cfg.Pool, id)
	if errors.Is(err, queue.ErrNotFound) {
		return notFound("build", id)
	}
	if err != nil {
		return err
	}
	b := Build{ID: j.ID, DrvPath: j.DrvPath, System: j.System, Status: j.Status, Priority: j.Priority,
		Attempt: j.Attempt, RetryCount: j.RetryCount, Builder: j.ClaimedBy, CreatedAt: utc(j.CreatedAt),
		StartedAt: utcp(j.StartedAt), FinishedAt: utcp(j.FinishedAt), ExitCode: j.ExitCode, Error: j.ErrorMessage,
		LogURL: blob.LogPath(j.LogURL), Flaky: j.Flaky(), Failures: j.Failures, RetryLimit: j.RetryLimit}
	if j.Status == status.JobPending {
		b.RetryAt = utcp(j.RetryAt)
	}
	if err := a.cfg.Pool.QueryRow(ctx, sqlJobName, id).Scan(&b.Name); err != nil {
		return fmt.Errorf("name of build %d: %w", id, err)
	}
	if j.Project != "" {
		ok, err := a.rule().MayReadProject(ctx, a.caller(r), j.Project)
		if err != nil {
			return err
		}
		if ok {
			b.Project = j.Project
		}
	}
	if j.StartedAt != nil {
		end := time.Now()
		if j.FinishedAt != nil {
			end = *j.FinishedAt
		}
		d := end.Sub(*j.StartedAt).Seconds()
		b.DurationSeconds = &d
	}
	if j.Status.Unfinished() {
		b.LiveLogURL = fmt.Sprintf("/api/builds/%d/log", id)
	}
	rows, err := a.cfg.Pool.Query(ctx, sqlJobActions, id, MaxActions)
	if err != nil {
		return fmt.Errorf("actions on build %d: %w", id, err)
	}
	if b.Actions, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Action]); err != nil {
		return fmt.Errorf("actions on build %d: %w", id, err)
	}
	for i := range b.Actions {
		b.Actions[i].At = utc(b.Actions[i].At)
	}
	httpapi.WriteJSON(w, http.StatusOK, b)
	return nil
}

// StoreTail is the TailFunc of a node that holds the blob store: a running build's live tail
// from the database, a finished one's log from the store (stored zstd-compressed).
func StoreTail(pool *pgxpool.Pool, store blob.Store) TailFunc {
	return func(ctx context.Context, jobID int64, max int) (string, error) {
		var st status.JobStatus
		var key string
		var live []byte
		err := pool.QueryRow(ctx, sqlLogState, jobID).Scan(&st, &key, &live)
		if errors.Is(err, pgx.ErrNoRows) {
			return "", ErrNoLog
		}
		if err != nil {
			return "", fmt.Errorf("log of build %d: %w", jobID, err)
		}
		if st.Unfinished() { // its log is still being written: the live tail is all there is
			if live == nil {
				return "", ErrNoLog
			}
			return tailText(live, max), nil
		}
		if blob.LogPath(key) == "" {
			return "", ErrNoLog
		}
		rc, _, err := store.Get(ctx, key)
		if errors.Is(err, blob.ErrNotFound) {
			return "", ErrNoLog
		}
		if err != nil {
			return "", fmt.Errorf("log of build %d: %w", jobID, err)
		}
		defer rc.Close()
		dec, err := zstd.NewReader(rc, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(1<<30))
		if err != nil {
			return "", fmt.Errorf("log of build %d: %w", jobID, err)
		}
		defer dec.Close()
		tb := &tailBuffer{max: max + 1} // one more byte says whether the log was cut
		if _, err := io.Copy(tb, dec); err != nil {
			return "", fmt.Errorf("log of build %d: %w", jobID, err)
		}
		return tailText(tb.bytes(), max), nil
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*t.max { // amortised: shift once per max bytes
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) bytes() []byte { return t.buf[max(0, len(t.buf)-t.max):] }

// tailText is the last max bytes of b as text: from the first whole line when cut, valid
// UTF-8.
func tailText(b []byte, max int) string {
	if len(b) > max {
		b = b[len(b)-max:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 && i < len(b)-1 {
			b = b[i+1:]
		}
	}
	if !utf8.Valid(b) {
		return strings.ToValidUTF8(string(b), "\uFFFD")
	}
	return string(b)
}
