package web

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/klauspost/compress/zstd"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// buildLogChannel is the NOTIFY channel of build_log_tails; the payload is the job id.
const buildLogChannel = "build_log"

const (
	// DefaultMaxLogStreams is Config.MaxLogStreams's default.
	DefaultMaxLogStreams = 1000
	// logStreamsRetryAfter is the Retry-After of a stream refused for the cap, in seconds.
	logStreamsRetryAfter = "10"
	// defaultLogRecheck re-reads every watched build even without a notification, so a lost one
	// (NOTIFY is at most once) delays a stream but never wedges it.
	defaultLogRecheck = 15 * time.Second
	// defaultLogKeepAlive: an idle stream sends a comment this often, so proxies and load
	// balancers do not time it out.
	defaultLogKeepAlive = 15 * time.Second
	// logQueryTimeout bounds one read of a build (pool acquire included).
	logQueryTimeout = 5 * time.Second
	// logWriteTimeout bounds one write to a stream: a client that stops reading is dropped
	// instead of holding the handler forever.
	logWriteTimeout = 30 * time.Second
)

var (
	errHubStopped     = errors.New("live log hub stopped")
	errTooManyStreams = errors.New("too many live log streams")
)

// logHub fans the process's single build_log subscription out to the live log streams, by job
// id. It subscribes while at least one stream is open and unsubscribes when the last one ends,
// so a node nobody watches logs through does not receive every build's notifications.
//
// A change is read once per job, not once per stream: a notification, the subscription's
// catch-up (Resync) or the fallback recheck asks for a read of the job, and its result goes to
// every stream of that job. A request that comes while the job's read runs is served by one more
// read after it, so N streams and M notifications during one read still cost two reads.
type logHub struct {
	notifier *notify.Notifier
	logger   *slog.Logger
	// readFunc reads one build; Server.readBuildLog.
	readFunc func(ctx context.Context, id int64) (buildLogState, error)
	// max caps the streams open at once; <= 0: no cap.
	max int
	// recheck and keepAlive are the fallback re-read and the streams' keep-alive periods (tests
	// shorten them before Start).
	recheck, keepAlive time.Duration

	// ctx bounds the reads; cancelled when the hub stops.
	ctx    context.Context
	cancel context.CancelFunc
	reads  sync.WaitGroup
	// changed (1-buffered) wakes the loop when the number of streams crossed zero.
	changed chan struct{}
	// quit is closed when the hub stops: streams end, new ones are refused.
	quit chan struct{}

	mu      sync.Mutex
	stopped bool
	jobs    map[int64]*jobStreams
	count   int    // streams open
	gen     uint64 // reads started so far
}

// jobStreams is the streams of one job and the state of its read.
type jobStreams struct {
	streams map[*logStream]struct{}
	reading bool // a read runs
	again   bool // another read is wanted once it ends
}

// logStream is one open stream's registration.
type logStream struct {
	id int64
	// since is the hub's gen at registration: a read started before says nothing about changes
	// the stream's client has not seen, so it is not delivered to it.
	since uint64
	// c (1-buffered) holds the newest read not yet taken; an older one is replaced.
	c chan logRead
}

// logRead is the result of one read of a build.
type logRead struct {
	st  buildLogState
	err error
}

func newLogHub(n *notify.Notifier, readFunc func(context.Context, int64) (buildLogState, error), maxStreams int, logger *slog.Logger) *logHub {
	ctx, cancel := context.WithCancel(context.Background())
	return &logHub{
		notifier: n, logger: logger, readFunc: readFunc, max: maxStreams,
		recheck: defaultLogRecheck, keepAlive: defaultLogKeepAlive,
		ctx: ctx, cancel: cancel,
		changed: make(chan struct{}, 1), quit: make(chan struct{}),
		jobs: make(map[int64]*jobStreams),
	}
}

// watch registers a stream of job id and asks for a read of the job, whose result is the
// stream's first state. It fails with errTooManyStreams past the cap.
func (h *logHub) watch(id int64) (*logStream, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return nil, errHubStopped
	}
	if h.max > 0 && h.count >= h.max {
		return nil, errTooManyStreams
	}
	js := h.jobs[id]
	if js == nil {
		js = &jobStreams{streams: make(map[*logStream]struct{})}
		h.jobs[id] = js
	}
	s := &logStream{id: id, since: h.gen, c: make(chan logRead, 1)}
	js.streams[s] = struct{}{}
	h.count++
	if h.count == 1 {
		poke(h.changed)
	}
	h.refreshLocked(id, js)
	return s, nil
}

