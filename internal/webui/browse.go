package webui

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// listLimit bounds the branch and pull request lists of a project page.
const listLimit = 50

// registerBrowsePages mounts GET /ci/nodes and GET /ci/queue. The project page,
// GET /ci/{project}/, is projectPageHandler: ServeMux refuses GET /ci/{project}/{$} next to
// GET /ci/static/ (both match /ci/static/ and neither is more specific), so the dispatcher of
// GET /ci/{project}/{rest...} serves it for an empty rest.
func (u *UI) registerBrowsePages(rt *access.Routes) {
	rt.Handle("GET /ci/nodes", access.Free, u.page(u.nodesPage))
	rt.Handle("GET /ci/queue", access.Filtered, u.page(u.queuePage))
}

// projectPageHandler serves GET /ci/{project}/.
func (u *UI) projectPageHandler() http.Handler { return u.page(u.projectPage) }

// badRequest is the error of a page asked for with a malformed parameter.
func badRequest(format string, args ...any) error {
	return httpapi.Errorf(http.StatusBadRequest, format, args...)
}

// joinList joins a list of names for display ("x86_64-linux, aarch64-linux").
func joinList(s []string) string { return strings.Join(s, ", ") }

// ProjectInfo is a project with its repository and settings.
type ProjectInfo struct {
	ID                 int64
	Name               string
	Enabled            bool
	Shares             int
	ConsumedSeconds    float64
	PREnabled          bool
	PRTrust            string
	PollInterval       int // seconds; 0 when the project is not polled
	LastPolled         *time.Time
	Forge, Owner, Repo string
	FullName, CloneURL string
	Private            bool
	DefaultBranch      string
}

// EvalRow is an evaluation in a project page's lists.
type EvalRow struct {
	ID             int64
	Branch, Commit string
	Status         status.EvalStatus
	CreatedAt      time.Time
	StartedAt      *time.Time
	FinishedAt     *time.Time
	PRNumber       int // 0 for a branch
	PRAuthor       string
	Project        string // the project's name, for links
	CommitURL      string // the commit on the forge; "" when unknown
}

// ProjectPage is a project page's data.
type ProjectPage struct {
	Project ProjectInfo
	RepoURL string // the repository's web page; "" when unknown
	// Branches and Pulls are the latest evaluation of each branch and pull request; only the
	// first page shows them.
	Branches, Pulls []EvalRow
	Evals           []EvalRow
	Before          int64  // this page's cursor; 0 on the first page
	More            string // the next page's URL; "" on the last page
	// Cache is where the project's outputs are substituted from (substitute.go); the first
	// page only.
	Cache CacheSources
	// TokenPlaceholder stands for the viewer's cache token in the netrc snippet.
	TokenPlaceholder string
}

func (u *UI) projectPage(w http.ResponseWriter, r *http.Request) (string, Page, error) {
	ctx := r.Context()
	name := r.PathValue("project")
	var before int64
	if s := r.URL.Query().Get("before"); s != "" {
		var err error
		if before, err = strconv.ParseInt(s, 10, 64); err != nil || before <= 0 {
			return "", Page{}, badRequest("before must be an evaluation id")
		}
	}
	var d ProjectPage
	p := &d.Project
	err := u.cfg.Pool.QueryRow(ctx, sqlProject, name).Scan(&p.ID, &p.Name, &p.Enabled, &p.Shares,
		&p.ConsumedSeconds, &p.PREnabled, &p.PRTrust, &p.PollInterval, &p.LastPolled, &p.Forge, &p.Owner,
		&p.Repo, &p.FullName, &p.CloneURL, &p.Private, &p.DefaultBranch)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", Page{}, notFound("no project %q", name)
	}
	if err != nil {
		return "", Page{}, fmt.Errorf("project %q: %w", name, err)
	}
	// A private project is one the viewer may not know of: the same 404 as no project.
	if ok, err := u.canSee(r, p.Private, p.Forge, p.FullName); err != nil {
		return "", Page{}, err
	} else if !ok {
		return "", Page{}, notFound("no project %q", name)
	}
	p.CloneURL, p.FullName = project.RedactURL(p.CloneURL), project.RedactURL(p.FullName)
	d.RepoURL = repoURL(p.CloneURL)
	d.Before = before
	if before == 0 {
		if d.Cache, err = u.cacheSources(ctx, u.Caller(r).Kind == access.Anonymous); err != nil {
			return "", Page{}, err
		}
		d.TokenPlaceholder = tokenPlaceholder
		if d.Branches, err = u.evalRows(ctx, p, sqlProjectBranches, p.ID, p.DefaultBranch, listLimit); err != nil {
			return "", Page{}, err
		}
		if d.Pulls, err = u.evalRows(ctx, p, sqlProjectPulls, p.ID, listLimit); err != nil {
			return "", Page{}, err
		}
		before = math.MaxInt64
	}
	if d.Evals, err = u.evalRows(ctx, p, sqlProjectEvals, p.ID, before, PageSize+1); err != nil {
		return "", Page{}, err
	}
	if len(d.Evals) > PageSize {
		d.Evals = d.Evals[:PageSize]
		d.More = fmt.Sprintf("?before=%d", d.Evals[PageSize-1].ID)
	}
	return "project", Page{Title: p.Name, Data: d}, nil
}

