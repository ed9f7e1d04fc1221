package web

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/notify"
)

// All SQL of the live build log endpoint (seed 001 "Build Log Streaming").
const (
	// $1 job id. One statement, so status and tail come from one snapshot: the builder records
	// the final status before it deletes the tail, so a finished status is never seen with a
	// tail older than the last one written.
	buildLogStateSQL = `
SELECT j.status, j.log_url, j.error_message, t.log_tail, t.log_seq
FROM build_jobs j
LEFT JOIN build_log_tails t ON t.build_job_id = j.id
WHERE j.id = $1`
)

// buildLogChannel is the NOTIFY channel of build_log_tails; the payload is the job id.
const buildLogChannel = "build_log"

const (
	// defaultLogRecheck re-reads a stream's build even without a notification, so a lost one
	// (NOTIFY is at most once) delays the stream but never wedges it.
	defaultLogRecheck = 15 * time.Second
	// defaultLogKeepAlive: an idle stream sends a comment this often, so proxies and load
	// balancers do not time it out.
	defaultLogKeepAlive = 15 * time.Second
	// logQueryTimeout bounds one read of a stream's build (pool acquire included).
	logQueryTimeout = 5 * time.Second
	// logWriteTimeout bounds one write to a stream: a client that stops reading is dropped
	// instead of holding the handler forever.
	logWriteTimeout = 30 * time.Second
)

// logHub fans the process's single build_log subscription out to the live log streams, by job
// id. It subscribes while at least one stream is open and unsubscribes when the last one ends,
// so a node nobody watches logs through does not receive every build's notifications.
type logHub struct {
	notifier *notify.Notifier
	logger   *slog.Logger
	// recheck and keepAlive are the streams' fallback re-read and keep-alive periods (tests
	// shorten them before Start).
	recheck, keepAlive time.Duration

	// changed (1-buffered) wakes the loop when the number of streams crossed zero.
	changed chan struct{}
	// quit is closed when the hub stops: streams end, new ones are refused.
	quit chan struct{}

	mu      sync.Mutex
	stopped bool
	streams map[int64]map[chan struct{}]struct{} // job id → the streams' wake-up channels
	count   int
	subs    int // subscriptions taken so far (tests)
	resyncs int // Resync signals handled so far (tests)
}

func newLogHub(n *notify.Notifier, logger *slog.Logger) *logHub {
	return &logHub{
		notifier: n, logger: logger,
		recheck: defaultLogRecheck, keepAlive: defaultLogKeepAlive,
		changed: make(chan struct{}, 1), quit: make(chan struct{}),
		streams: make(map[int64]map[chan struct{}]struct{}),
	}
}

var errHubStopped = errors.New("live log hub stopped")

// watch registers a stream of job id. The returned channel (1-buffered) receives a value
// whenever the job's tail may have changed; the caller re-reads it.
func (h *logHub) watch(id int64) (chan struct{}, error) {
	c := make(chan struct{}, 1)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return nil, errHubStopped
	}
	set := h.streams[id]
	if set == nil {
		set = make(map[chan struct{}]struct{})
		h.streams[id] = set
	}
	set[c] = struct{}{}
	h.count++
	if h.count == 1 {
		poke(h.changed)
	}
	return c, nil
}

func (h *logHub) unwatch(id int64, c chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	set := h.streams[id]
	if _, ok := set[c]; !ok {
		return
	}
	delete(set, c)
	if len(set) == 0 {
		delete(h.streams, id)
	}
	h.count--
	if h.count == 0 {
		poke(h.changed)
	}
}

// run owns the subscription until ctx ends, then closes quit. A hub runs once: a server is not
// restarted after Stop (its http.Server cannot be).
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
		close(h.quit)
	}()
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
				h.mu.Lock()
				h.subs++
				h.mu.Unlock()
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
			for c := range h.streams[id] {
				poke(c)
			}
			h.mu.Unlock()
		case <-resync:
			// Notifications may have been lost: every stream re-reads.
			h.mu.Lock()
			for _, set := range h.streams {
				for c := range set {
					poke(c)
				}
			}
			h.resyncs++
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
	status       string
	logURL       *string
	errorMessage *string
	tail         []byte
	seq          *int64 // nil: no tail row
}

func (s *Server) readBuildLog(ctx context.Context, id int64) (buildLogState, error) {
	ctx, cancel := context.WithTimeout(ctx, logQueryTimeout)
	defer cancel()
	var st buildLogState
	err := s.pool.QueryRow(ctx, buildLogStateSQL, id).Scan(&st.status, &st.logURL, &st.errorMessage, &st.tail, &st.seq)
	if err != nil {
		return st, fmt.Errorf("read log tail of build %d: %w", id, err)
	}
	return st, nil
}