func (h *logHub) unwatch(s *logStream) {
	h.mu.Lock()
	defer h.mu.Unlock()
	js := h.jobs[s.id]
	if js == nil {
		return
	}
	if _, ok := js.streams[s]; !ok {
		return
	}
	delete(js.streams, s)
	if len(js.streams) == 0 {
		delete(h.jobs, s.id) // a running read finds its jobStreams gone and stops
	}
	h.count--
	if h.count == 0 {
		poke(h.changed)
	}
}

// refreshLocked starts a read of job id, or, if one runs, asks for another after it.
func (h *logHub) refreshLocked(id int64, js *jobStreams) {
	if h.stopped {
		return
	}
	if js.reading {
		js.again = true
		return
	}
	js.reading = true
	h.gen++
	h.reads.Add(1)
	go h.read(id, js, h.gen)
}

// refreshAllLocked asks for a read of every watched job.
func (h *logHub) refreshAllLocked() {
	for id, js := range h.jobs {
		h.refreshLocked(id, js)
	}
}

// read reads job id and hands the result to its streams, again while more reads were asked for.
func (h *logHub) read(id int64, js *jobStreams, gen uint64) {
	defer h.reads.Done()
	for {
		st, err := h.readFunc(h.ctx, id)
		h.mu.Lock()
		if h.jobs[id] != js || h.ctx.Err() != nil {
			// Every stream of the job left (a new one has its own read), or the hub stops and
			// its streams end without an error of its making.
			js.reading = false
			h.mu.Unlock()
			return
		}
		for s := range js.streams {
			if s.since < gen {
				s.deliver(logRead{st: st, err: err})
			}
		}
		if !js.again || h.stopped {
			js.reading = false
			h.mu.Unlock()
			return
		}
		js.again = false
		h.gen++
		gen = h.gen
		h.mu.Unlock()
	}
}

// deliver replaces the stream's pending read with r. Only the hub sends, under its lock.
func (s *logStream) deliver(r logRead) {
	select {
	case <-s.c:
	default:
	}
	select {
	case s.c <- r:
	default:
	}
}

// run owns the subscription and the fallback recheck until ctx ends, then stops the reads and
// closes quit. A hub runs once: a server is not restarted after Stop (its http.Server cannot be).
func (h *logHub) run(ctx context.Context) {
	h.mu.Lock()
	stopped := h.stopped
	h.mu.Unlock()
	if stopped {
		return
	}
	var sub *notify.Sub
	defer func() {
		if sub != nil {
			sub.Close()
		}
		h.mu.Lock()
		h.stopped = true
		h.mu.Unlock()
		h.cancel()
		h.reads.Wait()
		close(h.quit)
	}()
	recheck := time.NewTicker(h.recheck)
	defer recheck.Stop()
	for {
		var notes <-chan notify.Notification
		var resync <-chan struct{}
		if sub != nil {
			notes, resync = sub.C, sub.Resync
		}
		select {
		case <-ctx.Done():
			return
		case <-h.changed:
			h.mu.Lock()
			want := h.count > 0
			h.mu.Unlock()
			switch {
			case want && sub == nil:
				// A stream that registered before the LISTEN is in place is covered by the
				// Resync every new subscription gets once it is.
				s, err := h.notifier.Subscribe(buildLogChannel)
				if err != nil {
					h.logger.Error("cannot subscribe to live build logs; streams fall back to polling", "error", err)
					continue
				}
				sub = s
			case !want && sub != nil:
				sub.Close()
				sub = nil
			}
		case n := <-notes:
			id, err := strconv.ParseInt(n.Payload, 10, 64)
			if err != nil {
				h.logger.Debug("ignoring malformed build_log notification", "payload", n.Payload)
				continue
			}
			h.mu.Lock()
			if js := h.jobs[id]; js != nil {
				h.refreshLocked(id, js)
			}
			h.mu.Unlock()
		case <-resync:
			// Notifications may have been lost: every job is read again.
			h.mu.Lock()
			h.refreshAllLocked()
			h.mu.Unlock()
		case <-recheck.C:
			h.mu.Lock()
			h.refreshAllLocked()
			h.mu.Unlock()
		}
	}
}

// poke sends to a 1-buffered channel without blocking: one pending wake-up is enough.
func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// buildLogState is one read of a build and its live tail.
type buildLogState struct {
	status       status.JobStatus
	logURL       *string
	errorMessage *string
	tail         []byte
	seq          *int64 // nil: no tail row
}

// readBuildLog reads build id and its tail within logQueryTimeout.
func (s *Server) readBuildLog(ctx context.Context, id int64) (buildLogState, error) {
	ctx, cancel := context.WithTimeout(ctx, logQueryTimeout)
	defer cancel()
	var st buildLogState
	err := s.pool.QueryRow(ctx, sqlBuildLogState, id).Scan(&st.status, &st.logURL, &st.errorMessage, &st.tail, &st.seq)
	if err != nil {
		return st, fmt.Errorf("read log tail of build %d: %w", id, err)
	}
	return st, nil
}

