package apiv1

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// Node is a cluster node. Anonymous callers get what the nodes page shows them: not where a
// node is nor what it runs (those fields are empty), as GET /api/cluster.
type Node struct {
	ID          string            `json:"id"`
	Status      status.NodeStatus `json:"status"`
	Roles       []string          `json:"roles"`
	Draining    bool              `json:"draining"`
	Leads       []string          `json:"leads"` // the leader roles it holds
	CurrentJobs int               `json:"current_jobs"`
	MaxJobs     int               `json:"max_jobs"`
	Systems     []string          `json:"systems"`
	Features    []string          `json:"features"`
	LastSeen    time.Time         `json:"last_seen"`
	// Logged-in users' and admins' only.
	StartedAt  *time.Time `json:"started_at"`
	Endpoint   string     `json:"endpoint"`
	Hostname   string     `json:"hostname"`
	Version    string     `json:"version"`
	NixVersion string     `json:"nix_version"`
}

// NodeList is GET /api/v1/nodes.
type NodeList struct {
	Nodes []Node `json:"nodes"`
}

// nodes is GET /api/v1/nodes.
func (a *API) nodes(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	ns, err := cluster.ListNodes(ctx, a.cfg.Pool)
	if err != nil {
		return err
	}
	leaders, err := cluster.ListLeaders(ctx, a.cfg.Pool)
	if err != nil {
		return err
	}
	public := a.caller(r).Kind == access.Anonymous
	out := NodeList{Nodes: make([]Node, 0, len(ns))}
	for _, n := range ns {
		v := Node{ID: n.ID, Status: n.Status, Roles: orEmpty(n.Roles), Draining: n.Draining, Leads: []string{},
			CurrentJobs: n.CurrentJobs, MaxJobs: n.MaxJobs, Systems: orEmpty(n.Systems), Features: orEmpty(n.Features),
			LastSeen: utc(n.LastSeen)}
		for _, l := range leaders {
			if l.Valid && l.NodeID == n.ID {
				v.Leads = append(v.Leads, l.Role)
			}
		}
		if !public {
			v.StartedAt = utcp(&n.StartedAt)
			v.Endpoint, v.Hostname, v.Version, v.NixVersion = n.Endpoint, n.Hostname, n.Version, n.NixInfo.Version
		}
		out.Nodes = append(out.Nodes, v)
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// QueueJob is an unfinished build in the queue. A private project's build the caller may not
// read is listed (it takes a place in the queue) with Hidden set and no name nor project, as
// the queue page shows it.
type QueueJob struct {
	ID        int64            `json:"id"`
	Name      string           `json:"name"`
	Project   string           `json:"project"`
	Hidden    bool             `json:"hidden"`
	System    string           `json:"system"`
	Status    status.JobStatus `json:"status"`
	Ready     bool             `json:"ready"` // a pending build whose inputs are all built
	Priority  int              `json:"priority"`
	Builder   string           `json:"builder"`
	CreatedAt time.Time        `json:"created_at"`
	StartedAt *time.Time       `json:"started_at"`
}

// Queue is GET /api/v1/queue: the unfinished builds counted, and a page of them, oldest first.
type Queue struct {
	Ready     int        `json:"ready"`
	Waiting   int        `json:"waiting"` // pending on inputs not built yet
	Building  int        `json:"building"`
	Uploading int        `json:"uploading"`
	Jobs      []QueueJob `json:"jobs"`
	Next      *string    `json:"next"`
}

// queue is GET /api/v1/queue.
func (a *API) queue(w http.ResponseWriter, r *http.Request) error {
	after, err := idCursor(r)
	if err != nil {
		return err
	}
	limit, err := limitOf(r)
	if err != nil {
		return err
	}
	ctx := r.Context()
	var out Queue
	if err := a.cfg.Pool.QueryRow(ctx, sqlQueueCounts).Scan(&out.Ready, &out.Waiting, &out.Building, &out.Uploading); err != nil {
		return fmt.Errorf("count the queue: %w", err)
	}
	rows, err := a.cfg.Pool.Query(ctx, sqlQueueJobs, after, limit+1)
	if err != nil {
		return fmt.Errorf("list the queue: %w", err)
	}
	var repos []access.Repo
	jobs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (QueueJob, error) {
		var j QueueJob
		var repo access.Repo
		err := row.Scan(&j.ID, &j.Name, &j.System, &j.Status, &j.Ready, &j.Priority, &j.Builder, &j.CreatedAt,
			&j.StartedAt, &j.Project, &repo.Private, &repo.Forge, &repo.FullName, &repo.Installation)
		j.CreatedAt, j.StartedAt = utc(j.CreatedAt), utcp(j.StartedAt)
		repos = append(repos, repo)
		return j, err
	})
	if err != nil {
		return fmt.Errorf("list the queue: %w", err)
	}
	if len(jobs) > limit {
		jobs = jobs[:limit]
		next := strconv.FormatInt(jobs[limit-1].ID, 10)
		out.Next = &next
	}
	c := a.caller(r)
	seen := map[access.Repo]bool{}
	for i := range jobs {
		repo := repos[i]
		if !repo.Private {
			continue
		}
		ok, known := seen[repo]
		if !known {
			if ok, err = a.rule().MayRead(ctx, c, repo); err != nil {
				return err
			}
			seen[repo] = ok
		}
		if !ok {
			jobs[i].Hidden, jobs[i].Name, jobs[i].Project = true, "", ""
		}
	}
	out.Jobs = jobs
	if out.Jobs == nil {
		out.Jobs = []QueueJob{}
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}
