package webui

import (
	"net/http"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// QueueBar is the dashboard's summary of the cluster.
type QueueBar struct {
	Pending, Building, Uploading, NodesOnline int
}

// ProjectRow is a project with its latest evaluation.
type ProjectRow struct {
	ID                                         int64
	Name, Forge, FullName, CloneURL            string
	Enabled, Private                           bool
	EvalID                                     *int64
	Commit, Branch                             *string
	EvalStatus                                 *status.EvalStatus
	EvalCreated                                *time.Time
	Total, Succeeded, Failed, Running, Pending int
	CommitURL                                  string // the commit on its forge, "" if none
}

// Dashboard is the dashboard's data.
type Dashboard struct {
	Bar      QueueBar
	Projects []ProjectRow
	Charts   *Charts // recent throughput and queue depth (charts.go); nil in live updates
}

func (u *UI) dashboard(w http.ResponseWriter, r *http.Request) (string, Page, error) {
	ctx := r.Context()
	d, err := u.loadDashboard(ctx)
	if err != nil {
		return "", Page{}, err
	}
	visible := d.Projects[:0]
	for _, p := range d.Projects {
		ok, err := u.canSee(r, p.Private, p.Forge, p.FullName)
		if err != nil {
			return "", Page{}, err
		}
		if ok {
			visible = append(visible, p)
		}
	}
	d.Projects = visible
	charts, err := u.activityCharts(ctx)
	if err != nil {
		return "", Page{}, err
	}
	d.Charts = &charts
	return "dashboard", Page{Title: "Dashboard", Nav: "dashboard", Data: d}, nil
}