// parseDigits parses a non-negative decimal int64 made of ASCII digits only (no sign, no
// underscores).
func parseDigits(s string) (int64, bool) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// handleBuildLog is GET /api/builds/{id}/log: a finished build's log (from this node's store,
// else by redirect to the cache; to an EventSource, just the "end" event), a running one's
// live tail as Server-Sent Events.
//
// Events: "tail" carries the whole current tail (the last 64 KiB of the log), one data line per
// log line, with the tail's log_seq as event id; the client replaces its view with it. "end"
// says the build finished, with JSON data {"status", "log_url"?, "error"?}, and the stream
// closes; a client should then stop (EventSource would reconnect and get the redirect). A
// reconnecting client's Last-Event-ID suppresses a tail it already has.
func (s *Server) handleBuildLog(w http.ResponseWriter, r *http.Request) error {
	raw := r.PathValue("id")
	id, ok := parseDigits(raw)
	if !ok || id <= 0 {
		if len(raw) > 40 {
			raw = raw[:40] + "…"
		}
		return &httpapi.Error{Code: http.StatusBadRequest, Msg: fmt.Sprintf("invalid build id %q: want a positive integer", raw)}
	}
	st, err := s.readBuildLog(r.Context(), id)
	if errors.Is(err, pgx.ErrNoRows) {
		return &httpapi.Error{Code: http.StatusNotFound, Msg: fmt.Sprintf("build %d not found", id)}
	}
	if err != nil {
		return err
	}
	if !st.status.Unfinished() { // an unfinished job may still produce log output
		// An EventSource opened by a page that showed the build running, just as the build
		// ended: it gets the end of the stream (the page reloads), not a redirect to a text
		// log, which it would reject.
		if httpapi.Accepts(r, "Accept", "text/event-stream") {
			setStreamHeaders(w.Header())
			w.WriteHeader(http.StatusOK)
			var b bytes.Buffer
			writeEndEvent(&b, st)
			_, _ = w.Write(b.Bytes())
			return nil
		}
		if loc := blob.LogPath(deref(st.logURL)); loc != "" {
			if s.logStore != nil {
				return s.serveArchivedLog(w, r, id, deref(st.logURL))
			}
			http.Redirect(w, r, loc, http.StatusFound)
			return nil
		}
		return &httpapi.Error{Code: http.StatusNotFound, Msg: fmt.Sprintf("build %d has no log", id)}
	}
	if s.logs == nil {
		return &httpapi.Error{Code: http.StatusServiceUnavailable, Msg: "live logs unavailable"}
	}
	if r.Method == http.MethodHead { // would otherwise last until the build ends
		setStreamHeaders(w.Header())
		w.WriteHeader(http.StatusOK)
		return nil
	}
	// The stream's first state is the hub's first read after this registration, so no change
	// after the read above goes unannounced.
	stream, err := s.logs.watch(id)
	switch {
	case errors.Is(err, errTooManyStreams):
		return &httpapi.Error{Code: http.StatusServiceUnavailable, Msg: "too many live log streams",
			Header: http.Header{"Retry-After": {logStreamsRetryAfter}}}
	case err != nil:
		return &httpapi.Error{Code: http.StatusServiceUnavailable, Msg: "server shutting down", Err: err}
	}
	defer s.logs.unwatch(stream)
	s.streamBuildLog(w, r, stream)
	return nil
}

// ServeLogsFrom makes GET /api/builds/{id}/log serve a finished build's log from store itself
// rather than redirect to the cache's /log/ path. The route has checked that the caller may
// read the build; the cache answers a private project's log only to cache and node tokens, so
// a user's session or API token would get its 404. Call before Start.
func (s *Server) ServeLogsFrom(store blob.Store) { s.logStore = store }

// serveArchivedLog answers the archived log at key as text, still compressed to a client that
// accepts zstd (the store keeps logs so).
func (s *Server) serveArchivedLog(w http.ResponseWriter, r *http.Request, id int64, key string) error {
	rc, _, err := s.logStore.Get(r.Context(), key)
	if errors.Is(err, blob.ErrNotFound) {
		return &httpapi.Error{Code: http.StatusNotFound, Msg: fmt.Sprintf("build %d has no log", id)}
	}
	if err != nil {
		return fmt.Errorf("read the log of build %d: %w", id, err)
	}
	defer rc.Close()
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Vary", "Accept-Encoding")
	if httpapi.Accepts(r, "Accept-Encoding", "zstd") {
		h.Set("Content-Encoding", "zstd")
		_, _ = io.Copy(w, rc)
		return nil
	}
	dec, err := zstd.NewReader(rc, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(1<<30))
	if err != nil {
		return fmt.Errorf("read the log of build %d: %w", id, err)
	}
	defer dec.Close()
	_, _ = io.Copy(w, dec) // past the first byte the status is sent: a broken copy just ends the body
	return nil
}

