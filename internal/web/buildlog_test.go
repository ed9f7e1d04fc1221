package web

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/klauspost/compress/zstd"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

// eventWait bounds every wait for something a stream should deliver.
const eventWait = 10 * time.Second

// logTestServer is a real server on a loopback listener, with a real notifier when asked.
type logTestServer struct {
	*Server
	url string
}

// startLogServer starts a notifier (if withNotifier) and a server on pool; tune adjusts the
// server before Start. Both stop at the end of the test.
func startLogServer(t *testing.T, pool *pgxpool.Pool, withNotifier bool, tune func(*Server)) *logTestServer {
	t.Helper()
	return startLogServerWith(t, pool, Config{}, withNotifier, tune)
}

// startLogServerWith is startLogServer with cfg (NodeID, Gatherer and Notifier are filled in).
func startLogServerWith(t *testing.T, pool *pgxpool.Pool, cfg Config, withNotifier bool, tune func(*Server)) *logTestServer {
	t.Helper()
	logger := queuetest.TestLogger(t)
	var n *notify.Notifier
	if withNotifier {
		n = notify.New(notify.Config{}, pool, logger, nil)
		if err := n.Start(context.Background()); err != nil {
			t.Fatalf("start notifier: %v", err)
		}
		t.Cleanup(n.Stop)
		waittest.For(t, eventWait, n.Connected, "notifier connected")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.NodeID, cfg.Gatherer, cfg.Notifier = "web-1", prometheus.NewRegistry(), n
	s := NewServer(cfg, pool, ln, logger)
	if tune != nil {
		tune(s)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatalf("start server: %v", err)
	}
	t.Cleanup(s.Stop)
	return &logTestServer{Server: s, url: "http://" + ln.Addr().String()}
}

// readCounter counts the hub's reads by job id.
type readCounter struct {
	mu sync.Mutex
	n  map[int64]int
}

// countReads makes s's hub count its reads; call it from a tune func, before Start.
func countReads(s *Server) *readCounter {
	c := &readCounter{n: map[int64]int{}}
	read := s.logs.readFunc
	s.logs.readFunc = func(ctx context.Context, id int64) (buildLogState, error) {
		c.mu.Lock()
		c.n[id]++
		c.mu.Unlock()
		return read(ctx, id)
	}
	return c
}

func (c *readCounter) of(id int64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

// waitSubscribed opens a stream of job warm and waits until the hub's subscription is in place:
// its registration read and the subscription's catch-up read (Resync) have both started.
// After it, a stream that registers is read on registration and on news only.
func waitSubscribed(t *testing.T, srv *logTestServer, reads *readCounter, pool *pgxpool.Pool) {
	t.Helper()
	warm := newJob(t, pool, "warm")
	startBuilding(t, pool, warm)
	openStream(t, srv, warm, "")
	waittest.For(t, eventWait, func() bool { return reads.of(warm) >= 2 }, "the hub's subscription to be in place")
}

// newJob enqueues the fixture derivation called name and returns its job id.
func newJob(t *testing.T, pool *pgxpool.Pool, name string) int64 {
	t.Helper()
	queuetest.Enqueue(t, pool, nil, queuetest.Drv(name, "x86_64-linux"))
	return queuetest.Job(t, pool, name).ID
}

// startBuilding claims job id for a builder, as a claim does.
func startBuilding(t *testing.T, pool *pgxpool.Pool, id int64) {
	t.Helper()
	queuetest.Exec(t, pool, `
UPDATE build_jobs SET status = 'building', claimed_by = 'builder-1', claimed_at = now(),
    started_at = now(), attempt = attempt + 1
WHERE id = $1`, id)
}

// writeTail publishes job id's tail exactly as a builder's TailWriter does.
func writeTail(t *testing.T, pool *pgxpool.Pool, id int64, tail string) {
	t.Helper()
	queuetest.Exec(t, pool, `
INSERT INTO build_log_tails (build_job_id, log_tail, log_seq) VALUES ($1, $2, 1)
ON CONFLICT (build_job_id) DO UPDATE
SET log_tail = EXCLUDED.log_tail, log_seq = build_log_tails.log_seq + 1`, id, []byte(tail))
}

// writeTailSilently writes the tail with triggers off, as if its notification were lost.
func writeTailSilently(t *testing.T, pool *pgxpool.Pool, id int64, tail string) {
	t.Helper()
	ctx := queuetest.Ctx(t, eventWait)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, sql := range []string{
		`SET LOCAL session_replication_role = replica`,
		`UPDATE build_log_tails SET log_tail = $2, log_seq = log_seq + 1 WHERE build_job_id = $1`,
	} {
		var args []any
		if strings.Contains(sql, "$1") {
			args = []any{id, []byte(tail)}
		}
		if _, err := tx.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// finishJob records job id's result and then deletes its tail, in the builder's order.
func finishJob(t *testing.T, pool *pgxpool.Pool, id int64, st status.JobStatus, logURL, errMsg *string) {
	t.Helper()
	queuetest.Exec(t, pool, `
UPDATE build_jobs SET status = $2, log_url = $3, error_message = $4, finished_at = now()
WHERE id = $1`, id, st, logURL, errMsg)
	queuetest.Exec(t, pool, `DELETE FROM build_log_tails WHERE build_job_id = $1`, id)
}

func ptr(s string) *string { return &s }

func logKey(name string) string { return "log/" + path.Base(queuetest.DrvPath(name)) }

// noRedirects lets a test see a redirect itself.
var noRedirects = &http.Client{
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	Timeout:       eventWait,
}

// sseItem is an event, or a comment line (Comment set, nothing else).
type sseItem struct {
	ID, Event, Data string
	Comment         string
}

// sseClient reads one event stream.
type sseClient struct {
	t      *testing.T
	items  chan sseItem // closed when the stream ends
	cancel context.CancelFunc
}

// openStream opens GET /api/builds/{id}/log, checks it is an event stream and reads it in the
// background until the test ends.
func openStream(t *testing.T, srv *logTestServer, id int64, lastEventID string) *sseClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/api/builds/%d/log", srv.url, id), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("open stream of build %d: %v", id, err)
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		t.Fatalf("open stream of build %d: %s %s", id, resp.Status, body)
	}
	for k, want := range map[string]string{"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"} {
		if got := resp.Header.Get(k); got != want {
			t.Errorf("stream of build %d: %s = %q, want %q", id, k, got, want)
		}
	}
	c := &sseClient{t: t, items: make(chan sseItem, 1000), cancel: cancel}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(c.items)
		defer resp.Body.Close()
		readSSE(resp.Body, c.items)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

// readSSE parses the subset of the event-stream format the server writes (LF line ends).
func readSSE(r io.Reader, out chan<- sseItem) {
	br := bufio.NewReader(r)
	var ev sseItem
	var data []string
	seen := false
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return // a partial line at EOF is discarded, as the spec says
		}
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			if seen {
				ev.Data = strings.Join(data, "\n")
				out <- ev
			}
			ev, data, seen = sseItem{}, nil, false
			continue
		}
		if c, ok := strings.CutPrefix(line, ":"); ok {
			out <- sseItem{Comment: strings.TrimPrefix(c, " ")}
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		seen = true
		switch field {
		case "id":
			ev.ID = value
		case "event":
			ev.Event = value
		case "data":
			data = append(data, value)
		}
	}
}

// next is the next event, skipping comments.
func (c *sseClient) next() sseItem {
	c.t.Helper()
	deadline := time.After(eventWait) // one deadline: keep-alives must not extend it
	for {
		if it := c.nextItem(deadline); it.Comment == "" {
			return it
		}
	}
}

// nextItem is the next event or comment.
func (c *sseClient) nextItem(deadline <-chan time.Time) sseItem {
	c.t.Helper()
	select {
	case it, ok := <-c.items:
		if !ok {
			c.t.Fatalf("stream ended; wanted another event")
		}
		return it
	case <-deadline:
		c.t.Fatalf("no event within %s", eventWait)
	}
	return sseItem{}
}

// expectTail reads the next event and checks it is tail seq with data.
func (c *sseClient) expectTail(seq, data string) {
	c.t.Helper()
	ev := c.next()
	if ev.Event != "tail" || ev.ID != seq || ev.Data != data {
		c.t.Fatalf("got event %+v, want tail id %s data %q", ev, seq, data)
	}
}

// expectEnd waits for the stream to end, and fails on any event before.
func (c *sseClient) expectEnd(within time.Duration) {
	c.t.Helper()
	deadline := time.After(within)
	for {
		select {
		case it, ok := <-c.items:
			if !ok {
				return
			}
			if it.Comment == "" {
				c.t.Fatalf("got event %+v, want the stream to end", it)
			}
		case <-deadline:
			c.t.Fatalf("stream still open after %s", within)
		}
	}
}

// expectQuiet checks that no event arrives (comments may) and the stream stays open for d.
func (c *sseClient) expectQuiet(d time.Duration) {
	c.t.Helper()
	waittest.Hold(c.t, d, func() {
		for {
			select {
			case it, ok := <-c.items:
				if !ok {
					c.t.Fatalf("stream ended; want it open and quiet")
				}
				if it.Comment == "" {
					c.t.Fatalf("got event %+v, want none", it)
				}
			default:
				return
			}
		}
	})
}

// expectComment waits for the next item and checks it is a comment: the stream's first check
// after connecting (or waking) has run and sent nothing.
func (c *sseClient) expectComment() {
	c.t.Helper()
	if it := c.nextItem(time.After(eventWait)); it.Comment == "" {
		c.t.Fatalf("got event %+v, want a keep-alive comment first", it)
	}
}

func TestBuildLogRequests(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	srv := startLogServer(t, pool, true, nil)

	ids := map[string]int64{}
	for _, name := range []string{"done-log", "failed-nolog", "cancelled-badlog", "depfailed", "odd-log", "cancelled-nolog"} {
		ids[name] = newJob(t, pool, name)
	}
	set := func(name string, st status.JobStatus, logURL *string) {
		queuetest.Exec(t, pool, `UPDATE build_jobs SET status = $2, log_url = $3 WHERE id = $1`, ids[name], st, logURL)
	}
	set("done-log", status.JobSucceeded, ptr(logKey("done-log")))
	set("failed-nolog", status.JobFailed, nil)
	set("cancelled-badlog", status.JobCancelled, ptr("log/../../etc/passwd"))
	set("depfailed", status.JobDepFailed, ptr("blobs/x"))
	set("odd-log", status.JobFailed, ptr("log/abc-what?x=1.drv"))
	set("cancelled-nolog", status.JobCancelled, ptr("log//x.drv"))
	unknown := ids["done-log"] + 1000

	for _, tc := range []struct {
		name     string
		id       string
		code     int
		location string
		err      string // want this JSON error message (400: substring)
	}{
		{name: "letters", id: "abc", code: 400, err: `"abc"`},
		{name: "zero", id: "0", code: 400, err: `"0"`},
		{name: "negative", id: "-1", code: 400, err: `"-1"`},
		{name: "plus sign", id: "+1", code: 400, err: `"+1"`},
		{name: "overflow", id: "99999999999999999999999", code: 400, err: `"99999999999999999999999"`},
		{name: "unknown", id: fmt.Sprint(unknown), code: 404, err: fmt.Sprintf("build %d not found", unknown)},
		{name: "finished with log", id: fmt.Sprint(ids["done-log"]), code: 302, location: "/" + logKey("done-log")},
		{name: "finished log name escaped", id: fmt.Sprint(ids["odd-log"]), code: 302, location: "/log/abc-what%3Fx=1.drv"},
		{name: "failed without log", id: fmt.Sprint(ids["failed-nolog"]), code: 404, err: fmt.Sprintf("build %d has no log", ids["failed-nolog"])},
		{name: "log_url escapes", id: fmt.Sprint(ids["cancelled-badlog"]), code: 404, err: fmt.Sprintf("build %d has no log", ids["cancelled-badlog"])},
		{name: "log_url not a log", id: fmt.Sprint(ids["depfailed"]), code: 404, err: fmt.Sprintf("build %d has no log", ids["depfailed"])},
		{name: "log_url double slash", id: fmt.Sprint(ids["cancelled-nolog"]), code: 404, err: fmt.Sprintf("build %d has no log", ids["cancelled-nolog"])},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := noRedirects.Get(srv.url + "/api/builds/" + tc.id + "/log")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.code {
				t.Fatalf("status %d, want %d; body %s", resp.StatusCode, tc.code, body)
			}
			if tc.location != "" {
				if got := resp.Header.Get("Location"); got != tc.location {
					t.Errorf("Location %q, want %q", got, tc.location)
				}
				return
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q, want application/json", ct)
			}
			var e struct{ Error string }
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("body %s: %v", body, err)
			}
			if tc.code == 400 && !strings.Contains(e.Error, tc.err) || tc.code != 400 && e.Error != tc.err {
				t.Errorf("error %q, want %q", e.Error, tc.err)
			}
		})
	}
}

