package webui

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// eventReader reads one SSE stream's "update" events.
type eventReader struct {
	t      *testing.T
	events chan string
}

func openEvents(t *testing.T, srv *httptest.Server, path string) *eventReader {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	r := &eventReader{t: t, events: make(chan string, 16)}
	go func() {
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		var event string
		var data strings.Builder
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				event = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				data.WriteString(strings.TrimPrefix(line, "data: ") + "\n")
			case line == "":
				if event == "update" {
					r.events <- data.String()
				}
				event = ""
				data.Reset()
			}
		}
	}()
	return r
}

// next waits for an update that contains every one of wants.
func (r *eventReader) next(wants ...string) string {
	r.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case e := <-r.events:
			if !slices.ContainsFunc(wants, func(w string) bool { return !strings.Contains(e, w) }) {
				return e
			}
		case <-deadline:
			r.t.Fatalf("no update containing %q within 10s", wants)
		}
	}
}

// liveFixture is an evaluation fixture whose UI has a running notifier, served over HTTP.
func liveFixture(t *testing.T) (*evalFixture, *httptest.Server) {
	t.Helper()
	fx := newEvalFixture(t)
	n := notify.New(notify.Config{}, fx.pool, slog.New(slog.DiscardHandler), clock.Real{})
	if err := n.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Stop)
	fx.u.cfg.Notifier = n
	srv := httptest.NewServer(testMux(fx.u))
	t.Cleanup(srv.Close)
	return fx, srv
}

// A finished build's notification reaches an open evaluation page as its attribute row, marked
// for an out-of-band swap, and the dashboard as its changed fragments only.
func TestLiveUpdates(t *testing.T) {
	fx, srv := liveFixture(t)
	e := fx.newEval(fx.project)
	drv := fx.drv("hello")
	row := fx.attr(e, "hello", drv)
	fx.job(drv, jobSpec{status: status.JobBuilding, node: "b1", claimed: time.Second})
	other := fx.drv("other")
	fx.attr(e, "other", other)
	fx.job(other, jobSpec{status: status.JobPending})

	evalStream := openEvents(t, srv, fmt.Sprintf("/api/events/eval/%d", e))
	dash := openEvents(t, srv, "/api/events/dashboard")
	// A stream opened without a render time first catches up on the last minute.
	evalStream.next(fmt.Sprintf(`<tr id="attr-%d" hx-swap-oob="true"`, row), "building", ">other<")
	dash.next(`id="queue-bar" hx-swap-oob="true"`, `id="project-`)

	fx.exec(`UPDATE build_jobs SET status = 'succeeded', finished_at = now() WHERE drv_path = $1`, drv)
	fx.exec(`SELECT pg_notify('build_jobs', $1)`, fmt.Sprintf(`{"status":"succeeded","drv_paths":[%q]}`, drv))
	up := evalStream.next(fmt.Sprintf(`<tr id="attr-%d" hx-swap-oob="true"`, row), "succeeded")
	if strings.Contains(up, ">other<") {
		t.Errorf("evaluation update: want only the finished attribute's row, succeeded; got\n%s", up)
	}
	dash.next(`id="queue-bar" hx-swap-oob="true"`)

	// Only what changed goes out next time: the queue bar, not the unchanged project row.
	fx.exec(`UPDATE build_jobs SET status = 'building', claimed_by = 'b2', claimed_at = now(), started_at = now() WHERE drv_path = $1`, other)
	fx.exec(`SELECT pg_notify('build_jobs', '{"system":"x86_64-linux"}')`)
	second := dash.next(`id="queue-bar"`)
	if strings.Contains(second, `id="project-`) && !strings.Contains(second, "building") {
		t.Errorf("an unchanged project row was sent again:\n%s", second)
	}

	// The evaluation's own status: its title, and a notice to reload.
	fx.exec(`UPDATE evaluations SET status = 'succeeded', finished_at = now() WHERE id = $1`, e)
	fx.exec(`SELECT pg_notify('evaluations', $1)`, fmt.Sprintf(`{"id":%d,"status":"succeeded"}`, e))
	head := evalStream.next(`id="eval-head" hx-swap-oob="true"`)
	if !strings.Contains(head, "succeeded") || !strings.Contains(head, `id="eval-notice"`) {
		t.Errorf("evaluation status update:\n%s", head)
	}
}

func TestEventStreamRefusals(t *testing.T) {
	u, _ := newTestUI(t)
	mux := testMux(u)
	if code, _ := get(t, mux, "/api/events/eval/abc"); code != http.StatusBadRequest {
		t.Errorf("a malformed evaluation id: %d, want 400", code)
	}
	// Without a LISTEN session there are no live updates; the page itself still works.
	if code, _ := get(t, mux, "/api/events/dashboard"); code != http.StatusServiceUnavailable {
		t.Errorf("no notifier: %d, want 503", code)
	}
}

func TestOOB(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`<tr id="a"><td>x</td></tr>`, `<tr id="a" hx-swap-oob="true"><td>x</td></tr>`},
		{"\n  <section id=\"q\">y</section>\n", `<section id="q" hx-swap-oob="true">y</section>`},
		{`text`, `text`},
	} {
		if got := strings.TrimSpace(oob(tc.in)); got != tc.want {
			t.Errorf("oob(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
