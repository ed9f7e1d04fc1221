package apiclient_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/apiclient"
	"github.com/harmonia-ci/harmonia-ci/internal/apiv1"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
	"github.com/harmonia-ci/harmonia-ci/internal/web"
	"github.com/harmonia-ci/harmonia-ci/internal/webui"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

const adminToken = "apiclient-admin-token"

// failTail is the failed build's log tail the failures list carries.
const failTail = "compiling bad\nerror: bad's LAST LINE\n"

// fixture is a frontend's HTTP side as a node mounts it (the node's server with live logs, the
// web UI's actions, the read API) on a fresh database, and a client of it with the admin token.
// Project "web" has evaluation eval: attributes ok (built), bad (failed), broken (did not
// evaluate); evaluation many has 205 attributes, more than a page.
type fixture struct {
	t      *testing.T
	pool   *pgxpool.Pool
	url    string
	client *apiclient.Client
	logs   sync.Map // "/log/…" → archived log text, served as the cache would

	eval, many, okJob, failJob int64
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pool := dbtest.NewPool(t)
	fx := &fixture{t: t, pool: pool}
	logger := queuetest.TestLogger(t)
	n := notify.New(notify.Config{}, pool, logger, nil)
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Stop)
	waittest.For(t, 10*time.Second, n.Connected, "notifier connected")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := web.NewServer(web.Config{NodeID: "front-1", AdminToken: adminToken, Gatherer: prometheus.NewRegistry(), Notifier: n},
		pool, ln, logger)
	ui, err := webui.New(webui.Config{Pool: pool, Notifier: n, Logger: logger, AdminToken: adminToken})
	if err != nil {
		t.Fatal(err)
	}
	ui.Register(srv.Routes())
	tail := func(_ context.Context, id int64, _ int) (string, error) {
		if id == fx.failJob {
			return failTail, nil
		}
		return "", apiv1.ErrNoLog
	}
	apiv1.New(apiv1.Config{Pool: pool, Tail: tail, Logger: logger}).Register(srv.Routes())
	srv.Routes().Handle("GET /log/{key}", access.Free, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		text, ok := fx.logs.Load(r.URL.Path)
		if !ok {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, text)
	}))
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	fx.url = "http://" + ln.Addr().String()
	fx.client = fx.clientWith(adminToken)
	fx.seed()
	return fx
}

func (fx *fixture) clientWith(token string) *apiclient.Client {
	fx.t.Helper()
	c, err := apiclient.New(apiclient.Options{Server: fx.url + "/", Token: token})
	if err != nil {
		fx.t.Fatal(err)
	}
	return c
}

func (fx *fixture) id(sql string, args ...any) int64 {
	fx.t.Helper()
	return queuetest.QueryInt(fx.t, fx.pool, sql, args...)
}

// job records a job of a derivation named name in status st, an attribute of evaluation
// eval.
func (fx *fixture) job(project, eval int64, name string, st status.JobStatus) int64 {
	drv := queuetest.DrvPath(name)
	fx.id(`INSERT INTO derivations (drv_path, hash_part, name, system, nar_hash, nar_size)
VALUES ($1, $2, $3, 'x86_64-linux', 'sha256:0', 0) RETURNING 1`, drv, queuetest.Hash(name), name)
	fx.id(`INSERT INTO eval_attrs (eval_id, attr, drv_path) VALUES ($1, $2, $3) RETURNING id`, eval, name, drv)
	return fx.id(`INSERT INTO build_jobs (drv_path, project_id, system, status, claimed_by, attempt, started_at, finished_at,
    error_message)
VALUES ($1, $2, 'x86_64-linux', $3, CASE WHEN $3 <> 'pending' THEN 'builder-1' END, 1, now(),
    CASE WHEN $3 IN ('succeeded', 'failed') THEN now() END, CASE WHEN $3 = 'failed' THEN 'builder failed with exit code 1' END)
RETURNING id`, drv, project, st)
}

func (fx *fixture) seed() {
	p := queuetest.NewProject(fx.t, fx.pool, "web", 100)
	newEval := func(n int, st status.EvalStatus) int64 {
		return fx.id(`INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status)
VALUES ($1, 'x', lpad($2::int::text, 40, '0'), 'main', $3) RETURNING id`, p, n, st)
	}
	fx.eval = newEval(1, status.EvalSucceeded)
	fx.okJob = fx.job(p, fx.eval, "ok", status.JobSucceeded)
	fx.failJob = fx.job(p, fx.eval, "bad", status.JobFailed)
	fx.id(`INSERT INTO eval_attrs (eval_id, attr, error) VALUES ($1, 'broken', 'error: undefined variable') RETURNING id`, fx.eval)
	fx.many = newEval(2, status.EvalRunning)
	queuetest.Exec(fx.t, fx.pool, `INSERT INTO eval_attrs (eval_id, attr, error)
SELECT $1, 'attr-' || lpad(i::text, 3, '0'), 'error: no' FROM generate_series(1, 205) i`, fx.many)
}

