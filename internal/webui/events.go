package webui

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// Live updates: GET /api/events/dashboard and /api/events/eval/{id} are server-sent event
// streams of HTML fragments that HTMX swaps in by id (hx-swap-oob). One hub per process reads
// the process's LISTEN session (build_jobs, evaluations), coalesces a burst of notifications
// into one refresh per flushInterval, renders each changed fragment once and hands it to every
// stream watching it. The hub runs while at least one stream is open.
const (
	flushInterval  = 500 * time.Millisecond
	eventKeepAlive = 15 * time.Second
	// eventWriteTimeout drops a client that stops reading.
	eventWriteTimeout = 30 * time.Second
	// clientBuffer is how many updates a slow client may be behind before it is dropped (its
	// browser reconnects and gets a fresh page).
	clientBuffer = 16
	// maxEventStreams bounds the open streams per process.
	maxEventStreams = 1000
)

func (u *UI) registerEvents(rt *access.Routes) {
	u.hub = newHub(u)
	// One message for every viewer: private projects are left out (hub.dashboardUpdate).
	rt.Handle("GET /api/events/dashboard", access.Filtered, http.HandlerFunc(u.dashboardEvents))
	rt.Handle("GET /api/events/eval/{id}", access.Eval("id").Deny(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no such evaluation", http.StatusNotFound)
	}), http.HandlerFunc(u.evalEvents))
}

// stream is one open event stream: the dashboard's (evalID 0) or an evaluation's.
type stream struct {
	evalID int64
	// since is when the page the stream belongs to was rendered: on joining, the stream is
	// first sent what changed after it (the page may predate the hub's LISTEN).
	since time.Time
	fresh bool // not caught up yet
	out   chan []byte
	gone  chan struct{} // closed when the hub dropped it (too slow)
	once  sync.Once
}

func (s *stream) drop() { s.once.Do(func() { close(s.gone) }) }

// hub fans the notifications out to the open streams.
type hub struct {
	u *UI

	mu      sync.Mutex
	streams map[*stream]struct{}
	cancel  context.CancelFunc // of the running loop; nil when none runs
	// lastDash is the dashboard fragments last sent, by element id: only changes go out.
	lastDash map[string]string
	// kick asks the loop to catch new streams up at once.
	kick chan struct{}
}

func newHub(u *UI) *hub {
	return &hub{u: u, streams: map[*stream]struct{}{}, kick: make(chan struct{}, 1)}
}

var errTooManyStreams = fmt.Errorf("too many live streams")

// join adds a stream, starting the loop if it is the first.
func (h *hub) join(s *stream) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.streams) >= maxEventStreams {
		return errTooManyStreams
	}
	s.fresh = true
	h.streams[s] = struct{}{}
	select {
	case h.kick <- struct{}{}:
	default:
	}
	if h.cancel == nil && h.u.cfg.Notifier != nil {
		ctx, cancel := context.WithCancel(context.Background())
		h.cancel = cancel
		go h.run(ctx)
	}
	return nil
}

// leave removes a stream, stopping the loop after the last.
func (h *hub) leave(s *stream) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.streams, s)
	if len(h.streams) == 0 && h.cancel != nil {
		h.cancel()
		h.cancel = nil
		h.lastDash = nil
	}
}

// changes collects what the notifications since the last flush touched.
type changes struct {
	any   bool
	drvs  map[string]struct{}
	evals map[int64]struct{}
}

func (h *hub) run(ctx context.Context) {
	jobs, err := h.u.cfg.Notifier.Subscribe("build_jobs")
	if err != nil {
		h.u.log.Error("live updates: subscribe", "error", err)
		return
	}
	defer jobs.Close()
	evals, err := h.u.cfg.Notifier.Subscribe("evaluations")
	if err != nil {
		h.u.log.Error("live updates: subscribe", "error", err)
		return
	}
	defer evals.Close()
	tick := time.NewTicker(flushInterval)
	defer tick.Stop()
	c := changes{drvs: map[string]struct{}{}, evals: map[int64]struct{}{}}
	for {
		select {
		case <-ctx.Done():
			return
		case n := <-jobs.C:
			c.any = true
			for _, d := range notifiedDrvs(n) {
				c.drvs[d] = struct{}{}
			}
		case n := <-evals.C:
			c.any = true
			var p struct {
				ID int64 `json:"id"`
			}
			if json.Unmarshal([]byte(n.Payload), &p) == nil && p.ID > 0 {
				c.evals[p.ID] = struct{}{}
			}
		case <-jobs.Resync:
			c.any = true // notifications may have been missed: refresh what is watched
		case <-evals.Resync:
			c.any = true
		case <-h.kick:
			h.catchUp(ctx)
		case <-tick.C:
			h.catchUp(ctx) // streams that joined before the subscription was in place
			if !c.any {
				continue
			}
			h.flush(ctx, c)
			c = changes{drvs: map[string]struct{}{}, evals: map[int64]struct{}{}}
		}
	}
}

