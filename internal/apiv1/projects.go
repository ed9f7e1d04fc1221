package apiv1

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// listLimit bounds a project's branches and pull requests, as its page does.
const listLimit = 50

// Project is a project and its repository.
type Project struct {
	ID            int64  `json:"id"`
	Name          string `json:"name"`
	Enabled       bool   `json:"enabled"`
	Private       bool   `json:"private"`
	Forge         string `json:"forge"`
	Repository    string `json:"repository"` // the forge's owner/name, or a redacted URL
	CloneURL      string `json:"clone_url"`
	DefaultBranch string `json:"default_branch"`
	// The latest evaluation (0 and "": none).
	LatestEvaluationID     int64             `json:"latest_evaluation_id"`
	LatestEvaluationStatus status.EvalStatus `json:"latest_evaluation_status"`
}

// ProjectList is GET /api/v1/projects.
type ProjectList struct {
	Projects []Project `json:"projects"`
}

// ProjectDetail is GET /api/v1/projects/{project}: the project, the latest evaluation of each
// branch (the default branch first) and of each pull request (the most recent first).
type ProjectDetail struct {
	Project
	Branches     []Evaluation `json:"branches"`
	PullRequests []Evaluation `json:"pull_requests"`
}

// EvaluationList is a page of evaluations, newest first; Next is the ?after= of the next page
// (null on the last).
type EvaluationList struct {
	Evaluations []Evaluation `json:"evaluations"`
	Next        *string      `json:"next"`
}

// Evaluation is an evaluation of a project's commit.
type Evaluation struct {
	ID            int64             `json:"id"`
	Project       string            `json:"project"`
	Branch        string            `json:"branch"`
	Commit        string            `json:"commit"`
	Status        status.EvalStatus `json:"status"`
	PRNumber      *int              `json:"pr_number"` // null for a branch
	PRAuthor      string            `json:"pr_author"`
	PRBase        string            `json:"pr_base"`
	MergeCommit   string            `json:"merge_commit"` // the merge a pull request was evaluated as; "": Commit
	SkippedReason string            `json:"skipped_reason"`
	ReusesEvalID  *int64            `json:"reuses_evaluation_id"`
	Error         string            `json:"error"`
	Attempt       int               `json:"attempt"`
	Evaluator     string            `json:"evaluator"` // the node that evaluated it last
	NixVersion    string            `json:"nix_version"`
	CreatedAt     time.Time         `json:"created_at"`
	StartedAt     *time.Time        `json:"started_at"`
	FinishedAt    *time.Time        `json:"finished_at"`
}

func newEvaluation(e evaluation.Evaluation) Evaluation {
	v := Evaluation{ID: e.ID, Project: e.Project, Branch: e.Branch, Commit: e.Commit, Status: e.Status,
		PRAuthor: e.PRAuthor, PRBase: e.PRBase, MergeCommit: e.MergeCommit, SkippedReason: e.SkippedReason,
		ReusesEvalID: e.ReusesEvalID, Error: e.Error, Attempt: e.Attempt, Evaluator: e.ClaimedBy,
		NixVersion: e.NixVersion, CreatedAt: utc(e.CreatedAt), StartedAt: utcp(e.StartedAt), FinishedAt: utcp(e.FinishedAt)}
	if e.PRNumber != 0 {
		n := e.PRNumber
		v.PRNumber = &n
	}
	return v
}

// projectRow is a project as sqlProjects reads it, with its repository for the rule.
type projectRow struct {
	Project
	repo access.Repo
}

func scanProject(row pgx.CollectableRow) (projectRow, error) {
	var p projectRow
	var st string
	err := row.Scan(&p.ID, &p.Name, &p.Enabled, &p.Forge, &p.Repository, &p.CloneURL, &p.Private,
		&p.repo.Installation, &p.DefaultBranch, &p.LatestEvaluationID, &st)
	p.LatestEvaluationStatus = status.EvalStatus(st)
	p.repo.Private, p.repo.Forge, p.repo.FullName = p.Private, p.Forge, p.Repository
	p.Repository, p.CloneURL = project.RedactURL(p.Repository), project.RedactURL(p.CloneURL)
	return p, err
}

// projects is GET /api/v1/projects: those the caller may read, by name.
func (a *API) projects(w http.ResponseWriter, r *http.Request) error {
	rows, err := a.cfg.Pool.Query(r.Context(), sqlProjects)
	if err != nil {
		return fmt.Errorf("list projects: %w", err)
	}
	ps, err := pgx.CollectRows(rows, scanProject)
	if err != nil {
		return fmt.Errorf("list projects: %w", err)
	}
	c := a.caller(r)
	out := ProjectList{Projects: []Project{}}
	for _, p := range ps {
		ok, err := a.rule().MayRead(r.Context(), c, p.repo)
		if err != nil {
			return err
		}
		if ok {
			out.Projects = append(out.Projects, p.Project)
		}
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

// readProject reads the project of the request's path (the route checked the caller may).
func (a *API) readProject(r *http.Request) (projectRow, error) {
	name := r.PathValue("project")
	rows, err := a.cfg.Pool.Query(r.Context(), sqlProject, name)
	if err != nil {
		return projectRow{}, fmt.Errorf("project %q: %w", name, err)
	}
	p, err := pgx.CollectExactlyOneRow(rows, scanProject)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, notFound("project", name)
	}
	if err != nil {
		return p, fmt.Errorf("project %q: %w", name, err)
	}
	return p, nil
}

// project is GET /api/v1/projects/{project}.
func (a *API) project(w http.ResponseWriter, r *http.Request) error {
	p, err := a.readProject(r)
	if err != nil {
		return err
	}
	out := ProjectDetail{Project: p.Project}
	if out.Branches, err = a.evalsByID(r.Context(), sqlBranches, p.ID, p.DefaultBranch, listLimit); err != nil {
		return err
	}
	if out.PullRequests, err = a.evalsByID(r.Context(), sqlPulls, p.ID, listLimit); err != nil {
		return err
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

// evalsByID reads the evaluations whose ids sql returns, in its order.
func (a *API) evalsByID(ctx context.Context, sql string, args ...any) ([]Evaluation, error) {
	rows, err := a.cfg.Pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("list evaluations: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("list evaluations: %w", err)
	}
	es, err := evaluation.GetMany(ctx, a.cfg.Pool, ids)
	if err != nil {
		return nil, err
	}
	out := make([]Evaluation, 0, len(es))
	for _, e := range es {
		out = append(out, newEvaluation(e))
	}
	return out, nil
}

// projectEvaluations is GET /api/v1/projects/{project}/evaluations: newest first, paged by
// ?after=<id of the last row>.
func (a *API) projectEvaluations(w http.ResponseWriter, r *http.Request) error {
	after, err := idCursor(r)
	if err != nil {
		return err
	}
	limit, err := limitOf(r)
	if err != nil {
		return err
	}
	p, err := a.readProject(r)
	if err != nil {
		return err
	}
	es, err := evaluation.ListBefore(r.Context(), a.cfg.Pool, p.ID, after, limit+1)
	if err != nil {
		return err
	}
	out := EvaluationList{Evaluations: make([]Evaluation, 0, len(es))}
	if len(es) > limit {
		es = es[:limit]
		next := strconv.FormatInt(es[limit-1].ID, 10)
		out.Next = &next
	}
	for _, e := range es {
		out.Evaluations = append(out.Evaluations, newEvaluation(e))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}
