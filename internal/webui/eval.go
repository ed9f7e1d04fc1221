package webui

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// attrPageSize is how many attributes an evaluation page lists before "Load more".
const attrPageSize = 200

// registerEvalPages mounts the pages of a project: GET /ci/{project}/ (browse.go),
// GET /ci/{project}/eval/{id} and GET /ci/{project}/build/{id}, its badges and "latest"
// links (badge.go) and its attributes' histories (history.go).
//
// They are served through one pattern, GET /ci/{project}/{rest...}, because ServeMux refuses
// GET /ci/{project}/eval/{id} (or /ci/{project}/{$}) next to GET /ci/static/: both match
// /ci/static/eval/1 and neither is more specific. /ci/static/ and the fixed pages
// (/ci/queue, /ci/nodes) are more specific than this pattern, so they keep their paths;
// anything else under a project is a 404 page.
func (u *UI) registerEvalPages(rt *access.Routes) {
	projectPage, evalPage, buildPage := u.projectPageHandler(), u.page(u.evalPage), u.buildPageHandler()
	// A private project's pages are someone else's 404, the page of a project that does not
	// exist.
	scope := access.Project("project").Deny(func(w http.ResponseWriter, r *http.Request) {
		u.renderError(w, r, notFound("no project %q", r.PathValue("project")))
	})
	rt.Handle("GET /ci/{project}/{rest...}", scope, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rest := r.PathValue("rest")
		if rest == "" {
			projectPage.ServeHTTP(w, r)
			return
		}
		if u.serveReadmeLink(w, r, rest) {
			return
		}
		kind, id, ok := strings.Cut(rest, "/")
		if !ok || strings.Contains(id, "/") {
			kind = ""
		}
		r.SetPathValue("id", id)
		switch kind {
		case "eval":
			evalPage.ServeHTTP(w, r)
		case "build":
			buildPage.ServeHTTP(w, r)
		default:
			u.renderError(w, r, notFound("no such page"))
		}
	}))
}

// serveReadmeLink serves rest if it is a badge or a "latest" link (badge.go) or an
// attribute's history (history.go), and reports whether it was.
func (u *UI) serveReadmeLink(w http.ResponseWriter, r *http.Request, rest string) bool {
	var h func(w http.ResponseWriter, r *http.Request) error
	switch {
	case rest == "badge.svg" || rest == "badge.json":
		h = func(w http.ResponseWriter, r *http.Request) error { return u.badge(w, r, rest == "badge.json") }
	case strings.HasPrefix(rest, "attr/"):
		attr := strings.TrimPrefix(rest, "attr/")
		u.page(func(w http.ResponseWriter, r *http.Request) (string, Page, error) { return u.historyPage(r, attr) }).ServeHTTP(w, r)
		return true
	case strings.HasPrefix(rest, "latest/"):
		attr, output := strings.CutSuffix(strings.TrimPrefix(rest, "latest/"), "/output")
		h = func(w http.ResponseWriter, r *http.Request) error { return u.latest(w, r, attr, output) }
	default:
		return false
	}
	ctx, cancel := context.WithTimeout(r.Context(), httpapi.DBTimeout)
	defer cancel()
	if err := h(w, r.WithContext(ctx)); err != nil {
		u.renderError(w, r, err)
	}
	return true
}

// pathID is the page's positive integer {id}, or a 404 naming what.
func pathID(r *http.Request, what string) (int64, error) {
	raw := r.PathValue("id")
	id, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || id <= 0 || strings.TrimLeft(raw, "0123456789") != "" {
		if len(raw) > 40 {
			raw = raw[:40] + "…"
		}
		return 0, notFound("no %s %q", what, raw)
	}
	return id, nil
}

// EvalHeader is an evaluation as its page's header shows it.
type EvalHeader struct {
	ID                   int64
	ProjectID            int64
	Project              string
	Forge, Owner, Repo   string
	FullName             string
	Commit, Branch       string
	Status               status.EvalStatus
	SkippedReason, Error string
	PRNumber             int
	PRAuthor             string
	// A pull request's base branch, the base's tip its last run merged into (or that
	// conflicted), and the merge it evaluated ("": the head).
	PRBase, BaseCommit, MergeCommit string
	CreatedAt                       time.Time
	StartedAt, FinishedAt           *time.Time
	ReusesEvalID                    *int64
	CommitURL                       string  // the commit's page on the forge; "" when unknown
	Evaluator                       *string // the node that evaluated it last
	NixVersion                      string  // the Nix it evaluated with; "" when unknown
	// Its walkers: how many ran at once (0: unknown), the memory each might use (0: no
	// limit), and how often one was restarted past it.
	Workers, WorkerRestarts int
	WorkerMemory            int64
}

// WorkerMemoryMiB is the memory of one walker in MiB.
func (e EvalHeader) WorkerMemoryMiB() int64 { return e.WorkerMemory >> 20 }

