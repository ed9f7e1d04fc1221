package webui

import (
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// The attribute history page, GET /ci/{project}/attr/{attr}[?branch=B]: an attribute's
// results over a branch's evaluations, newest first, with its build time as a chart, so a
// slow creep or an intermittent failure shows at a glance.

// historyLimit is how many evaluations the page goes back.
const historyLimit = 100

// HistoryRow is the attribute in one evaluation.
type HistoryRow struct {
	EvalID     int64
	Commit     string
	CreatedAt  time.Time
	Error      string // it failed to evaluate
	JobID      *int64 // nil: nothing to build (cached) or an evaluation error
	Status     status.JobStatus
	Builder    *string
	StartedAt  *time.Time
	FinishedAt *time.Time
}

// Outcome is the row's result in a word, for its badge.
func (h HistoryRow) Outcome() string {
	switch {
	case h.Error != "":
		return "eval error"
	case h.JobID == nil:
		return "cached"
	}
	return string(h.Status)
}

// Took is how long its build took; 0 when it has not finished or had none.
func (h HistoryRow) Took() time.Duration {
	if h.StartedAt == nil || h.FinishedAt == nil {
		return 0
	}
	return h.FinishedAt.Sub(*h.StartedAt)
}

// HistoryPage is the attribute history page.
type HistoryPage struct {
	Project, Attr, Branch string
	Rows                  []HistoryRow
	Chart                 *HistoryChart // nil: no build finished
}

// HistoryChart draws the build times, oldest on the left: one bar per evaluation, coloured by
// its result.
type HistoryChart struct {
	Width, Height int
	Bars          []HistoryBar
	Max           string // the tallest bar's duration
}

// HistoryBar is one evaluation's bar.
type HistoryBar struct {
	X, Y, Width, Height float64
	Color, Title        string
}

// History chart geometry, in SVG user units.
const (
	historyWidth  = 560
	historyHeight = 80
)

func (u *UI) historyPage(r *http.Request, attr string) (string, Page, error) {
	ctx := r.Context()
	p := HistoryPage{Project: r.PathValue("project"), Attr: attr, Branch: r.URL.Query().Get("branch")}
	var err error
	if p.Branch == "" {
		err = u.cfg.Pool.QueryRow(ctx, sqlDefaultBranch, p.Project).Scan(&p.Branch)
		if err != nil {
			return "", Page{}, fmt.Errorf("default branch of %s: %w", p.Project, err)
		}
	}
	rows, err := u.cfg.Pool.Query(ctx, sqlAttrHistory, p.Project, p.Branch, attr, historyLimit)
	if err != nil {
		return "", Page{}, fmt.Errorf("history of %s: %w", attr, err)
	}
	p.Rows, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (HistoryRow, error) {
		var h HistoryRow
		err := row.Scan(&h.EvalID, &h.Commit, &h.CreatedAt, &h.Error, &h.JobID, &h.Status, &h.Builder, &h.StartedAt, &h.FinishedAt)
		return h, err
	})
	if err != nil {
		return "", Page{}, fmt.Errorf("history of %s: %w", attr, err)
	}
	if len(p.Rows) == 0 {
		return "", Page{}, notFound("no attribute %q in the evaluations of %s on %s", attr, p.Project, p.Branch)
	}
	p.Chart = historyChart(p.Rows)
	return "history", Page{Title: fmt.Sprintf("%s · %s", p.Project, attr), Data: p}, nil
}

// historyChart lays out rows (newest first) as bars, oldest on the left; nil when no build
// finished.
func historyChart(rows []HistoryRow) *HistoryChart {
	var top time.Duration
	for _, h := range rows {
		top = max(top, h.Took())
	}
	if top == 0 {
		return nil
	}
	c := &HistoryChart{Width: historyWidth, Height: historyHeight, Max: duration(top)}
	slot := float64(historyWidth) / float64(historyLimit)
	for i := range rows {
		h := rows[len(rows)-1-i]
		color := chartSucceededColor
		switch h.Outcome() {
		case string(status.JobSucceeded):
		case string(status.JobFailed), string(status.JobDepFailed), "eval error":
			color = chartFailedColor
		default:
			color = "#8c959f"
		}
		height := math.Max(2, float64(h.Took())/float64(top)*(historyHeight-2))
		c.Bars = append(c.Bars, HistoryBar{
			X: chartRound(float64(i) * slot), Width: chartRound(slot * 0.8),
			Y: chartRound(historyHeight - height), Height: chartRound(height), Color: color,
			Title: fmt.Sprintf("evaluation #%d: %s, %s", h.EvalID, h.Outcome(), duration(h.Took())),
		})
	}
	return c
}
