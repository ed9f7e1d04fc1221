package webui

import (
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
)

// QueueBar is the dashboard's summary of the cluster.
type QueueBar struct {
	Pending, Building, Uploading, NodesOnline int
}

// ProjectRow is a project with its latest evaluation.
type ProjectRow struct {
	ID                                         int64
	Name, Forge, FullName, CloneURL            string
	Enabled                                    bool
	EvalID                                     *int64
	Commit, Branch, EvalStatus                 *string
	EvalCreated                                *time.Time
	Total, Succeeded, Failed, Running, Pending int
}

// Dashboard is the dashboard's data.
type Dashboard struct {
	Bar      QueueBar
	Projects []ProjectRow
}

func (u *UI) dashboard(w http.ResponseWriter, r *http.Request) (string, Page, error) {
	ctx := r.Context()
	var d Dashboard
	b := &d.Bar
	if err := u.cfg.Pool.QueryRow(ctx, sqlQueueBar).Scan(&b.Pending, &b.Building, &b.Uploading, &b.NodesOnline); err != nil {
		return "", Page{}, err
	}
	rows, err := u.cfg.Pool.Query(ctx, sqlDashboardProjects)
	if err != nil {
		return "", Page{}, err
	}
	d.Projects, err = pgx.CollectRows(rows, pgx.RowToStructByPos[ProjectRow])
	if err != nil {
		return "", Page{}, err
	}
	return "dashboard", Page{Title: "Dashboard", Nav: "dashboard", Data: d}, nil
}