// TotalWorkerMemoryMiB is the memory of all walkers together in MiB.
func (e EvalHeader) TotalWorkerMemoryMiB() int64 { return int64(e.Workers) * e.WorkerMemory >> 20 }

// Finished reports whether the evaluation itself is over (its builds may still run).
func (e EvalHeader) Finished() bool {
	return !e.Status.Unfinished()
}

// AttrRow is one attribute of an evaluation as its table row shows it: the template
// "attr-row" (templates/parts/attr.html) renders it as <tr id="attr-{{.ID}}">.
type AttrRow struct {
	ID        int64  // eval_attrs.id
	Project   string // the evaluation's project, for links
	Attr      string
	DrvPath   string // "" when the attribute failed to evaluate
	EvalError string // why it failed to evaluate
	JobID     int64  // 0: no build job (its outputs were cached, or it failed to evaluate)
	// Status is the job's status, "cached" without a job, or "eval error".
	Status                string
	ClaimedBy             string // the builder
	StartedAt, FinishedAt *time.Time
	// For a dep-failed job: the nearest failed (or cancelled) build below it, which caused it.
	CauseID   int64
	CauseName string
	// For a failure that predates the evaluation (a cached failure): the attempt that failed
	// first; 0 otherwise.
	FirstFailed int
	// Flaky: its build succeeded after a build failure of the same derivation.
	Flaky bool
}

// Class is the row's badge class.
func (a AttrRow) Class() string {
	switch a.Status {
	case "cached":
		return "ok"
	case "eval error":
		return "bad"
	}
	return statusClass(a.Status)
}

// evalTabs are the tabs of an evaluation page, in order, with their labels.
var evalTabs = []struct{ Key, Label string }{
	{"all", "All"}, {"failed", "Failed"}, {"building", "Building"}, {"pending", "Pending"}, {"succeeded", "Succeeded"},
}

// Tab is one tab of an evaluation page.
type Tab struct {
	Key, Label, Href string
	Count            int
	Current          bool
}

// EvalPage is an evaluation page's data.
type EvalPage struct {
	Eval EvalHeader
	Tabs []Tab
	Tab  string
	// Jobs counts the builds of the attributes' closures (dependencies included) by status.
	Jobs map[string]int
	// Flaky counts the attributes whose build is flaky.
	Flaky int
	Rows  []AttrRow
	After string // the "after" cursor of this page; "" on the first
	First string // the link to the first page; "" on the first
	More  string // the "Load more" link; "" when this is the last page
	// Timeline is the picture of the builds; nil when nothing was built.
	Timeline *Timeline
	// Diff is what changed against the evaluation before it; nil when there is none.
	Diff *DiffView
	// Actions are who re-evaluated, cancelled or rebuilt the evaluation, newest first.
	Actions []AuditEntry
}

// DiffView is an evaluation diff as its page shows it: each group names its first
// diffNames attributes.
type DiffView struct {
	Against int64
	Summary string
	Groups  []DiffGroup
}

// DiffGroup is one kind of change: its attributes, and how many more there are.
type DiffGroup struct {
	Label, Class string
	Names        []string
	More         int
}

// diffNames bounds the attributes each group of an evaluation's diff names.
const diffNames = 20

func newDiffView(d evaluation.Diff) *DiffView {
	if d.Against == 0 {
		return nil
	}
	v := &DiffView{Against: d.Against, Summary: d.Summary()}
	for _, g := range []struct {
		label, class string
		names        []string
	}{
		{"newly failing", "bad", d.NewlyFailing}, {"fixed", "ok", d.NewlyFixed},
		{"new and failing", "bad", d.AddedFailing}, {"removed", "off", d.Removed},
	} {
		if len(g.names) == 0 {
			continue
		}
		n := min(len(g.names), diffNames)
		v.Groups = append(v.Groups, DiffGroup{Label: g.label, Class: g.class, Names: g.names[:n], More: len(g.names) - n})
	}
	return v
}

