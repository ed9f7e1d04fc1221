package apiclient

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

const (
	// maxLogBytes bounds the archived log the client reads (builders cap logs far below).
	maxLogBytes = 256 << 20
	// anchorBytes is how much of what was printed last is looked for in the next text, to
	// print only what follows it.
	anchorBytes = 1 << 10
	// keepBytes is how much of what was printed is kept: a log up to this size is matched
	// whole, which a log of repeated lines needs.
	keepBytes = 128 << 10
	// maxStreamFailures is how many live log streams in a row may end without a word before
	// Log gives up.
	maxStreamFailures = 5
)

// LogEnd is how a build ended, as the live log's "end" event says.
type LogEnd struct {
	Status status.JobStatus `json:"status"`
	Error  string           `json:"error"`
	LogURL string           `json:"log_url"` // "": the build left no log
}

// Log writes build id's log to w: a finished build's whole log, or a running one's as it grows
// (its live tail from GET /api/builds/{id}/log as Server-Sent Events, then the archived log
// when it ends, each line once). It returns how the build ended.
func (c *Client) Log(ctx context.Context, id int64, w io.Writer) (LogEnd, error) {
	p := &logPrinter{w: w}
	path := "/api/builds/" + strconv.FormatInt(id, 10) + "/log"
	lastID := ""
	failures := 0
	for {
		end, err := c.streamLog(ctx, path, &lastID, p)
		if p.err != nil {
			return LogEnd{}, p.err
		}
		if end != nil {
			return *end, c.archivedLog(ctx, path, end.LogURL != "", p)
		}
		var ae *Error
		if ctx.Err() != nil || (errors.As(err, &ae) && ae.Status != 0 && ae.Status < 500) {
			return LogEnd{}, err
		}
		// The stream ended without the build's end (the node restarted, a proxy cut it):
		// resume where it was, as an EventSource would.
		if failures++; failures > maxStreamFailures {
			if err == nil {
				err = errors.New("the stream ended before the build did")
			}
			return LogEnd{}, fmt.Errorf("follow the log of build %d: %w", id, err)
		}
		if err := c.sleep(ctx, time.Duration(failures)*time.Second); err != nil {
			return LogEnd{}, err
		}
	}
}

// streamLog reads one live log stream, showing each tail, until its "end" event (returned) or
// until it breaks off (nil).
func (c *Client) streamLog(ctx context.Context, path string, lastID *string, p *logPrinter) (*LogEnd, error) {
	r := request{method: http.MethodGet, path: path, accept: "text/event-stream"}
	if *lastID != "" {
		r.header = http.Header{"Last-Event-ID": {*lastID}}
	}
	resp, err := c.do(ctx, r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	var event, id string
	var data []string
	for sc.Scan() {
		line := sc.Text()
		if line != "" {
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "event":
				event = value
			case "data":
				data = append(data, value)
			case "id":
				id = value
			}
			continue
		}
		switch event {
		case "tail":
			*lastID = id
			p.show(strings.Join(data, "\n"), false)
		case "end":
			var end LogEnd
			if err := json.Unmarshal([]byte(strings.Join(data, "\n")), &end); err != nil {
				return nil, fmt.Errorf("GET %s: the end event: %w", path, err)
			}
			return &end, nil
		}
		event, id, data = "", "", nil
	}
	return nil, sc.Err()
}

// archivedLog shows the finished build's log (the log route redirects to it), or, when it has
// none, what the live tail held back.
func (c *Client) archivedLog(ctx context.Context, path string, hasLog bool, p *logPrinter) error {
	if !hasLog {
		p.flush()
		return p.err
	}
	resp, err := c.do(ctx, request{method: http.MethodGet, path: path, accept: "text/plain"})
	var ae *Error
	if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
		p.flush()
		if p.err == nil {
			ae.Msg = "the build's archived log is gone, or its cache refused it: " + ae.Msg
		}
		return cmp.Or(p.err, err)
	}
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxLogBytes))
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	p.show(terminalText(b), true)
	return p.err
}

// terminalText is a log as the live tail carries it: valid UTF-8, each line as a terminal
// shows it after its carriage returns.
func terminalText(b []byte) string {
	text := strings.ReplaceAll(strings.ToValidUTF8(string(b), "\uFFFD"), "\r\n", "\n")
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		for {
			j := strings.LastIndexByte(l, '\r')
			if j < 0 {
				break
			}
			if j < len(l)-1 {
				l = l[j+1:]
				break
			}
			l = l[:j]
		}
		lines[i] = l
	}
	return strings.Join(lines, "\n")
}

// logPrinter prints successive views of a log's end (live tails, then the whole log) so that
// each line appears once: it finds what it printed last in the next view and prints what
// follows. A live tail's last line may still grow, so it is held back until a later view.
type logPrinter struct {
	w       io.Writer
	printed []byte // the end of what was printed, whole lines
	cut     bool   // printed lacks its beginning
	pending string // a live tail's last line, not printed yet
	err     error
}

// show prints what text adds; final says text is the whole log.
func (p *logPrinter) show(text string, final bool) {
	complete := text
	if final {
		if complete != "" && !strings.HasSuffix(complete, "\n") {
			complete += "\n"
		}
		p.pending = ""
	} else {
		i := strings.LastIndexByte(text, '\n')
		complete, p.pending = text[:i+1], text[i+1:]
	}
	p.write([]byte(complete[p.resume([]byte(complete)):]))
}

// resume is where in text what was printed ends: after the last copy of its end, or after the
// part of it text starts with; 0 (and a mark) when text starts after a gap.
func (p *logPrinter) resume(text []byte) int {
	if len(p.printed) == 0 || len(text) == 0 {
		return 0
	}
	if !p.cut && bytes.HasPrefix(text, p.printed) { // the view starts where the log does
		return len(p.printed)
	}
	anchor := p.printed[max(0, len(p.printed)-anchorBytes):]
	if i := bytes.LastIndex(text, anchor); i >= 0 {
		return i + len(anchor)
	}
	for q := 1; q < len(anchor); q++ {
		if bytes.HasPrefix(text, anchor[q:]) {
			return len(anchor) - q
		}
	}
	p.write([]byte("[… log lines not received …]\n"))
	return 0
}

// flush prints the held-back line: no later view will come.
func (p *logPrinter) flush() {
	if p.pending != "" {
		p.write([]byte(p.pending + "\n"))
		p.pending = ""
	}
}

func (p *logPrinter) write(b []byte) {
	if p.err != nil || len(b) == 0 {
		return
	}
	_, p.err = p.w.Write(b)
	p.printed = append(p.printed, b...)
	if len(p.printed) > 2*keepBytes {
		p.printed, p.cut = append(p.printed[:0], p.printed[len(p.printed)-keepBytes:]...), true
	}
}