// evalRows runs one of the project page's evaluation queries and links each commit.
func (u *UI) evalRows(ctx context.Context, p *ProjectInfo, sql string, args ...any) ([]EvalRow, error) {
	rows, err := u.cfg.Pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("evaluations of project %d: %w", p.ID, err)
	}
	evals, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (EvalRow, error) {
		var e EvalRow
		err := row.Scan(&e.ID, &e.Branch, &e.Commit, &e.Status, &e.CreatedAt, &e.StartedAt, &e.FinishedAt,
			&e.PRNumber, &e.PRAuthor)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("evaluations of project %d: %w", p.ID, err)
	}
	f, linked := u.cfg.Forges[p.Forge]
	for i := range evals {
		evals[i].Project = p.Name
		if linked {
			evals[i].CommitURL = f.CommitURL(forge.Repo{Owner: p.Owner, Name: p.Repo}, evals[i].Commit)
		}
	}
	return evals, nil
}

// repoURL is a repository's web page guessed from its clone URL (an http(s) URL without
// ".git" or a user), or "" for other clone URLs (ssh, file).
func repoURL(clone string) string {
	if !strings.HasPrefix(clone, "https://") && !strings.HasPrefix(clone, "http://") {
		return ""
	}
	u, err := url.Parse(clone)
	if err != nil {
		return ""
	}
	u.User = nil
	return strings.TrimSuffix(strings.TrimSuffix(u.String(), "/"), ".git")
}

// NodeRow is a node on the nodes page.
type NodeRow struct {
	ID                string
	Roles             []string
	Status            status.NodeStatus
	Draining          bool
	Systems, Features []string
	CurrentJobs       int
	MaxJobs           int
	SpeedFactor       float64
	Hostname, Version string
	StartedAt         time.Time
	LastSeen          time.Time
	Leads             []string // the leader roles it holds
	Nix               cluster.NixInfo
}

// State is what the nodes page calls the node's status: online, draining, joining or offline.
func (n NodeRow) State() string {
	switch {
	case n.Status == status.NodeDead:
		return "offline"
	case n.Draining || n.Status == status.NodeDraining:
		return "draining"
	case n.Status == status.NodeJoining:
		return "joining"
	default:
		return "online"
	}
}

// NodesPage is the nodes page's data.
type NodesPage struct {
	Nodes   []NodeRow
	Leaders []cluster.LeaderStatus
	Counts  map[string]int // by State
}