func (u *UI) evalPage(w http.ResponseWriter, r *http.Request) (string, Page, error) {
	ctx := r.Context()
	id, err := pathID(r, "evaluation")
	if err != nil {
		return "", Page{}, err
	}
	project := r.PathValue("project")
	e, err := u.evalHeader(ctx, id, project)
	if err != nil {
		return "", Page{}, err
	}
	q := r.URL.Query()
	tab := q.Get("tab")
	if tab == "" {
		tab = "all"
	}
	if !slices.ContainsFunc(evalTabs, func(t struct{ Key, Label string }) bool { return t.Key == tab }) {
		return "", Page{}, httpapi.Errorf(http.StatusBadRequest, "unknown tab %.40q", tab)
	}
	p := EvalPage{Eval: e, Tab: tab}
	var after *string
	if a := q.Get("after"); a != "" {
		after, p.After = &a, a
		p.First = "?"
		if tab != "all" {
			p.First = "?" + url.Values{"tab": {tab}}.Encode()
		}
	}
	limit := attrPageSize + 1
	p.Rows, err = u.queryAttrRows(ctx, attrQuery{evalID: id, tab: tab, after: after, limit: &limit})
	if err != nil {
		return "", Page{}, err
	}
	if len(p.Rows) > attrPageSize {
		p.Rows = p.Rows[:attrPageSize]
		v := url.Values{"after": {p.Rows[len(p.Rows)-1].Attr}}
		if tab != "all" {
			v.Set("tab", tab)
		}
		p.More = "?" + v.Encode()
	}
	var counts [5]int
	if err := u.cfg.Pool.QueryRow(ctx, sqlEvalTabCounts, id).Scan(&counts[0], &counts[1], &counts[2], &counts[3], &counts[4], &p.Flaky); err != nil {
		return "", Page{}, fmt.Errorf("count attributes of evaluation %d: %w", id, err)
	}
	for i, t := range evalTabs {
		href := "?"
		if t.Key != "all" {
			href = "?" + url.Values{"tab": {t.Key}}.Encode()
		}
		p.Tabs = append(p.Tabs, Tab{Key: t.Key, Label: t.Label, Href: href, Count: counts[i], Current: t.Key == tab})
	}
	jobs, err := evaluation.JobCounts(ctx, u.cfg.Pool, id)
	if err != nil {
		return "", Page{}, err
	}
	p.Jobs = make(map[string]int, len(jobs))
	for s, n := range jobs {
		p.Jobs[string(s)] = n // templates index it with plain words
	}
	if p.Timeline, err = u.timeline(ctx, id, e.Project); err != nil {
		return "", Page{}, err
	}
	d, err := evaluation.DiffOf(ctx, u.cfg.Pool, id)
	if err != nil {
		return "", Page{}, err
	}
	p.Diff = newDiffView(d)
	if p.Actions, err = u.audit(ctx, "eval", id); err != nil {
		return "", Page{}, err
	}
	title := fmt.Sprintf("%s · evaluation #%d", e.Project, e.ID)
	return "eval", Page{Title: title, Data: p}, nil
}

// evalHeader reads evaluation id of project, or a 404 if there is no such evaluation of it.
func (u *UI) evalHeader(ctx context.Context, id int64, project string) (EvalHeader, error) {
	var e EvalHeader
	err := u.cfg.Pool.QueryRow(ctx, sqlEvalHeader, id, project).Scan(&e.ID, &e.ProjectID, &e.Project, &e.Forge,
		&e.Owner, &e.Repo, &e.FullName, &e.Commit, &e.Branch, &e.Status, &e.SkippedReason, &e.Error, &e.PRNumber,
		&e.PRAuthor, &e.PRBase, &e.BaseCommit, &e.MergeCommit, &e.CreatedAt, &e.StartedAt, &e.FinishedAt, &e.ReusesEvalID,
		&e.Evaluator, &e.NixVersion, &e.Workers, &e.WorkerMemory, &e.WorkerRestarts)
	if errors.Is(err, pgx.ErrNoRows) {
		return e, notFound("project %s has no evaluation %d", project, id)
	}
	if err != nil {
		return e, fmt.Errorf("read evaluation %d: %w", id, err)
	}
	if f, ok := u.cfg.Forges[e.Forge]; ok {
		e.CommitURL = f.CommitURL(forge.Repo{Owner: e.Owner, Name: e.Repo}, e.Commit)
	}
	return e, nil
}

// attrQuery selects attribute rows of an evaluation.
type attrQuery struct {
	evalID int64
	tab    string   // one of evalTabs' keys
	after  *string  // only attributes after this name
	drvs   []string // nil: any; otherwise only attributes of these derivations
	limit  *int     // nil: no limit
}

// attrRows renders-ready rows of evaluation evalID, by attribute name: all of them when
// drvPaths is nil, otherwise those whose derivation is one of drvPaths (the live updates
// re-render the rows of the builds that changed).
func (u *UI) attrRows(ctx context.Context, evalID int64, drvPaths []string) ([]AttrRow, error) {
	if drvPaths != nil && len(drvPaths) == 0 {
		return nil, nil
	}
	return u.queryAttrRows(ctx, attrQuery{evalID: evalID, tab: "all", drvs: drvPaths})
}

func (u *UI) queryAttrRows(ctx context.Context, q attrQuery) ([]AttrRow, error) {
	rows, err := u.cfg.Pool.Query(ctx, sqlEvalAttrRows, q.evalID, q.tab, q.after, q.drvs, q.limit)
	if err != nil {
		return nil, fmt.Errorf("attributes of evaluation %d: %w", q.evalID, err)
	}
	as, err := pgx.CollectRows(rows, pgx.RowToStructByPos[AttrRow])
	if err != nil {
		return nil, fmt.Errorf("attributes of evaluation %d: %w", q.evalID, err)
	}
	return as, nil
}