func TestBuildLogWithoutNotifier(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	srv := startLogServer(t, pool, false, nil)
	running, done := newJob(t, pool, "running"), newJob(t, pool, "done")
	startBuilding(t, pool, running)
	queuetest.Exec(t, pool, `UPDATE build_jobs SET status = 'succeeded', log_url = $2 WHERE id = $1`, done, logKey("done"))

	resp, err := noRedirects.Get(fmt.Sprintf("%s/api/builds/%d/log", srv.url, running))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"live logs unavailable"`) {
		t.Errorf("running build: %s %s, want 503 live logs unavailable", resp.Status, body)
	}

	resp, err = noRedirects.Get(fmt.Sprintf("%s/api/builds/%d/log", srv.url, done))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "/"+logKey("done") {
		t.Errorf("finished build: %s Location %q, want 302 to /%s", resp.Status, resp.Header.Get("Location"), logKey("done"))
	}
}

func TestBuildLogStream(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	// A short keep-alive marks the end of a stream's first check: its comment comes after it.
	srv := startLogServer(t, pool, true, func(s *Server) { s.logs.keepAlive = 50 * time.Millisecond })
	id := newJob(t, pool, "hello")
	startBuilding(t, pool, id)

	// HEAD answers at once instead of streaming until the build ends.
	resp, err := noRedirects.Head(fmt.Sprintf("%s/api/builds/%d/log", srv.url, id))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Errorf("HEAD: %s %q, want 200 text/event-stream", resp.Status, resp.Header.Get("Content-Type"))
	}

	a := openStream(t, srv, id, "")
	a.expectComment() // no tail yet: nothing to send
	writeTail(t, pool, id, "line1\nline2\n")
	a.expectTail("1", "line1\nline2")
	writeTail(t, pool, id, "line2\nline3\n")
	a.expectTail("2", "line2\nline3")

	// A client that reconnects with the tail it has gets nothing until there is news.
	b := openStream(t, srv, id, "2")
	b.expectComment()
	b.expectQuiet(200 * time.Millisecond)
	// One that has an older tail, or none it can name, gets the current one at once.
	c := openStream(t, srv, id, "1")
	c.expectTail("2", "line2\nline3")
	d := openStream(t, srv, id, "junk")
	d.expectTail("2", "line2\nline3")

	writeTail(t, pool, id, "line3\nline4\n")
	for _, cl := range []*sseClient{a, b, c, d} {
		cl.expectTail("3", "line3\nline4")
	}

	// A transient failure requeues the job; its next attempt starts a new tail at 1.
	queuetest.Exec(t, pool, `DELETE FROM build_log_tails WHERE build_job_id = $1`, id)
	queuetest.Exec(t, pool, `UPDATE build_jobs SET status = 'pending', claimed_by = NULL WHERE id = $1`, id)
	a.expectQuiet(100 * time.Millisecond)
	startBuilding(t, pool, id)
	writeTail(t, pool, id, "attempt 2\n")
	a.expectTail("1", "attempt 2")
}

func TestBuildLogEnd(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name           string
		status         status.JobStatus
		logURL, errMsg *string
		want           string
	}{
		{name: "succeeded", status: status.JobSucceeded, logURL: ptr(logKey("end")),
			want: `{"status":"succeeded","log_url":"/` + logKey("end") + `"}`},
		{name: "failed with reason", status: status.JobFailed, errMsg: ptr("build timed out after 4h0m0s\nsecond line"),
			want: `{"status":"failed","error":"build timed out after 4h0m0s\nsecond line"}`},
		{name: "cancelled", status: status.JobCancelled, want: `{"status":"cancelled"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := dbtest.NewPool(t)
			// No fallback re-read within the test: only the DELETE's notification can end it.
			srv := startLogServer(t, pool, true, func(s *Server) { s.logs.recheck = time.Hour })
			id := newJob(t, pool, "end")
			startBuilding(t, pool, id)
			s := openStream(t, srv, id, "")
			writeTail(t, pool, id, "building\n")
			s.expectTail("1", "building")

			start := time.Now()
			finishJob(t, pool, id, tc.status, tc.logURL, tc.errMsg)
			ev := s.next()
			if ev.Event != "end" || ev.Data != tc.want || ev.ID != "" {
				t.Fatalf("got %+v, want end event with data %s", ev, tc.want)
			}
			s.expectEnd(5 * time.Second)
			t.Logf("stream ended %s after the tail was deleted", time.Since(start))
		})
	}
}

func TestBuildLogFallbackRecheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		recheck time.Duration
		arrives bool
	}{
		// Proves the silent write really is silent: without the fallback nothing comes.
		{name: "no fallback", recheck: time.Hour, arrives: false},
		{name: "fallback", recheck: 100 * time.Millisecond, arrives: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := dbtest.NewPool(t)
			var reads *readCounter
			srv := startLogServer(t, pool, true, func(s *Server) {
				s.logs.recheck = tc.recheck
				s.logs.keepAlive = 50 * time.Millisecond
				reads = countReads(s)
			})
			id := newJob(t, pool, "lost")
			startBuilding(t, pool, id)
			writeTail(t, pool, id, "first\n")

			// The subscription's catch-up (Resync) re-reads every job once; let it pass before
			// the stream under test registers, so only the fallback can re-read it.
			waitSubscribed(t, srv, reads, pool)

			s := openStream(t, srv, id, "")
			s.expectTail("1", "first")
			s.expectComment() // the stream is idle, waiting
			writeTailSilently(t, pool, id, "second\n")
			if !tc.arrives {
				s.expectQuiet(500 * time.Millisecond)
				return
			}
			s.expectTail("2", "second")
		})
	}
}

func TestBuildLogOneListenForManyClients(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	srv := startLogServer(t, pool, true, nil)
	const jobs, perJob = 5, 4
	ids := make([]int64, jobs)
	for j := range ids {
		ids[j] = newJob(t, pool, fmt.Sprintf("many-%d", j))
		startBuilding(t, pool, ids[j])
	}

	// Opened one after the other (a failed open must fail the test goroutine), open together.
	clients := make([][]*sseClient, jobs)
	for j := range jobs {
		for range perJob {
			clients[j] = append(clients[j], openStream(t, srv, ids[j], ""))
		}
	}
	for j, id := range ids {
		writeTail(t, pool, id, fmt.Sprintf("job %d\n", j))
	}
	for j := range jobs {
		for _, c := range clients[j] {
			c.expectTail("1", fmt.Sprintf("job %d", j))
		}
	}

	listens := queuetest.QueryInt(t, pool, `
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = 'harmonia-ci listen'`)
	if listens != 1 {
		t.Errorf("%d LISTEN sessions for %d clients, want 1", listens, jobs*perJob)
	}
	srv.logs.mu.Lock()
	count := srv.logs.count
	srv.logs.mu.Unlock()
	if count != jobs*perJob {
		t.Errorf("hub counts %d streams, want %d", count, jobs*perJob)
	}

	for _, cs := range clients {
		for _, c := range cs {
			c.cancel()
		}
	}
	waittest.For(t, eventWait, func() bool {
		srv.logs.mu.Lock()
		defer srv.logs.mu.Unlock()
		return srv.logs.count == 0 && len(srv.logs.jobs) == 0
	}, "every stream to unregister from the hub")
}