// catchUp sends each new stream what changed since its page was rendered: a dashboard the
// whole set of fragments, an evaluation its title and the rows whose builds moved since.
func (h *hub) catchUp(ctx context.Context) {
	h.mu.Lock()
	var fresh []*stream
	for s := range h.streams {
		if s.fresh {
			s.fresh = false
			fresh = append(fresh, s)
		}
	}
	h.mu.Unlock()
	if len(fresh) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, s := range fresh {
		if s.evalID == 0 {
			msg, err := h.dashboardFull(ctx)
			if err != nil {
				h.u.log.Warn("live updates: dashboard", "error", err)
				continue
			}
			h.send([]*stream{s}, msg)
			continue
		}
		rows, err := h.u.cfg.Pool.Query(ctx, sqlAttrDrvsMovedSince, s.evalID, s.since)
		if err != nil {
			h.u.log.Warn("live updates: catch up", "evaluation", s.evalID, "error", err)
			continue
		}
		drvs, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			h.u.log.Warn("live updates: catch up", "evaluation", s.evalID, "error", err)
			continue
		}
		h.evalUpdates(ctx, changes{evals: map[int64]struct{}{s.evalID: {}}, drvs: setOf(drvs)},
			map[int64][]*stream{s.evalID: {s}})
	}
}

func setOf(ss []string) map[string]struct{} {
	m := make(map[string]struct{}, len(ss))
	for _, s := range ss {
		m[s] = struct{}{}
	}
	return m
}

// notifiedDrvs are the derivations a build_jobs notification names ({"drv_path"} or the
// announcer's {"drv_paths"}).
func notifiedDrvs(n notify.Notification) []string {
	var p struct {
		DrvPath  string   `json:"drv_path"`
		DrvPaths []string `json:"drv_paths"`
	}
	if json.Unmarshal([]byte(n.Payload), &p) != nil {
		return nil
	}
	if p.DrvPath != "" {
		p.DrvPaths = append(p.DrvPaths, p.DrvPath)
	}
	return p.DrvPaths
}

// flush renders what changed and sends it to the streams that watch it.
func (h *hub) flush(ctx context.Context, c changes) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	h.mu.Lock()
	var dash []*stream
	byEval := map[int64][]*stream{}
	for s := range h.streams {
		if s.evalID == 0 {
			dash = append(dash, s)
		} else {
			byEval[s.evalID] = append(byEval[s.evalID], s)
		}
	}
	h.mu.Unlock()
	if len(dash) > 0 {
		if msg, err := h.dashboardUpdate(ctx); err != nil {
			h.u.log.Warn("live updates: dashboard", "error", err)
		} else if msg != nil {
			h.send(dash, msg)
		}
	}
	if len(byEval) > 0 {
		h.evalUpdates(ctx, c, byEval)
	}
}

