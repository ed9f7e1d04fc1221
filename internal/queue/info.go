package queue

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/status"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
)

// ErrNotFound means no job has the id.
var ErrNotFound = errors.New("no such job")

// JobInfo is a job as users see it (harmonia-ci job show).
type JobInfo struct {
	ID           int64            `json:"id"`
	DrvPath      string           `json:"drv_path"`
	Project      string           `json:"project,omitempty"`
	System       string           `json:"system"`
	Status       status.JobStatus `json:"status"`
	Priority     int              `json:"priority"`
	Attempt      int              `json:"attempt"`
	RetryCount   int              `json:"retry_count"`
	ClaimedBy    string           `json:"claimed_by,omitempty"`
	StartedAt    *time.Time       `json:"started_at,omitempty"`
	FinishedAt   *time.Time       `json:"finished_at,omitempty"`
	ExitCode     *int             `json:"exit_code,omitempty"`
	ErrorMessage string           `json:"error,omitempty"`
	LogURL       string           `json:"log_url,omitempty"`
	CreatedAt    time.Time        `json:"created_at"`
	// Failures counts the job's build failures, retried or not; a job that succeeded after
	// one is flaky (see Flaky).
	Failures int `json:"failures"`
	// RetryLimit is how many build failures its retry policy retries; RetryAt, when a retry
	// waits for its backoff, when it may be claimed.
	RetryLimit int           `json:"retry_limit"`
	RetryAt    *time.Time    `json:"retry_at,omitempty"`
	Attempts   []AttemptInfo `json:"attempts"` // the ended ones, the first first
}

// Flaky says the job succeeded after a build of the same derivation failed: nothing the
// build depends on changed, so the failure was the build's own chance.
func (j JobInfo) Flaky() bool { return j.Status == status.JobSucceeded && j.Failures > 0 }

// AttemptInfo is one ended claim of a job (build_attempts).
type AttemptInfo struct {
	Attempt    int                  `json:"attempt"`
	Node       string               `json:"node,omitempty"`
	StartedAt  *time.Time           `json:"started_at,omitempty"`
	FinishedAt time.Time            `json:"finished_at"`
	Status     status.AttemptStatus `json:"status"`
	ExitCode   *int                 `json:"exit_code,omitempty"`
	Error      string               `json:"error,omitempty"`
	LogKey     string               `json:"log_key,omitempty"`
}

// GetJob returns job id, or an error wrapping ErrNotFound.
func GetJob(ctx context.Context, q db.DBTX, id int64) (JobInfo, error) {
	var j JobInfo
	err := q.QueryRow(ctx, sqlJobInfo, id).Scan(&j.ID, &j.DrvPath, &j.Project, &j.System, &j.Status, &j.Priority,
		&j.Attempt, &j.RetryCount, &j.ClaimedBy, &j.StartedAt, &j.FinishedAt, &j.ExitCode, &j.ErrorMessage,
		&j.LogURL, &j.CreatedAt, &j.Failures, &j.RetryLimit, &j.RetryAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return j, fmt.Errorf("job %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return j, fmt.Errorf("get job %d: %w", id, err)
	}
	rows, err := q.Query(ctx, sqlJobAttempts, id)
	if err == nil {
		j.Attempts, err = pgx.CollectRows(rows, pgx.RowToStructByPos[AttemptInfo])
	}
	if err != nil {
		return j, fmt.Errorf("get the attempts of job %d: %w", id, err)
	}
	return j, nil
}

// LogKey is the blob key of a derivation's latest log, what `nix log` and the cache's
// /log/<drv> read.
func LogKey(drvPath string) string { return "log/" + path.Base(drvPath) }

// AttemptLogKey is the blob key of one attempt's own log, which later attempts do not
// overwrite; the cache serves it as /log/<drv>.<attempt>.
func AttemptLogKey(drvPath string, attempt int) string {
	return LogKey(drvPath) + "." + strconv.Itoa(attempt)
}