// A stream lives far longer than the server's ReadTimeout (net/http clears the read deadline
// once a body-less request is read; this keeps it so).
func TestBuildLogStreamOutlivesReadTimeout(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	srv := startLogServer(t, pool, true, func(s *Server) { s.srv.ReadTimeout = 100 * time.Millisecond })
	id := newJob(t, pool, "long")
	startBuilding(t, pool, id)
	s := openStream(t, srv, id, "")
	s.expectQuiet(500 * time.Millisecond)
	writeTail(t, pool, id, "still here\n")
	s.expectTail("1", "still here")
}

func TestBuildLogStopEndsStreams(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	srv := startLogServer(t, pool, true, nil)
	id := newJob(t, pool, "stop")
	startBuilding(t, pool, id)
	s := openStream(t, srv, id, "")
	writeTail(t, pool, id, "x\n")
	s.expectTail("1", "x")

	start := time.Now()
	srv.Stop()
	// Shutdown would otherwise wait its whole 5s grace period for the stream.
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Stop took %s with a stream open", d)
	}
	s.expectEnd(eventWait)
}

func TestWriteTailEvent(t *testing.T) {
	for _, tc := range []struct {
		name, tail, want string
	}{
		{"lines", "a\nb\n", "id: 7\nevent: tail\ndata: a\ndata: b\n\n"},
		{"no final newline", "a\nb", "id: 7\nevent: tail\ndata: a\ndata: b\n\n"},
		{"empty", "", "id: 7\nevent: tail\ndata: \n\n"},
		{"blank lines kept", "a\n\n b\n", "id: 7\nevent: tail\ndata: a\ndata: \ndata:  b\n\n"},
		{"crlf", "a\r\nb\r\n", "id: 7\nevent: tail\ndata: a\ndata: b\n\n"},
		{"progress redraws", "get 10%\rget 50%\rget 100%\r\ndone\n", "id: 7\nevent: tail\ndata: get 100%\ndata: done\n\n"},
		{"bare cr at end", "x\r", "id: 7\nevent: tail\ndata: x\n\n"},
		{"invalid utf-8", "ok \xff\xfe end\n", "id: 7\nevent: tail\ndata: ok \uFFFD end\n\n"},
		{"cut multibyte start", "\xa9t\n", "id: 7\nevent: tail\ndata: \uFFFDt\n\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			writeTailEvent(&b, 7, []byte(tc.tail))
			if b.String() != tc.want {
				t.Errorf("got %q, want %q", b.String(), tc.want)
			}
		})
	}
}

