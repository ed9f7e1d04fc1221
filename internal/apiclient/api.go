package apiclient

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"slices"
	"strconv"

	"github.com/harmonia-ci/harmonia-ci/internal/apiv1"
)

// pageLimit is the page size the client asks for when it reads a whole list.
const pageLimit = apiv1.MaxLimit

// Projects is GET /api/v1/projects.
func (c *Client) Projects(ctx context.Context) ([]apiv1.Project, error) {
	var out apiv1.ProjectList
	if err := c.getJSON(ctx, "/api/v1/projects", nil, &out); err != nil {
		return nil, err
	}
	return out.Projects, nil
}

// Evaluations are the newest limit evaluations of project, or, for project "", of every
// project the caller may read, newest first.
func (c *Client) Evaluations(ctx context.Context, project string, limit int) ([]apiv1.Evaluation, error) {
	if limit < 1 || limit > apiv1.MaxLimit {
		return nil, fmt.Errorf("limit %d: want 1 to %d", limit, apiv1.MaxLimit)
	}
	names := []string{project}
	if project == "" {
		ps, err := c.Projects(ctx)
		if err != nil {
			return nil, err
		}
		names = names[:0]
		for _, p := range ps {
			names = append(names, p.Name)
		}
	}
	all := []apiv1.Evaluation{}
	for _, name := range names {
		var out apiv1.EvaluationList
		q := url.Values{"limit": {strconv.Itoa(limit)}}
		if err := c.getJSON(ctx, "/api/v1/projects/"+url.PathEscape(name)+"/evaluations", q, &out); err != nil {
			return nil, err
		}
		all = append(all, out.Evaluations...)
	}
	slices.SortFunc(all, func(a, b apiv1.Evaluation) int { return cmp.Compare(b.ID, a.ID) })
	return all[:min(len(all), limit)], nil
}

// Evaluation is GET /api/v1/evaluations/{id} with every page of its attributes; with
// attributes false, only the evaluation and its builds by status.
func (c *Client) Evaluation(ctx context.Context, id int64, attributes bool) (apiv1.EvaluationDetail, error) {
	var out apiv1.EvaluationDetail
	path := "/api/v1/evaluations/" + strconv.FormatInt(id, 10)
	limit := pageLimit
	if !attributes {
		limit = 1
	}
	err := pages(func(after *string) (*string, error) {
		var page apiv1.EvaluationDetail
		if err := c.getJSON(ctx, path, pageQuery(after, limit), &page); err != nil {
			return nil, err
		}
		attrs := append(out.Attributes, page.Attributes...)
		out, out.Attributes = page, attrs
		if !attributes {
			out.Attributes, out.Next = []apiv1.Attribute{}, nil
			return nil, nil
		}
		return page.Next, nil
	})
	return out, err
}

// Failures is GET /api/v1/evaluations/{id}/failures, every page.
func (c *Client) Failures(ctx context.Context, id int64) (apiv1.FailureList, error) {
	var out apiv1.FailureList
	path := "/api/v1/evaluations/" + strconv.FormatInt(id, 10) + "/failures"
	err := pages(func(after *string) (*string, error) {
		var page apiv1.FailureList
		if err := c.getJSON(ctx, path, pageQuery(after, pageLimit), &page); err != nil {
			return nil, err
		}
		fs := append(out.Failures, page.Failures...)
		out, out.Failures = page, fs
		return page.Next, nil
	})
	if out.Failures == nil {
		out.Failures = []apiv1.Failure{}
	}
	return out, err
}

// pages calls read with each page's cursor (nil first) until it returns none.
func pages(read func(after *string) (*string, error)) error {
	var after *string
	for {
		next, err := read(after)
		if err != nil || next == nil {
			return err
		}
		after = next
	}
}

func pageQuery(after *string, limit int) url.Values {
	q := url.Values{"limit": {strconv.Itoa(limit)}}
	if after != nil {
		q.Set("after", *after)
	}
	return q
}

// Build is GET /api/v1/builds/{id}.
func (c *Client) Build(ctx context.Context, id int64) (apiv1.Build, error) {
	var b apiv1.Build
	err := c.getJSON(ctx, "/api/v1/builds/"+strconv.FormatInt(id, 10), nil, &b)
	return b, err
}

// Diff is GET /api/v1/evaluations/{id}/diff: what changed against the evaluation before it.
func (c *Client) Diff(ctx context.Context, id int64) (apiv1.EvaluationDiff, error) {
	var d apiv1.EvaluationDiff
	err := c.getJSON(ctx, "/api/v1/evaluations/"+strconv.FormatInt(id, 10)+"/diff", nil, &d)
	return d, err
}

// RebuildBuild is POST /api/builds/{id}/rebuild.
func (c *Client) RebuildBuild(ctx context.Context, id int64) (ActionResult, error) {
	return c.post(ctx, "/api/builds/"+strconv.FormatInt(id, 10)+"/rebuild")
}

// CancelBuild is POST /api/builds/{id}/cancel.
func (c *Client) CancelBuild(ctx context.Context, id int64) (ActionResult, error) {
	return c.post(ctx, "/api/builds/"+strconv.FormatInt(id, 10)+"/cancel")
}

// CancelEvaluation is POST /api/evals/{id}/cancel.
func (c *Client) CancelEvaluation(ctx context.Context, id int64) (ActionResult, error) {
	return c.post(ctx, "/api/evals/"+strconv.FormatInt(id, 10)+"/cancel")
}
