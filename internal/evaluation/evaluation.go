// Package evaluation owns the evaluation records: requesting, cancelling, re-evaluating and
// reading evaluations (their rows, attributes and job counts), which the evaluator role and
// the frontends share. It runs no Nix: the evaluator (internal/eval) claims and runs what is
// requested here, and calls Rollback and Notify when it ends an evaluation.
package evaluation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// ErrNotFound is returned for an evaluation id that does not exist.
var ErrNotFound = errors.New("no such evaluation")

// ConflictPrefix starts the error of a pull request's evaluation that was not run because its
// head does not merge cleanly into its base (the evaluator's conflict error's text).
const ConflictPrefix = "merge conflict: "

// Evaluation is one row of evaluations with its project's name.
type Evaluation struct {
	ID            int64             `json:"id"`
	ProjectID     int64             `json:"project_id"`
	Project       string            `json:"project"`
	FlakeURL      string            `json:"flake_url"`
	Commit        string            `json:"commit"`
	Branch        string            `json:"branch"`
	TreeHash      string            `json:"tree_hash,omitempty"`
	Status        status.EvalStatus `json:"status"`
	SkippedReason string            `json:"skipped_reason,omitempty"`
	ReusesEvalID  *int64            `json:"reuses_eval_id,omitempty"`
	ClaimedBy     string            `json:"claimed_by,omitempty"`
	Attempt       int               `json:"attempt"`
	Error         string            `json:"error,omitempty"`
	CreatedAt     time.Time         `json:"created_at"`
	StartedAt     *time.Time        `json:"started_at,omitempty"`
	FinishedAt    *time.Time        `json:"finished_at,omitempty"`
	PRNumber      int               `json:"pr_number,omitempty"`
	PRAuthor      string            `json:"pr_author,omitempty"`
	NixVersion    string            `json:"nix_version,omitempty"` // the Nix that evaluated it (last)
	// A pull request's base branch; the base's tip its last run merged Commit into (or found
	// conflicting), and the merge it evaluated ("": Commit itself).
	PRBase      string `json:"pr_base,omitempty"`
	BaseCommit  string `json:"base_commit,omitempty"`
	MergeCommit string `json:"merge_commit,omitempty"`
}

// Finished reports whether the evaluation will not change any more.
func (e Evaluation) Finished() bool {
	return !e.Status.Unfinished()
}

// Get returns evaluation id.
func Get(ctx context.Context, q db.DBTX, id int64) (Evaluation, error) {
	rows, err := q.Query(ctx, sqlEvalByID, id)
	if err != nil {
		return Evaluation{}, fmt.Errorf("get evaluation %d: %w", id, err)
	}
	e, err := pgx.CollectExactlyOneRow(rows, scanEval)
	if errors.Is(err, pgx.ErrNoRows) {
		return Evaluation{}, fmt.Errorf("evaluation %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return Evaluation{}, fmt.Errorf("get evaluation %d: %w", id, err)
	}
	return e, nil
}

// List returns the newest evaluations, of one project or ("") of all.
func List(ctx context.Context, q db.DBTX, project string, limit int) ([]Evaluation, error) {
	rows, err := q.Query(ctx, sqlListEvals, project, limit)
	if err != nil {
		return nil, fmt.Errorf("list evaluations: %w", err)
	}
	es, err := pgx.CollectRows(rows, scanEval)
	if err != nil {
		return nil, fmt.Errorf("list evaluations: %w", err)
	}
	return es, nil
}

// GetMany returns the evaluations of ids that exist, in the order of ids.
func GetMany(ctx context.Context, q db.DBTX, ids []int64) ([]Evaluation, error) {
	rows, err := q.Query(ctx, sqlEvalsByIDs, ids)
	if err != nil {
		return nil, fmt.Errorf("get evaluations: %w", err)
	}
	es, err := pgx.CollectRows(rows, scanEval)
	if err != nil {
		return nil, fmt.Errorf("get evaluations: %w", err)
	}
	return es, nil
}

// ListBefore returns a page of project projectID's evaluations, newest first: at most limit
// of those before evaluation before (0: from the newest).
func ListBefore(ctx context.Context, q db.DBTX, projectID, before int64, limit int) ([]Evaluation, error) {
	rows, err := q.Query(ctx, sqlListEvalsBefore, projectID, before, limit)
	if err != nil {
		return nil, fmt.Errorf("list evaluations of project %d: %w", projectID, err)
	}
	es, err := pgx.CollectRows(rows, scanEval)
	if err != nil {
		return nil, fmt.Errorf("list evaluations of project %d: %w", projectID, err)
	}
	return es, nil
}

// AttrResult is one evaluated attribute with its build job, if any.
type AttrResult struct {
	Attr      string           `json:"attr"`
	DrvPath   string           `json:"drv_path,omitempty"`
	Error     string           `json:"error,omitempty"`
	JobID     int64            `json:"job_id,omitempty"`
	JobStatus status.JobStatus `json:"job_status,omitempty"` // "" when no job was needed (cached)
	Outputs   []string         `json:"outputs,omitempty"`
	// The job's run and, for a failed one, why.
	StartedAt  *time.Time `json:"started_at,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	JobError   string     `json:"job_error,omitempty"`
}

// Attrs returns an evaluation's attributes, by name.
func Attrs(ctx context.Context, q db.DBTX, id int64) ([]AttrResult, error) {
	rows, err := q.Query(ctx, sqlAttrsOfEval, id)
	if err != nil {
		return nil, fmt.Errorf("attributes of evaluation %d: %w", id, err)
	}
	as, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (AttrResult, error) {
		var a AttrResult
		err := row.Scan(&a.Attr, &a.DrvPath, &a.Error, &a.JobID, &a.JobStatus, &a.Outputs, &a.StartedAt, &a.FinishedAt, &a.JobError)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("attributes of evaluation %d: %w", id, err)
	}
	return as, nil
}

// JobCounts counts the build jobs an evaluation needs (its attributes' closures) by status.
func JobCounts(ctx context.Context, q db.DBTX, id int64) (map[status.JobStatus]int, error) {
	rows, err := q.Query(ctx, sqlJobCountsOfEval, id)
	if err != nil {
		return nil, fmt.Errorf("jobs of evaluation %d: %w", id, err)
	}
	counts := map[status.JobStatus]int{}
	var s status.JobStatus
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&s, &n}, func() error {
		counts[s] = n
		return nil
	}); err != nil {
		return nil, fmt.Errorf("jobs of evaluation %d: %w", id, err)
	}
	return counts, nil
}

// Notify announces evaluation id's new status on the evaluations channel, in tx.
func Notify(ctx context.Context, tx pgx.Tx, id int64, s status.EvalStatus) error {
	b, _ := json.Marshal(map[string]any{"id": id, "status": s})
	if _, err := tx.Exec(ctx, sqlNotifyEvaluations, string(b)); err != nil {
		return fmt.Errorf("notify evaluations: %w", err)
	}
	return nil
}