// Streams of one job share the hub's reads: one read per change, whatever the number of
// streams, and none for a change to another job.
func TestBuildLogOneReadPerChange(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	var reads *readCounter
	srv := startLogServer(t, pool, true, func(s *Server) {
		s.logs.recheck = time.Hour // only notifications read
		s.logs.keepAlive = 50 * time.Millisecond
		reads = countReads(s)
	})
	waitSubscribed(t, srv, reads, pool)
	id, other := newJob(t, pool, "shared"), newJob(t, pool, "other")
	startBuilding(t, pool, id)
	startBuilding(t, pool, other)
	const streams, changes = 6, 3
	var clients []*sseClient
	for range streams {
		c := openStream(t, srv, id, "")
		c.expectComment() // its first state (no tail yet) is handled
		clients = append(clients, c)
	}
	otherClient := openStream(t, srv, other, "")
	otherClient.expectComment()
	base := reads.of(id)

	for i := 1; i <= changes; i++ {
		writeTail(t, pool, id, fmt.Sprintf("change %d\n", i))
		writeTail(t, pool, other, fmt.Sprintf("other %d\n", i))
		for _, c := range clients {
			c.expectTail(fmt.Sprint(i), fmt.Sprintf("change %d", i))
		}
		otherClient.expectTail(fmt.Sprint(i), fmt.Sprintf("other %d", i))
	}
	if got := reads.of(id) - base; got != changes {
		t.Errorf("%d reads of the job for %d changes watched by %d streams, want %d", got, changes, streams, changes)
	}

	// The end event reaches every stream from one read too.
	base = reads.of(id)
	finishJob(t, pool, id, status.JobSucceeded, ptr(logKey("shared")), nil)
	for _, c := range clients {
		if ev := c.next(); ev.Event != "end" {
			t.Fatalf("got %+v, want the end event", ev)
		}
		c.expectEnd(eventWait)
	}
	// Two notifications (the status, then the tail's delete) may cost one read each.
	if got := reads.of(id) - base; got < 1 || got > 2 {
		t.Errorf("%d reads of the job for its end, want 1 or 2", got)
	}
}