// streamBuildLog serves the event stream from the hub's reads; errors past the headers can only
// end it.
func (s *Server) streamBuildLog(w http.ResponseWriter, r *http.Request, stream *logStream) {
	ctx := r.Context()
	rc := http.NewResponseController(w)
	defer func() { _ = rc.SetWriteDeadline(time.Time{}) }() // the connection may serve more requests

	setStreamHeaders(w.Header())
	w.WriteHeader(http.StatusOK)
	send := func(b []byte) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(logWriteTimeout))
		if _, err := w.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !send(nil) {
		return
	}

	last := int64(-1) // no tail sent or known to the client yet
	if v, ok := parseDigits(r.Header.Get("Last-Event-ID")); ok {
		last = v
	}
	logger := s.logger.With("build_id", stream.id)
	logger.Debug("live log stream opened", "remote", r.RemoteAddr, "last_event_id", last)

	// Keep-alives start after the first state is handled, so the first comment a client sees
	// says that state brought nothing to send.
	keepAlive := time.NewTimer(s.logs.keepAlive)
	keepAlive.Stop()
	defer keepAlive.Stop()
	var keepAliveC <-chan time.Time
	var buf bytes.Buffer
	revoked := access.Revoked(r)
	for {
		select {
		case <-ctx.Done():
			return
		case <-revoked:
			logger.Info("live log stream ended: the caller may no longer read the build")
			return
		case <-s.logs.quit:
			return // the client reconnects, to a node that is up
		case <-keepAliveC:
			if !send([]byte(": keep-alive\n\n")) {
				return
			}
			keepAlive.Reset(s.logs.keepAlive)
		case rd := <-stream.c:
			st, err := rd.st, rd.err
			switch {
			case ctx.Err() != nil:
				return
			case errors.Is(err, pgx.ErrNoRows):
				logger.Info("build deleted while its log was streamed")
				return
			case err != nil:
				// The client reconnects (with Last-Event-ID) and gets a fresh stream or an error.
				logger.Warn("live log stream ended", "error", err)
				return
			}
			buf.Reset()
			// Any other log_seq than the client's is news: a retried job starts a new tail at 1.
			if st.seq != nil && *st.seq != last {
				last = *st.seq
				writeTailEvent(&buf, last, st.tail)
			}
			finished := !st.status.Unfinished()
			if finished {
				writeEndEvent(&buf, st)
			}
			if buf.Len() > 0 && !send(buf.Bytes()) {
				return
			}
			if finished {
				logger.Debug("live log stream ended: build finished", "status", st.status)
				return
			}
			if keepAliveC == nil || buf.Len() > 0 {
				keepAlive.Reset(s.logs.keepAlive)
				keepAliveC = keepAlive.C
			}
		}
	}
}

func setStreamHeaders(h http.Header) {
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx must not buffer the stream
}

// writeTailEvent formats a tail event. SSE data cannot hold line breaks, so each log line is
// its own data field; the client's EventSource joins them with "\n" again.
func writeTailEvent(b *bytes.Buffer, seq int64, tail []byte) {
	fmt.Fprintf(b, "id: %d\nevent: tail\n", seq)
	text := strings.ToValidUTF8(string(tail), "\uFFFD")
	text = strings.ReplaceAll(text, "\r\n", "\n")
	text = strings.TrimSuffix(text, "\n")
	for line := range strings.SplitSeq(text, "\n") {
		b.WriteString("data: ")
		b.WriteString(overwrite(line))
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
}

// overwrite resolves carriage returns in one line as a terminal shows them (progress output
// redraws its line): what follows the last one that has something after it. A bare '\r' would
// otherwise end the SSE line and break the event's framing.
func overwrite(line string) string {
	for {
		i := strings.LastIndexByte(line, '\r')
		if i < 0 {
			return line
		}
		if i < len(line)-1 {
			return line[i+1:]
		}
		line = line[:i]
	}
}

// endEvent is the data of the "end" event.
type endEvent struct {
	Status status.JobStatus `json:"status"`
	LogURL string           `json:"log_url,omitempty"`
	Error  string           `json:"error,omitempty"`
}

func writeEndEvent(b *bytes.Buffer, st buildLogState) {
	ev := endEvent{Status: st.status, LogURL: blob.LogPath(deref(st.logURL))}
	if st.errorMessage != nil {
		ev.Error = *st.errorMessage
	}
	data, _ := json.Marshal(ev) // one line: Marshal escapes every control character
	b.WriteString("event: end\ndata: ")
	b.Write(data)
	b.WriteString("\n\n")
}

// deref is *s, or "" for nil.
func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
