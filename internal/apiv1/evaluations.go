package apiv1

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// Attribute is one attribute of an evaluation and its build.
type Attribute struct {
	Name    string `json:"name"`
	DrvPath string `json:"drv_path"` // "" when it failed to evaluate
	// Status is the build's status, or "cached" (its outputs were there: no build), "eval-error"
	// (it did not evaluate) or "detached" (its build is no longer wanted by this evaluation).
	Status     string     `json:"status"`
	EvalError  string     `json:"eval_error"`
	BuildID    *int64     `json:"build_id"`
	Builder    string     `json:"builder"`
	StartedAt  *time.Time `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
	BuildError string     `json:"build_error"`
	ExitCode   *int       `json:"exit_code"`
	// CauseBuildID is, for a dep-failed build, the nearest failed or cancelled build below it.
	CauseBuildID *int64 `json:"cause_build_id"`
}

// EvaluationDetail is GET /api/v1/evaluations/{id}: the evaluation, its builds by status (the
// attributes' closures, dependencies included) and a page of its attributes by name.
type EvaluationDetail struct {
	Evaluation
	Builds     map[status.JobStatus]int `json:"builds"`
	Attributes []Attribute              `json:"attributes"`
	Next       *string                  `json:"next"` // ?after= of the next page of attributes; null on the last
}

// Failure is a failed attribute of an evaluation: it did not evaluate, or its build failed
// or dep-failed. LogTail is the end of the log of the build that failed (the cause's, for a
// dep-failed one).
type Failure struct {
	Attribute
	LogBuildID *int64 `json:"log_build_id"` // whose log LogTail is
	LogTail    string `json:"log_tail"`
}

// FailureList is GET /api/v1/evaluations/{id}/failures, by attribute name.
type FailureList struct {
	EvaluationID int64     `json:"evaluation_id"`
	Status       string    `json:"status"`
	Failures     []Failure `json:"failures"`
	Next         *string   `json:"next"`
}

// attrCursor is the request's ?after= as an attribute name; nil when absent.
func attrCursor(r *http.Request) (*string, error) {
	q := r.URL.Query()
	if !q.Has("after") {
		return nil, nil
	}
	after := q.Get("after")
	if after == "" || len(after) > 4096 {
		return nil, httpapi.Errorf(http.StatusBadRequest, "invalid after %q: want the name of the last attribute of the previous page", clip(after))
	}
	return &after, nil
}

// readEval reads the evaluation of the request's path (the route checked the caller may).
func (a *API) readEval(r *http.Request) (evaluation.Evaluation, error) {
	id, err := pathID(r, "id", "evaluation")
	if err != nil {
		return evaluation.Evaluation{}, err
	}
	e, err := evaluation.Get(r.Context(), a.cfg.Pool, id)
	if errors.Is(err, evaluation.ErrNotFound) {
		return e, notFound("evaluation", id)
	}
	return e, err
}

// EvaluationDiff is an evaluation's diff against the one before it.
type EvaluationDiff struct {
	EvaluationID int64  `json:"evaluation_id"`
	Project      string `json:"project"`
	evaluation.Diff
}

// diff is GET /api/v1/evaluations/{id}/diff.
func (a *API) diff(w http.ResponseWriter, r *http.Request) error {
	e, err := a.readEval(r)
	if err != nil {
		return err
	}
	diff, err := evaluation.DiffOf(r.Context(), a.cfg.Pool, e.ID)
	if err != nil {
		return err
	}
	d := EvaluationDiff{EvaluationID: e.ID, Project: e.Project, Diff: diff}
	// Empty lists are [], not null: a script iterates them without a check.
	for _, l := range []*[]string{&d.NewlyFailing, &d.NewlyFixed, &d.StillFailing, &d.Added, &d.AddedFailing, &d.Removed} {
		if *l == nil {
			*l = []string{}
		}
	}
	httpapi.WriteJSON(w, http.StatusOK, d)
	return nil
}

// attributes reads a page of evaluation id's attributes (only the failed ones if failed) and
// the next page's cursor.
func (a *API) attributes(ctx context.Context, id int64, after *string, failed bool, limit int) ([]Attribute, *string, error) {
	rows, err := a.cfg.Pool.Query(ctx, sqlAttrs, id, after, failed, limit+1)
	if err != nil {
		return nil, nil, fmt.Errorf("attributes of evaluation %d: %w", id, err)
	}
	as, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Attribute, error) {
		var at Attribute
		var job, cause int64
		err := row.Scan(&at.Name, &at.DrvPath, &at.EvalError, &job, &at.Status, &at.Builder, &at.StartedAt,
			&at.FinishedAt, &at.BuildError, &at.ExitCode, &cause)
		at.BuildID, at.CauseBuildID = nonZero(job), nonZero(cause)
		at.StartedAt, at.FinishedAt = utcp(at.StartedAt), utcp(at.FinishedAt)
		return at, err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("attributes of evaluation %d: %w", id, err)
	}
	var next *string
	if len(as) > limit {
		as = as[:limit]
		n := as[limit-1].Name
		next = &n
	}
	return as, next, nil
}

func nonZero(id int64) *int64 {
	if id == 0 {
		return nil
	}
	return &id
}

// attrPage is a page of an evaluation's attributes: whose (a skipped evaluation reuses
// another's, as its page shows), after which name, how many.
type attrPage struct {
	of    int64
	after *string
	limit int
}

// readEvalPage reads the evaluation of r and the page of its attributes r asks for.
func (a *API) readEvalPage(r *http.Request) (evaluation.Evaluation, attrPage, error) {
	var p attrPage
	var err error
	if p.after, err = attrCursor(r); err != nil {
		return evaluation.Evaluation{}, p, err
	}
	if p.limit, err = limitOf(r); err != nil {
		return evaluation.Evaluation{}, p, err
	}
	e, err := a.readEval(r)
	if err != nil {
		return e, p, err
	}
	p.of = e.ID
	if e.ReusesEvalID != nil {
		p.of = *e.ReusesEvalID
	}
	return e, p, nil
}

// evaluation is GET /api/v1/evaluations/{id}.
func (a *API) evaluation(w http.ResponseWriter, r *http.Request) error {
	e, page, err := a.readEvalPage(r)
	if err != nil {
		return err
	}
	out := EvaluationDetail{Evaluation: newEvaluation(e)}
	if out.Builds, err = evaluation.JobCounts(r.Context(), a.cfg.Pool, e.ID); err != nil {
		return err
	}
	if out.Attributes, out.Next, err = a.attributes(r.Context(), page.of, page.after, false, page.limit); err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

// failures is GET /api/v1/evaluations/{id}/failures.
func (a *API) failures(w http.ResponseWriter, r *http.Request) error {
	e, page, err := a.readEvalPage(r)
	if err != nil {
		return err
	}
	as, next, err := a.attributes(r.Context(), page.of, page.after, true, page.limit)
	if err != nil {
		return err
	}
	out := FailureList{EvaluationID: e.ID, Status: string(e.Status), Failures: make([]Failure, 0, len(as)), Next: next}
	c := a.caller(r)
	for _, at := range as {
		f := Failure{Attribute: at}
		logOf := at.BuildID
		if at.CauseBuildID != nil {
			// The cause is a dependency, which may be another project's build: its log only
			// if the caller may read it.
			ok, err := a.rule().MayReadJob(r.Context(), c, *at.CauseBuildID)
			if err != nil {
				return err
			}
			logOf = nil
			if ok {
				logOf = at.CauseBuildID
			} else {
				f.CauseBuildID = nil
			}
		}
		if logOf != nil && a.cfg.Tail != nil && at.Status != "detached" {
			tail, err := a.cfg.Tail(r.Context(), *logOf, TailBytes)
			switch {
			case errors.Is(err, ErrNoLog):
			case err != nil:
				// A log that cannot be read is an empty tail, not a failed list.
				a.log.Warn("build log unavailable", "build_id", *logOf, "error", err)
			default:
				f.LogBuildID, f.LogTail = logOf, tail
			}
		}
		out.Failures = append(out.Failures, f)
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}