func TestBuildLogStreamCap(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	const limit = 3
	srv := startLogServerWith(t, pool, Config{MaxLogStreams: limit}, true, nil)
	ids := make([]int64, limit+1)
	for i := range ids {
		ids[i] = newJob(t, pool, fmt.Sprintf("cap-%d", i))
		startBuilding(t, pool, ids[i])
	}
	done := newJob(t, pool, "cap-done")
	queuetest.Exec(t, pool, `UPDATE build_jobs SET status = 'succeeded', log_url = $2 WHERE id = $1`, done, logKey("cap-done"))

	var open []*sseClient
	for _, id := range ids[:limit] {
		open = append(open, openStream(t, srv, id, ""))
	}
	get := func(method string, id int64) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(method, fmt.Sprintf("%s/api/builds/%d/log", srv.url, id), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := noRedirects.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(body)
	}
	resp, body := get(http.MethodGet, ids[limit])
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, `"too many live log streams"`) || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("stream %d past the cap of %d: %s Retry-After %q %s, want 503 too many live log streams with Retry-After",
			limit+1, limit, resp.Status, resp.Header.Get("Retry-After"), body)
	}
	// What is not a stream is not refused.
	if resp, _ := get(http.MethodGet, done); resp.StatusCode != http.StatusFound {
		t.Errorf("finished build at the cap: %s, want 302", resp.Status)
	}
	if resp, _ := get(http.MethodHead, ids[limit]); resp.StatusCode != http.StatusOK {
		t.Errorf("HEAD at the cap: %s, want 200", resp.Status)
	}

	open[0].cancel()
	waittest.For(t, eventWait, func() bool {
		srv.logs.mu.Lock()
		defer srv.logs.mu.Unlock()
		return srv.logs.count == limit-1
	}, "the closed stream to free its slot")
	s := openStream(t, srv, ids[limit], "")
	writeTail(t, pool, ids[limit], "admitted\n")
	s.expectTail("1", "admitted")
}