// The client reads the API's objects, every page of them, and acts through the UI's actions,
// which change the database.
func TestClientReadsAndActs(t *testing.T) {
	t.Parallel()
	fx := newFixture(t)
	ctx := t.Context()
	c := fx.client

	es, err := c.Evaluations(ctx, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 2 || es[0].ID != fx.many || es[1].ID != fx.eval || es[1].Project != "web" {
		t.Fatalf("evaluations: %+v, want %d then %d of web", es, fx.many, fx.eval)
	}

	e, err := c.Evaluation(ctx, fx.eval, true)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, a := range e.Attributes {
		names = append(names, a.Name+":"+a.Status)
	}
	if want := []string{"bad:failed", "broken:eval-error", "ok:succeeded"}; !slices.Equal(names, want) {
		t.Errorf("attributes %v, want %v", names, want)
	}
	if e.Builds[status.JobFailed] != 1 || e.Builds[status.JobSucceeded] != 1 || e.Status != status.EvalSucceeded {
		t.Errorf("evaluation %+v: want succeeded with one failed and one succeeded build", e)
	}
	many, err := c.Evaluation(ctx, fx.many, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(many.Attributes) != 205 || many.Attributes[204].Name != "attr-205" || many.Next != nil {
		t.Errorf("evaluation of 205 attributes read as %d, the last %q", len(many.Attributes), many.Attributes[len(many.Attributes)-1].Name)
	}

	fl, err := c.Failures(ctx, fx.eval)
	if err != nil {
		t.Fatal(err)
	}
	if len(fl.Failures) != 2 || fl.Failures[0].Name != "bad" || fl.Failures[0].LogTail != failTail || fl.Failures[1].Name != "broken" {
		t.Fatalf("failures: %+v", fl)
	}

	b, err := c.Build(ctx, fx.failJob)
	if err != nil {
		t.Fatal(err)
	}
	if b.ID != fx.failJob || b.Status != status.JobFailed || b.Project != "web" || b.Error == "" {
		t.Fatalf("build: %+v", b)
	}

	res, err := c.RebuildBuild(ctx, fx.failJob)
	if err != nil {
		t.Fatal(err)
	}
	if st := jobStatus(t, fx.pool, fx.failJob); st != status.JobPending || !strings.Contains(res.Message, "queued again") {
		t.Fatalf("after rebuild %q: job %s, want pending", res.Message, st)
	}
	if _, err := c.CancelBuild(ctx, fx.failJob); err != nil {
		t.Fatal(err)
	}
	if st := jobStatus(t, fx.pool, fx.failJob); st != status.JobCancelled {
		t.Fatalf("after cancel: job %s, want cancelled", st)
	}
	if _, err := c.CancelEvaluation(ctx, fx.many); err != nil {
		t.Fatal(err)
	}
	if e, err := c.Evaluation(ctx, fx.many, false); err != nil || e.Status != status.EvalCancelled || len(e.Attributes) != 0 {
		t.Fatalf("after cancel: %+v, %v; want cancelled, no attributes asked for", e.Evaluation, err)
	}

	// Refusals carry their status and name what was wrong, never the token.
	for _, tc := range []struct {
		name   string
		call   func() error
		status int
		words  string
	}{
		{"no such build", func() error { _, err := c.Build(ctx, 999999); return err }, http.StatusNotFound, "not found"},
		{"no such project", func() error { _, err := c.Evaluations(ctx, "nope", 5); return err }, http.StatusNotFound, "not found"},
		{"bad token", func() error { _, err := fx.clientWith("wrong-token").RebuildBuild(ctx, fx.failJob); return err },
			http.StatusUnauthorized, "refused the token"},
		{"no token", func() error { _, err := fx.clientWith("").CancelBuild(ctx, fx.failJob); return err },
			http.StatusUnauthorized, "wants a token"},
		{"a name to escape", func() error { _, err := c.Evaluations(ctx, "a b/c?d", 5); return err }, http.StatusNotFound, "a b/c?d"},
		{"nothing to rebuild", func() error { _, err := c.RebuildBuild(ctx, fx.okJob); return err }, http.StatusConflict, "nothing to rebuild"},
	} {
		err := tc.call()
		var ae *apiclient.Error
		if !errors.As(err, &ae) || ae.Status != tc.status || !strings.Contains(err.Error(), tc.words) {
			t.Errorf("%s: %v, want status %d saying %q", tc.name, err, tc.status, tc.words)
		}
		if err != nil && (strings.Contains(err.Error(), adminToken) || strings.Contains(err.Error(), "wrong-token")) {
			t.Errorf("%s: the error shows the token: %v", tc.name, err)
		}
	}
}

func jobStatus(t *testing.T, pool *pgxpool.Pool, id int64) status.JobStatus {
	t.Helper()
	var st status.JobStatus
	if err := pool.QueryRow(context.Background(), `SELECT status FROM build_jobs WHERE id = $1`, id).Scan(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// syncBuffer is a buffer the log follower writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Log follows a running build's live tail, line by line and each line once (a line still being
// written is held back), then prints the rest from the archived log once the build ends.
func TestLogFollowsRunningBuild(t *testing.T) {
	t.Parallel()
	fx := newFixture(t)
	id := fx.okJob
	queuetest.Exec(t, fx.pool, `UPDATE build_jobs SET status = 'building', finished_at = NULL WHERE id = $1`, id)
	writeTail := func(tail string) {
		queuetest.Exec(t, fx.pool, `
INSERT INTO build_log_tails (build_job_id, log_tail, log_seq) VALUES ($1, $2, 1)
ON CONFLICT (build_job_id) DO UPDATE SET log_tail = EXCLUDED.log_tail, log_seq = build_log_tails.log_seq + 1`, id, []byte(tail))
	}
	writeTail("one\ntwo\nthr")
	var out syncBuffer
	type result struct {
		end apiclient.LogEnd
		err error
	}
	done := make(chan result, 1)
	go func() {
		end, err := fx.client.Log(t.Context(), id, &out)
		done <- result{end, err}
	}()
	waittest.For(t, 10*time.Second, func() bool { return out.String() == "one\ntwo\n" }, "the first tail's whole lines")
	writeTail("two\nthree\nfour\nfi")
	waittest.For(t, 10*time.Second, func() bool { return out.String() == "one\ntwo\nthree\nfour\n" }, "the second tail's new lines")

	full := "one\ntwo\nthree\nfour\nfive\nsix: done\n"
	key := "log/" + path.Base(queuetest.DrvPath("ok"))
	fx.logs.Store("/"+key, full)
	queuetest.Exec(t, fx.pool, `UPDATE build_jobs SET status = 'succeeded', finished_at = now(), log_url = $2 WHERE id = $1`, id, key)
	queuetest.Exec(t, fx.pool, `DELETE FROM build_log_tails WHERE build_job_id = $1`, id)
	select {
	case r := <-done:
		if r.err != nil || r.end.Status != status.JobSucceeded {
			t.Fatalf("Log: %+v, %v", r.end, r.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("Log did not return after the build ended; printed:\n%s", out.String())
	}
	if got := out.String(); got != full {
		t.Fatalf("printed:\n%q\nwant the whole log once:\n%q", got, full)
	}

	// A finished build's log is printed at once.
	var again syncBuffer
	if end, err := fx.client.Log(t.Context(), id, &again); err != nil || end.Status != status.JobSucceeded || again.String() != full {
		t.Fatalf("finished build: %+v, %v, printed %q", end, err, again.String())
	}
}

// A read that is rate limited waits the server's Retry-After (the injected sleeper's, no real
// sleep) and tries again, a bounded number of times; a write is reported at once.
func TestRateLimitRetry(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	requests := map[string]int{}
	limited := 2
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requests[r.Method]++
		n := requests[r.Method]
		mu.Unlock()
		if r.Method == http.MethodPost || n <= limited {
			w.Header().Set("Retry-After", "7")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, `{"error": "rate limited"}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id": 5, "status": "succeeded"}`)
	}))
	t.Cleanup(srv.Close)
	var slept []time.Duration
	c, err := apiclient.New(apiclient.Options{Server: srv.URL, Token: "t", MaxRetries: 3,
		SleepFunc: func(_ context.Context, d time.Duration) error { slept = append(slept, d); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Build(t.Context(), 5)
	if err != nil || b.ID != 5 {
		t.Fatalf("Build after two 429s: %+v, %v", b, err)
	}
	if want := []time.Duration{7 * time.Second, 7 * time.Second}; !slices.Equal(slept, want) {
		t.Errorf("slept %v, want %v", slept, want)
	}

	slept, limited = nil, 100
	requests = map[string]int{}
	_, err = c.Build(t.Context(), 5)
	var ae *apiclient.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusTooManyRequests || ae.RetryAfter != 7*time.Second || len(slept) != 3 {
		t.Errorf("still limited: %v after %d waits, want a 429 after 3", err, len(slept))
	}

	slept = nil
	_, err = c.RebuildBuild(t.Context(), 5)
	if !errors.As(err, &ae) || ae.Status != http.StatusTooManyRequests || len(slept) != 0 || requests[http.MethodPost] != 1 {
		t.Errorf("write: %v after %d waits and %d requests, want a 429 at once", err, len(slept), requests[http.MethodPost])
	}
}