func (u *UI) nodesPage(w http.ResponseWriter, r *http.Request) (string, Page, error) {
	ctx := r.Context()
	rows, err := u.cfg.Pool.Query(ctx, sqlNodes)
	if err != nil {
		return "", Page{}, fmt.Errorf("list nodes: %w", err)
	}
	nodes, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (NodeRow, error) {
		var n NodeRow
		err := row.Scan(&n.ID, &n.Roles, &n.Status, &n.Draining, &n.Systems, &n.Features, &n.CurrentJobs,
			&n.MaxJobs, &n.SpeedFactor, &n.Hostname, &n.Version, &n.StartedAt, &n.LastSeen, &n.Nix.Version, &n.Nix.Protocol)
		return n, err
	})
	if err != nil {
		return "", Page{}, fmt.Errorf("list nodes: %w", err)
	}
	leaders, err := cluster.ListLeaders(ctx, u.cfg.Pool)
	if err != nil {
		return "", Page{}, err
	}
	d := NodesPage{Nodes: nodes, Leaders: leaders, Counts: map[string]int{}}
	anonymous := u.Caller(r).Kind == access.Anonymous
	for i := range d.Nodes {
		n := &d.Nodes[i]
		if anonymous { // where nodes are and what they run is not everyone's (GET /api/cluster too)
			n.Hostname, n.Version, n.Nix = "", "", cluster.NixInfo{}
		}
		d.Counts[n.State()]++
		for _, l := range leaders {
			if l.Valid && l.NodeID == n.ID {
				n.Leads = append(n.Leads, l.Role)
			}
		}
	}
	return "nodes", Page{Title: "Nodes", Nav: "nodes", Data: d}, nil
}

// QueueJob is a pending job on the queue page.
type QueueJob struct {
	ID        int64
	Priority  int
	Ratio     float64 // its project's consumed/shares ratio (0 for no project)
	Chain     int     // jobs on the longest chain of pending jobs above it (queue.order)
	CreatedAt time.Time
	System    string
	Name      string // the derivation's name
	Project   string // "" for a job of no project
	Blocked   int    // input jobs not succeeded yet
	Capable   bool   // some live builder has its system and features
	// Hidden is a job of a private project the viewer may not see: the page shows neither its
	// name nor its project.
	Hidden bool
}

// QueuePage is the queue page's data. Each list continues on its own: a page asked for with
// ?after= shows only ready jobs, one asked for with ?wafter= only waiting ones.
type QueuePage struct {
	ReadyCount, BlockedCount int
	Ready, Waiting           []QueueJob
	ShowReady, ShowWaiting   bool
	Continued                bool   // not the first page
	MoreReady, MoreWaiting   string // the next pages' URLs; "" when the list ends
}

// readyCursor is the claim order's sort key of a ready job: priority DESC, ratio, chain DESC,
// created_at, id. Encoded as "priority_ratio_chain_micros_id" with the ratio's IEEE bits in
// hex, so it is exact and needs no escaping in a URL.
type readyCursor struct {
	Priority int64
	Ratio    float64
	Chain    int64
	Created  time.Time
	ID       int64
}

// firstPriority is above any job's priority (an INT column): the cursor of a first page.
const firstPriority = math.MaxInt32 + 1

func (c readyCursor) String() string {
	return fmt.Sprintf("%d_%x_%d_%d_%d", c.Priority, math.Float64bits(c.Ratio), c.Chain, c.Created.UnixMicro(), c.ID)
}

func parseReadyCursor(s string) (readyCursor, error) {
	f := strings.Split(s, "_")
	if len(f) != 5 {
		return readyCursor{}, badRequest("malformed cursor")
	}
	p, err1 := strconv.ParseInt(f[0], 10, 32)
	bits, err2 := strconv.ParseUint(f[1], 16, 64)
	chain, err3 := strconv.ParseInt(f[2], 10, 32)
	us, err4 := strconv.ParseInt(f[3], 10, 64)
	id, err5 := strconv.ParseInt(f[4], 10, 64)
	r := math.Float64frombits(bits)
	if err := errors.Join(err1, err2, err3, err4, err5); err != nil || math.IsNaN(r) || chain < 0 {
		return readyCursor{}, badRequest("malformed cursor")
	}
	return readyCursor{Priority: p, Ratio: r, Chain: chain, Created: time.UnixMicro(us), ID: id}, nil
}

// waitCursor is the waiting list's sort key: priority DESC, created_at, id, as
// "priority_micros_id".
type waitCursor struct {
	Priority int64
	Created  time.Time
	ID       int64
}

func (c waitCursor) String() string {
	return fmt.Sprintf("%d_%d_%d", c.Priority, c.Created.UnixMicro(), c.ID)
}