// TestBuildLogFinishedToEventSource: an EventSource that connects after its build ended (the
// page showed it running a moment before) gets an event stream with the "end" event, which
// makes the page reload, instead of a redirect to a text log that EventSource rejects; a plain
// client still gets the redirect.
func TestBuildLogFinishedToEventSource(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	srv := startLogServer(t, pool, true, nil)
	id := newJob(t, pool, "ended")
	queuetest.Exec(t, pool, `UPDATE build_jobs SET status = 'failed', error_message = 'boom', log_url = $2 WHERE id = $1`,
		id, logKey("ended"))

	for _, tc := range []struct {
		name, accept string
		stream       bool
	}{
		{"EventSource", "text/event-stream", true},
		{"with parameters and others", "text/html, Text/Event-Stream;q=0.9", true},
		{"plain client", "", false},
		{"text only", "text/plain", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/api/builds/%d/log", srv.url, id), nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.accept != "" {
				req.Header.Set("Accept", tc.accept)
			}
			resp, err := noRedirects.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if !tc.stream {
				if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "/"+logKey("ended") {
					t.Fatalf("%d %q, want a redirect to the log", resp.StatusCode, resp.Header.Get("Location"))
				}
				return
			}
			want := `event: end` + "\n" + `data: {"status":"failed","log_url":"/` + logKey("ended") + `","error":"boom"}` + "\n\n"
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" || string(body) != want {
				t.Fatalf("%d %q %q, want 200 text/event-stream %q", resp.StatusCode, resp.Header.Get("Content-Type"), body, want)
			}
		})
	}
}

// A node that holds the blob store serves a finished build's log itself, as text or, to a
// client that takes it, still compressed; the route's own check decides who may read it, not
// the cache's (which answers a private project's log only to cache and node tokens).
func TestBuildLogServedFromStore(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	store, err := blob.NewLocal(t.TempDir(), "", []byte("a secret of sixteen bytes or more"))
	if err != nil {
		t.Fatal(err)
	}
	const text = "building\nfailing on purpose\n"
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	compressed := enc.EncodeAll([]byte(text), nil)
	if err := store.Put(context.Background(), logKey("kept"), bytes.NewReader(compressed), int64(len(compressed)), blob.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	srv := startLogServer(t, pool, false, func(s *Server) { s.ServeLogsFrom(store) })
	kept, gone := newJob(t, pool, "kept"), newJob(t, pool, "gone")
	for id, key := range map[int64]string{kept: logKey("kept"), gone: logKey("gone")} {
		queuetest.Exec(t, pool, `UPDATE build_jobs SET status = 'failed', log_url = $2 WHERE id = $1`, id, key)
	}
	for _, tc := range []struct {
		name, encoding string
		id             int64
		code           int
		body           string
	}{
		{"text", "", kept, http.StatusOK, text},
		{"compressed", "gzip, zstd", kept, http.StatusOK, string(compressed)},
		{"gone from the store", "", gone, http.StatusNotFound, fmt.Sprintf(`"build %d has no log"`, gone)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/api/builds/%d/log", srv.url, tc.id), nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.encoding != "" {
				req.Header.Set("Accept-Encoding", tc.encoding)
			}
			resp, err := noRedirects.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.code || !strings.Contains(string(body), tc.body) {
				t.Errorf("%s: %q, want %d with %q", resp.Status, body, tc.code, tc.body)
			}
			if got, want := resp.Header.Get("Content-Encoding"), map[bool]string{true: "zstd"}[tc.encoding != "" && tc.code == http.StatusOK]; got != want {
				t.Errorf("Content-Encoding %q, want %q", got, want)
			}
		})
	}
}