// dashboardUpdate renders the dashboard's fragments and returns the changed ones as one
// message, nil if none changed.
func (h *hub) dashboardUpdate(ctx context.Context) ([]byte, error) {
	d, err := h.u.loadDashboard(ctx)
	if err != nil {
		return nil, err
	}
	frags := map[string]string{}
	var order []string
	render := func(id, tmpl string, data any) error {
		var b bytes.Buffer
		if err := h.u.pages["dashboard"].ExecuteTemplate(&b, tmpl, data); err != nil {
			return err
		}
		frags[id] = b.String()
		order = append(order, id)
		return nil
	}
	if err := render("queue-bar", "queue-bar-oob", d.Bar); err != nil {
		return nil, err
	}
	for _, p := range d.Projects {
		if !h.u.everyones(ctx, p) {
			continue // one message goes to every viewer: private projects are not updated live
		}
		if err := render(fmt.Sprintf("project-%d", p.ID), "project-row", p); err != nil {
			return nil, err
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var out bytes.Buffer
	for _, id := range order {
		if h.lastDash[id] != frags[id] {
			out.WriteString(oob(frags[id]))
		}
	}
	h.lastDash = frags
	if out.Len() == 0 {
		return nil, nil
	}
	return sseMessage("update", out.Bytes()), nil
}

// dashboardFull renders every dashboard fragment, for a stream that just joined.
func (h *hub) dashboardFull(ctx context.Context) ([]byte, error) {
	d, err := h.u.loadDashboard(ctx)
	if err != nil {
		return nil, err
	}
	t := h.u.pages["dashboard"]
	var out, b bytes.Buffer
	if err := t.ExecuteTemplate(&b, "queue-bar-oob", d.Bar); err != nil {
		return nil, err
	}
	out.WriteString(oob(b.String()))
	for _, p := range d.Projects {
		if !h.u.everyones(ctx, p) {
			continue
		}
		b.Reset()
		if err := t.ExecuteTemplate(&b, "project-row", p); err != nil {
			return nil, err
		}
		out.WriteString(oob(b.String()))
	}
	return sseMessage("update", out.Bytes()), nil
}

// send queues msg on each stream, dropping streams that are too far behind.
func (h *hub) send(to []*stream, msg []byte) {
	for _, s := range to {
		select {
		case s.out <- msg:
		default:
			s.drop()
		}
	}
}

// oob marks a fragment's first element for an out-of-band swap: HTMX replaces the element of
// the page with the same id.
func oob(fragment string) string {
	f := strings.TrimSpace(fragment)
	end := strings.IndexByte(f, '>')
	if !strings.HasPrefix(f, "<") || end < 0 {
		return f
	}
	if f[end-1] == '/' {
		end--
	}
	return f[:end] + ` hx-swap-oob="true"` + f[end:] + "\n"
}

// sseMessage frames an event: each line of data on a data: line.
func sseMessage(event string, data []byte) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "event: %s\n", event)
	for line := range strings.SplitSeq(strings.TrimRight(string(data), "\n"), "\n") {
		b.WriteString("data: ")
		b.WriteString(line)
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	return b.Bytes()
}

func (u *UI) dashboardEvents(w http.ResponseWriter, r *http.Request) {
	u.serveEvents(w, r, &stream{out: make(chan []byte, clientBuffer), gone: make(chan struct{})})
}

// serveEvents streams s's messages until the client leaves or is dropped.
func (u *UI) serveEvents(w http.ResponseWriter, r *http.Request, s *stream) {
	if u.cfg.Notifier == nil {
		http.Error(w, "live updates unavailable", http.StatusServiceUnavailable)
		return
	}
	if err := u.hub.join(s); err != nil {
		w.Header().Set("Retry-After", "10")
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer u.hub.leave(s)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	rc := http.NewResponseController(w)
	write := func(b []byte) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(eventWriteTimeout))
		if _, err := w.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !write([]byte("retry: 2000\n\n")) {
		return
	}
	keep := time.NewTicker(eventKeepAlive)
	defer keep.Stop()
	revoked := access.Revoked(r)
	for {
		select {
		case <-r.Context().Done():
			return
		case <-s.gone:
			return
		case <-revoked:
			return
		case msg := <-s.out:
			if !write(msg) {
				return
			}
		case <-keep.C:
			if !write([]byte(": keep-alive\n\n")) {
				return
			}
		}
	}
}

// everyones reports whether project row p may go to anyone (the rule, for an anonymous
// caller): the dashboard's live updates are one message for every viewer.
func (u *UI) everyones(ctx context.Context, p ProjectRow) bool {
	ok, err := u.rule.MayRead(ctx, access.Caller{}, access.Repo{Private: p.Private, Forge: p.Forge, FullName: p.FullName})
	return ok && err == nil
}

// loadDashboard reads the dashboard's data.
func (u *UI) loadDashboard(ctx context.Context) (Dashboard, error) {
	var d Dashboard
	b := &d.Bar
	if err := u.cfg.Pool.QueryRow(ctx, sqlQueueBar).Scan(&b.Pending, &b.Building, &b.Uploading, &b.NodesOnline); err != nil {
		return d, err
	}
	rows, err := u.cfg.Pool.Query(ctx, sqlDashboardProjects)
	if err != nil {
		return d, err
	}
	d.Projects, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (ProjectRow, error) {
		var p ProjectRow
		err := row.Scan(&p.ID, &p.Name, &p.Forge, &p.FullName, &p.CloneURL, &p.Enabled, &p.Private, &p.EvalID,
			&p.Commit, &p.Branch, &p.EvalStatus, &p.EvalCreated, &p.Total, &p.Succeeded, &p.Failed, &p.Running, &p.Pending)
		return p, err
	})
	if err != nil {
		return d, err
	}
	for i := range d.Projects {
		p := &d.Projects[i]
		if f, ok := u.cfg.Forges[p.Forge]; ok && p.Commit != nil {
			owner, name, _ := strings.Cut(p.FullName, "/")
			p.CommitURL = f.CommitURL(forge.Repo{Owner: owner, Name: name}, *p.Commit)
		}
		// A project added by URL is named by its URL: never with a credential in it.
		p.CloneURL, p.FullName = project.RedactURL(p.CloneURL), project.RedactURL(p.FullName)
	}
	return d, nil
}