// running reports whether a job in status may still produce log output.
func running(status string) bool {
	switch status {
	case "pending", "building", "uploading":
		return true
	}
	return false
}

// logLocation is the path the cache serves a finished build's log under ("/" + log_url), or
// "" when log_url is missing or not a plain "log/…" blob key.
func logLocation(logURL *string) string {
	if logURL == nil {
		return ""
	}
	rest, ok := strings.CutPrefix(*logURL, "log/")
	if !ok || rest == "" {
		return ""
	}
	segs := strings.Split(rest, "/")
	for i, seg := range segs {
		if seg == "" || seg == "." || seg == ".." || strings.ContainsAny(seg, "\\\x00\r\n") {
			return ""
		}
		segs[i] = url.PathEscape(seg) // a store name may contain '?'
	}
	return "/log/" + strings.Join(segs, "/")
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

// handleBuildLog is GET /api/builds/{id}/log: a finished build's log by redirect, a running
// one's live tail as Server-Sent Events.
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
		return &HTTPError{Code: http.StatusBadRequest, Msg: fmt.Sprintf("invalid build id %q: want a positive integer", raw)}
	}
	st, err := s.readBuildLog(r.Context(), id)
	if errors.Is(err, pgx.ErrNoRows) {
		return &HTTPError{Code: http.StatusNotFound, Msg: fmt.Sprintf("build %d not found", id)}
	}
	if err != nil {
		return err
	}
	if !running(st.status) {
		if loc := logLocation(st.logURL); loc != "" {
			http.Redirect(w, r, loc, http.StatusFound)
			return nil
		}
		return &HTTPError{Code: http.StatusNotFound, Msg: fmt.Sprintf("build %d has no log", id)}
	}
	if s.logs == nil {
		return &HTTPError{Code: http.StatusServiceUnavailable, Msg: "live logs unavailable"}
	}
	if r.Method == http.MethodHead { // would otherwise last until the build ends
		setStreamHeaders(w.Header())
		w.WriteHeader(http.StatusOK)
		return nil
	}
	// Registered before the stream's first read, so no change after that read goes unannounced.
	wake, err := s.logs.watch(id)
	if err != nil {
		return &HTTPError{Code: http.StatusServiceUnavailable, Msg: "server shutting down", Err: err}
	}
	defer s.logs.unwatch(id, wake)
	s.streamBuildLog(w, r, id, wake)
	return nil
}

// streamBuildLog serves the event stream; errors past the headers can only end it.
func (s *Server) streamBuildLog(w http.ResponseWriter, r *http.Request, id int64, wake <-chan struct{}) {
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
	logger := s.logger.With("build_id", id)
	logger.Debug("live log stream opened", "remote", r.RemoteAddr, "last_event_id", last)

	recheck := time.NewTicker(s.logs.recheck)
	defer recheck.Stop()
	keepAlive := time.NewTimer(s.logs.keepAlive)
	defer keepAlive.Stop()
	var buf bytes.Buffer
	for {
		st, err := s.readBuildLog(ctx, id)
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
		finished := !running(st.status)
		if finished {
			writeEndEvent(&buf, st)
		}
		if buf.Len() > 0 {
			if !send(buf.Bytes()) {
				return
			}
			keepAlive.Reset(s.logs.keepAlive)
		}
		if finished {
			logger.Debug("live log stream ended: build finished", "status", st.status)
			return
		}

		for idle := true; idle; {
			select {
			case <-ctx.Done():
				return
			case <-s.logs.quit:
				return // the client reconnects, to a node that is up
			case <-wake:
				idle = false
			case <-recheck.C:
				idle = false
			case <-keepAlive.C:
				if !send([]byte(": keep-alive\n\n")) {
					return
				}
				keepAlive.Reset(s.logs.keepAlive)
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
	Status string `json:"status"`
	LogURL string `json:"log_url,omitempty"`
	Error  string `json:"error,omitempty"`
}

func writeEndEvent(b *bytes.Buffer, st buildLogState) {
	ev := endEvent{Status: st.status, LogURL: logLocation(st.logURL)}
	if st.errorMessage != nil {
		ev.Error = *st.errorMessage
	}
	data, _ := json.Marshal(ev) // one line: Marshal escapes every control character
	b.WriteString("event: end\ndata: ")
	b.Write(data)
	b.WriteString("\n\n")
}