func parseWaitCursor(s string) (waitCursor, error) {
	f := strings.Split(s, "_")
	if len(f) != 3 {
		return waitCursor{}, badRequest("malformed cursor")
	}
	p, err1 := strconv.ParseInt(f[0], 10, 32)
	us, err2 := strconv.ParseInt(f[1], 10, 64)
	id, err3 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return waitCursor{}, badRequest("malformed cursor")
	}
	return waitCursor{Priority: p, Created: time.UnixMicro(us), ID: id}, nil
}

func (u *UI) queuePage(w http.ResponseWriter, r *http.Request) (string, Page, error) {
	ctx := r.Context()
	q := r.URL.Query()
	after, wafter := q.Get("after"), q.Get("wafter")
	d := QueuePage{ShowReady: wafter == "", ShowWaiting: after == "", Continued: after != "" || wafter != ""}
	rc, wc := readyCursor{Priority: firstPriority}, waitCursor{Priority: firstPriority}
	var err error
	if after != "" {
		if rc, err = parseReadyCursor(after); err != nil {
			return "", Page{}, err
		}
	}
	if wafter != "" {
		if wc, err = parseWaitCursor(wafter); err != nil {
			return "", Page{}, err
		}
	}

	tx, err := u.cfg.Pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return "", Page{}, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, sqlNoJIT); err != nil {
		return "", Page{}, err
	}
	if !d.Continued {
		if err := tx.QueryRow(ctx, sqlQueueCounts).Scan(&d.ReadyCount, &d.BlockedCount); err != nil {
			return "", Page{}, fmt.Errorf("count pending jobs: %w", err)
		}
	}
	seen := map[string]bool{}
	if d.ShowReady {
		jobs, err := u.queueJobs(r, tx, seen, sqlQueueReady, rc.Priority, rc.Ratio, rc.Chain, rc.Created, rc.ID, PageSize+1)
		if err != nil {
			return "", Page{}, err
		}
		if len(jobs) > PageSize {
			jobs = jobs[:PageSize]
			l := jobs[PageSize-1]
			d.MoreReady = "/ci/queue?after=" + readyCursor{int64(l.Priority), l.Ratio, int64(l.Chain), l.CreatedAt, l.ID}.String()
		}
		d.Ready = jobs
	}
	if d.ShowWaiting {
		jobs, err := u.queueJobs(r, tx, seen, sqlQueueBlocked, wc.Priority, wc.Created, wc.ID, PageSize+1)
		if err != nil {
			return "", Page{}, err
		}
		if len(jobs) > PageSize {
			jobs = jobs[:PageSize]
			l := jobs[PageSize-1]
			d.MoreWaiting = "/ci/queue?wafter=" + waitCursor{int64(l.Priority), l.CreatedAt, l.ID}.String()
		}
		d.Waiting = jobs
	}
	return "queue", Page{Title: "Queue", Nav: "queue", Data: d}, nil
}

// queueJobs runs one of the queue page's lists and hides the jobs of private projects the
// viewer may not see (seen caches the answer per repository across both lists).
func (u *UI) queueJobs(r *http.Request, tx pgx.Tx, seen map[string]bool, sql string, args ...any) ([]QueueJob, error) {
	rows, err := tx.Query(r.Context(), sql, args...)
	if err != nil {
		return nil, fmt.Errorf("list queue: %w", err)
	}
	type repo struct {
		private         bool
		forge, fullName string
	}
	var repos []repo
	jobs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (QueueJob, error) {
		var j QueueJob
		var rp repo
		err := row.Scan(&j.ID, &j.Priority, &j.Ratio, &j.Chain, &j.CreatedAt, &j.System, &j.Name, &j.Project, &j.Blocked,
			&j.Capable, &rp.private, &rp.forge, &rp.fullName)
		repos = append(repos, rp)
		return j, err
	})
	if err != nil {
		return nil, fmt.Errorf("list queue: %w", err)
	}
	for i, rp := range repos {
		if !rp.private {
			continue
		}
		key := rp.forge + ":" + rp.fullName
		ok, known := seen[key]
		if !known {
			if ok, err = u.canSee(r, true, rp.forge, rp.fullName); err != nil {
				return nil, err
			}
			seen[key] = ok
		}
		if !ok {
			jobs[i].Hidden, jobs[i].Name, jobs[i].Project = true, "", ""
		}
	}
	return jobs, nil
}