func (u *UI) evalEvents(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		http.Error(w, "invalid evaluation id", http.StatusBadRequest)
		return
	}
	// The route checked that the caller may read the evaluation, and that it exists
	// (registerEvents).
	// Without a (valid) render time, catch up on the last minute.
	since := time.Now().Add(-time.Minute)
	if ms, err := strconv.ParseInt(r.URL.Query().Get("since"), 10, 64); err == nil && ms > 0 {
		since = time.UnixMilli(ms)
	}
	u.serveEvents(w, r, &stream{evalID: id, since: since, out: make(chan []byte, clientBuffer), gone: make(chan struct{})})
}

// evalUpdates sends each watched evaluation the attribute rows whose builds changed and, when
// its own status changed, its title and a notice to reload (its attributes may be new).
func (h *hub) evalUpdates(ctx context.Context, c changes, byEval map[int64][]*stream) {
	ids := make([]int64, 0, len(byEval))
	for id := range byEval {
		ids = append(ids, id)
	}
	drvsOf := map[int64][]string{}
	if len(c.drvs) > 0 {
		drvs := make([]string, 0, len(c.drvs))
		for d := range c.drvs {
			drvs = append(drvs, d)
		}
		rows, err := h.u.cfg.Pool.Query(ctx, sqlWatchedAttrDrvs, ids, drvs)
		if err != nil {
			h.u.log.Warn("live updates: evaluations of builds", "error", err)
			return
		}
		var id int64
		var drv string
		if _, err := pgx.ForEachRow(rows, []any{&id, &drv}, func() error {
			drvsOf[id] = append(drvsOf[id], drv)
			return nil
		}); err != nil {
			h.u.log.Warn("live updates: evaluations of builds", "error", err)
			return
		}
	}
	t := h.u.pages["eval"]
	for _, id := range ids {
		var out bytes.Buffer
		if _, changed := c.evals[id]; changed {
			var head struct {
				ID     int64
				Status status.EvalStatus
			}
			head.ID = id
			if err := h.u.cfg.Pool.QueryRow(ctx, sqlEvalStatus, id).Scan(&head.Status); err == nil {
				for _, tmpl := range []string{"eval-head", "eval-notice"} {
					var b bytes.Buffer
					if err := t.ExecuteTemplate(&b, tmpl, head); err != nil {
						h.u.log.Warn("live updates: render", "template", tmpl, "error", err)
						continue
					}
					out.WriteString(oob(b.String()))
				}
			}
		}
		if drvs := drvsOf[id]; len(drvs) > 0 {
			rows, err := h.u.attrRows(ctx, id, drvs)
			if err != nil {
				h.u.log.Warn("live updates: attribute rows", "evaluation", id, "error", err)
				continue
			}
			for _, r := range rows {
				var b bytes.Buffer
				if err := t.ExecuteTemplate(&b, "attr-row", r); err != nil {
					h.u.log.Warn("live updates: render", "template", "attr-row", "error", err)
					continue
				}
				out.WriteString(oob(b.String()))
			}
		}
		if out.Len() > 0 {
			h.send(byEval[id], sseMessage("update", out.Bytes()))
		}
	}
}
