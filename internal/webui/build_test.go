package webui

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

func TestBuildPage(t *testing.T) {
	t.Parallel()
	fx := newEvalFixture(t)
	s := fx.newScenario()
	fx.exec(`UPDATE build_jobs SET attempt = 2, retry_count = 1 WHERE id = $1`, s.jobs["bad"])
	var badDrv, midDrv string
	if err := fx.pool.QueryRow(fx.ctx, `SELECT (SELECT drv_path FROM build_jobs WHERE id = $1),
       (SELECT drv_path FROM build_jobs WHERE id = $2)`, s.jobs["bad"], s.jobs["mid"]).Scan(&badDrv, &midDrv); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		job  string
		want []string
	}{
		{"bad", []string{
			`<h1>bad <span class="badge bad">failed</span></h1>`,
			"Attempt 2/3", "(1 transient failure retried)",
			`<dt>Exit code</dt><dd class="mono">1</dd>`,
			`<pre class="err">builder failed with exit code 1</pre>`,
			`<dt>Builder</dt><dd>node-a</dd>`,
			`<dt>Duration</dt><dd>3m00s</dd>`,
			badDrv,
			fmt.Sprintf(`<a href="/ci/proj/eval/%d">proj #%d</a>`, s.eval, s.eval),
			`<div class="actions">`,
			"This build has no log.",
			`<script src="/ci/static/log.js" defer></script>`,
		}},
		{"lib", []string{
			"built as a dependency",
			fmt.Sprintf(`<a href="/ci/proj/build/%d">mid</a>`, s.jobs["mid"]), // needed by
		}},
		{"waiting", []string{
			`<span class="badge wait">pending</span>`,
			"not claimed yet",
			fmt.Sprintf(`data-stream="/api/builds/%d/log"`, s.jobs["waiting"]),
			"No output yet.",
		}},
	} {
		t.Run(tc.job, func(t *testing.T) {
			body := fx.get(fmt.Sprintf("/ci/proj/build/%d", s.jobs[tc.job]), http.StatusOK)
			for _, want := range tc.want {
				if !strings.Contains(body, want) {
					t.Errorf("page lacks %s", want)
				}
			}
		})
	}
}

// TestBuildPageSaysTheLogExpired: a succeeded build whose log the garbage collector deleted
// says so, rather than that it never had one.
func TestBuildPageSaysTheLogExpired(t *testing.T) {
	t.Parallel()
	fx := newEvalFixture(t)
	s := fx.newScenario()
	fx.exec(`UPDATE build_jobs SET status = 'succeeded', log_url = NULL, finished_at = now() - interval '40 days' WHERE id = $1`, s.jobs["lib"])
	body := fx.get(fmt.Sprintf("/ci/proj/build/%d", s.jobs["lib"]), http.StatusOK)
	if !strings.Contains(body, "This build&#39;s log was deleted: logs are kept for retention.log_retention") {
		t.Errorf("the page of a build whose log expired does not say so:\n%s", body)
	}
}

func TestBuildPageShowsTheLiveTail(t *testing.T) {
	t.Parallel()
	fx := newEvalFixture(t)
	s := fx.newScenario()
	id := s.jobs["busy"]
	fx.exec(`INSERT INTO build_log_tails (build_job_id, log_tail, log_seq) VALUES ($1, $2, 3)`, id,
		[]byte("configuring\n\x1b[1mbuilding <b>bold</b>\x1b[0m\n50%\r100%\n"))
	body := fx.get(fmt.Sprintf("/ci/proj/build/%d", id), http.StatusOK)
	want := fmt.Sprintf(`<pre class="log" id="log" data-stream="/api/builds/%d/log">configuring
building &lt;b&gt;bold&lt;/b&gt;
100%%
</pre>`, id)
	if !strings.Contains(body, want) {
		t.Errorf("page lacks the live tail %s:\n%s", want, body)
	}
	if strings.Contains(body, "raw log") || strings.Contains(body, "full log") {
		t.Error("a running build links to an archived log")
	}
}

// logCache is a fake cache node serving one log at /log/<name>.
type logCache struct {
	srv      *httptest.Server
	asked    chan string // the Accept-Encoding of each request
	status   int
	zstd     bool // answer zstd to a client accepting it
	log      []byte
	name     string
	lastSeen int // seconds ago
}

func newLogCache(t *testing.T, name string, log []byte) *logCache {
	c := &logCache{asked: make(chan string, 10), status: http.StatusOK, log: log, name: name}
	c.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.asked <- r.Header.Get("Accept-Encoding")
		if r.URL.Path != "/log/"+c.name || c.status != http.StatusOK {
			http.Error(w, "no", max(c.status, http.StatusNotFound))
			return
		}
		body := c.log
		if c.zstd && strings.Contains(r.Header.Get("Accept-Encoding"), "zstd") {
			enc, _ := zstd.NewWriter(nil)
			body = enc.EncodeAll(c.log, nil)
			w.Header().Set("Content-Encoding", "zstd")
		}
		_, _ = w.Write(body)
	}))
	t.Cleanup(c.srv.Close)
	return c
}

func TestBuildPageShowsTheArchivedLog(t *testing.T) {
	t.Parallel()
	var big strings.Builder
	for i := 0; big.Len() < 300<<10; i++ {
		fmt.Fprintf(&big, "line %06d of a long build\n", i)
	}
	big.WriteString("the end\n")

	type node struct {
		status   int // of the cache; 0: the node is dead and must not be asked
		lastSeen int
	}
	for _, tc := range []struct {
		name    string
		log     string
		zstd    bool
		caches  []node // in the order of last_seen, the most recent first
		want    []string
		notWant []string
	}{
		{"small", "hello <world>\n", false, []node{{status: http.StatusOK}},
			[]string{`>hello &lt;world&gt;` + "\n</pre>", `<a href="/log/NAME">raw log</a>`}, []string{"showing the last"}},
		{"big", big.String(), false, []node{{status: http.StatusOK}},
			[]string{"showing the last 256 KiB of 300 KiB · <a href=\"/log/NAME\">full log</a>", "the end\n</pre>"},
			[]string{"line 000000"}},
		{"big zstd", big.String(), true, []node{{status: http.StatusOK}},
			[]string{"showing the last 256 KiB of 300 KiB", "the end\n</pre>"}, []string{"line 000000"}},
		{"a failing cache, then a good one", "hello\n", false,
			[]node{{status: http.StatusInternalServerError, lastSeen: 1}, {status: http.StatusOK, lastSeen: 2}},
			[]string{">hello\n</pre>"}, nil},
		{"a dead cache is not asked", "hello\n", false,
			[]node{{status: 0, lastSeen: 1}, {status: http.StatusOK, lastSeen: 2}},
			[]string{">hello\n</pre>"}, nil},
		{"not archived", "", false, []node{{status: http.StatusNotFound}},
			[]string{"This build has no log."}, []string{`<pre class="log"`, "raw log"}},
		{"no cache node", "hello\n", false, nil,
			[]string{"The log could not be read from the cache right now."}, []string{`<pre class="log"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fx := newEvalFixture(t)
			s := fx.newScenario()
			id := s.jobs["bad"]
			var drv string
			if err := fx.pool.QueryRow(fx.ctx, `SELECT drv_path FROM build_jobs WHERE id = $1`, id).Scan(&drv); err != nil {
				t.Fatal(err)
			}
			name := path.Base(drv)
			fx.exec(`UPDATE build_jobs SET log_url = $2 WHERE id = $1`, id, "log/"+name)
			var caches []*logCache
			for i, n := range tc.caches {
				c := newLogCache(t, name, []byte(tc.log))
				c.zstd, c.status = tc.zstd, n.status
				st := status.NodeActive
				if n.status == 0 {
					st = status.NodeDead
				}
				fx.exec(`INSERT INTO nodes (id, roles, endpoint, incarnation, status, last_seen)
VALUES ($1, '{cache,signer}', $2, gen_random_uuid(), $3, now() - $4 * interval '1 second')`,
					fmt.Sprintf("cache-%d", i), c.srv.URL, st, n.lastSeen)
				caches = append(caches, c)
			}
			// A builder's endpoint is never asked for logs.
			fx.exec(`INSERT INTO nodes (id, roles, endpoint, incarnation, status) VALUES ('b', '{builder}', 'http://127.0.0.1:1', gen_random_uuid(), 'active')`)

			body := fx.get(fmt.Sprintf("/ci/proj/build/%d", id), http.StatusOK)
			for _, want := range tc.want {
				if want = strings.ReplaceAll(want, "NAME", name); !strings.Contains(body, want) {
					t.Errorf("page lacks %s", want)
				}
			}
			if strings.Contains(tc.name, "big") && !regexp.MustCompile(`id="log">line \d{6} of a long build\n`).MatchString(body) {
				t.Error("the tail does not start with a whole line")
			}
			for _, bad := range tc.notWant {
				if strings.Contains(body, bad) {
					t.Errorf("page has %s", bad)
				}
			}
			for i, c := range caches {
				select {
				case enc := <-c.asked:
					if tc.caches[i].status == 0 {
						t.Errorf("the dead cache node was asked")
					}
					if enc != "zstd" {
						t.Errorf("Accept-Encoding %q, want zstd", enc)
					}
				default:
					if tc.caches[i].status != 0 {
						t.Errorf("cache %d was not asked", i)
					}
				}
			}
		})
	}
}

func TestTailBufferKeepsTheEnd(t *testing.T) {
	t.Parallel()
	var all strings.Builder
	tb := &tailBuffer{max: 100}
	for i := range 1000 {
		chunk := fmt.Sprintf("%d,", i)
		all.WriteString(chunk)
		_, _ = tb.Write([]byte(chunk))
	}
	if want := all.String()[all.Len()-100:]; string(tb.bytes()) != want || tb.size != int64(all.Len()) {
		t.Errorf("tail %q (size %d), want %q (size %d)", tb.bytes(), tb.size, want, all.Len())
	}
	if len(tb.buf) > 2*tb.max {
		t.Errorf("the buffer grew to %d bytes", len(tb.buf))
	}
}

func TestCleanLog(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"plain\n", "plain\n"},
		{"\x1b[31;1mred\x1b[0m text\n", "red text\n"},
		{"\x1b]0;title\x07after", "after"},
		{"10%\r50%\r100%\r\nnext\r\n", "100%\nnext\n"},
		{"a\rb\r", "b"},
		{"bad \xff byte", "bad \uFFFD byte"},
	} {
		if got := cleanLog([]byte(tc.in)); got != tc.want {
			t.Errorf("cleanLog(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// A build's outputs say when only pull requests built them (quarantined) and when a trusted
// rebuild did not reproduce a pull request's build.
func TestBuildPageShowsQuarantine(t *testing.T) {
	t.Parallel()
	fx := newEvalFixture(t)
	s := fx.newScenario()
	var libDrv string
	if err := fx.pool.QueryRow(fx.ctx, `SELECT drv_path FROM build_jobs WHERE id = $1`, s.jobs["lib"]).Scan(&libDrv); err != nil {
		t.Fatal(err)
	}
	fx.exec(`INSERT INTO derivation_outputs (drv_path, output_name, output_path, nar_hash, nar_size, quarantined)
VALUES ($1, 'out', '/nix/store/bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb-lib', 'sha256:pr', 1, true)
ON CONFLICT (drv_path, output_name) DO UPDATE SET nar_hash = 'sha256:pr', nar_size = 1, quarantined = true`, libDrv)
	page := fmt.Sprintf("/ci/proj/build/%d", s.jobs["lib"])
	body := fx.get(page, http.StatusOK)
	if !strings.Contains(body, "built for a pull request; not served to anonymous cache users until a trusted evaluation needs it") ||
		!strings.Contains(body, "sha256:pr") {
		t.Errorf("the page of a quarantined build does not say so:\n%s", body)
	}
	fx.exec(`UPDATE derivation_outputs SET nar_hash = 'sha256:trusted', quarantined = false, nonrepro_nar_hash = 'sha256:pr' WHERE drv_path = $1`, libDrv)
	body = fx.get(page, http.StatusOK)
	if strings.Contains(body, "built for a pull request") ||
		!strings.Contains(body, `non-reproducible</span> the pull request’s build gave <span class="mono">sha256:pr</span>, the trusted build <span class="mono">sha256:trusted</span>`) {
		t.Errorf("the page of a non-reproducible build does not say so:\n%s", body)
	}
}

// TestBuildPageShowsEachAttempt: a build that failed transiently, then for good, then built
// after a rebuild shows its attempts as tabs, each with its node, result and own log; while it
// is failed it names the attempt its failure started in.
func TestBuildPageShowsEachAttempt(t *testing.T) {
	t.Parallel()
	fx := newEvalFixture(t)
	s := fx.newScenario()
	id := s.jobs["waiting"]
	var drv string
	if err := fx.pool.QueryRow(fx.ctx, `SELECT drv_path FROM build_jobs WHERE id = $1`, id).Scan(&drv); err != nil {
		t.Fatal(err)
	}
	name := path.Base(drv)
	logs := map[string]string{
		name + ".1": "attempt one ran out of memory\n",
		name + ".2": "attempt two: boom\n",
		name + ".3": "attempt three built it\n",
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := logs[strings.TrimPrefix(r.URL.Path, "/log/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	fx.exec(`INSERT INTO nodes (id, roles, endpoint, incarnation, status) VALUES ('c', '{cache}', $1, gen_random_uuid(), 'active')`, srv.URL)

	claim := func(node string) {
		t.Helper()
		fx.exec(`UPDATE build_jobs SET status = 'building', claimed_by = $2, claimed_at = now(), started_at = now(),
			attempt = attempt + 1 WHERE id = $1`, id, node)
	}
	// 1: a transient failure (the job goes back to the queue, keeping the attempt's start).
	claim("node-a")
	fx.exec(`UPDATE build_jobs SET status = 'pending', claimed_by = NULL, claimed_at = NULL, retry_count = 1,
		exit_code = 137, error_message = 'out of memory', log_url = $2 WHERE id = $1`, id, "log/"+name+".1")
	// 2: a permanent failure.
	claim("node-b")
	fx.exec(`UPDATE build_jobs SET status = 'failed', finished_at = now(), exit_code = 1, error_message = 'boom',
		log_url = $2, failures = failures + 1 WHERE id = $1`, id, "log/"+name+".2")

	page := func(query string) string { return fx.get(fmt.Sprintf("/ci/proj/build/%d%s", id, query), http.StatusOK) }
	tab := func(n int, current bool) string {
		cur := ""
		if current {
			cur = ` aria-current="page"`
		}
		return fmt.Sprintf(`<a href="?attempt=%d#attempts"%s>Attempt %d`, n, cur, n)
	}
	check := func(what, body string, want, notWant []string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(body, w) {
				t.Errorf("%s: page lacks %s", what, w)
			}
		}
		for _, w := range notWant {
			if strings.Contains(body, w) {
				t.Errorf("%s: page has %s", what, w)
			}
		}
	}
	check("failed", page(""), []string{
		`<nav class="tabs" id="attempts">`,
		tab(1, false) + ` <span class="badge bad">retried</span>`,
		tab(2, true) + ` <span class="badge bad">failed</span>`,
		"node-a", "node-b",
		`<dt>Failed first</dt><dd><a href="?attempt=1#attempts">attempt 1</a> on node-a`,
		">attempt two: boom\n</pre>", `<a href="/log/` + name + `.2">raw log</a>`,
	}, []string{"attempt one ran out of memory"})
	check("failed, attempt 1", page("?attempt=1"), []string{
		tab(1, true), tab(2, false),
		`<pre class="err">out of memory</pre>`, `<dd class="mono">137</dd>`,
		">attempt one ran out of memory\n</pre>", `<a href="/log/` + name + `.1">raw log</a>`,
	}, []string{"attempt two: boom"})
	// A later evaluation that needs the derivation reuses the failure: its row links to the
	// attempt that failed first; the evaluation the failure happened in does not call it cached.
	var later int64
	if err := fx.pool.QueryRow(fx.ctx, `INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status)
		SELECT project_id, flake_url, 'later', branch, 'succeeded' FROM evaluations WHERE id = $1 RETURNING id`, s.eval).Scan(&later); err != nil {
		t.Fatal(err)
	}
	fx.exec(`INSERT INTO eval_attrs (eval_id, attr, drv_path) VALUES ($1, 'waiting', $2)`, later, drv)
	cached := fmt.Sprintf(`cached failure: <a href="/ci/proj/build/%d?attempt=1#attempts">failed first in attempt 1</a>`, id)
	check("the later evaluation", fx.get(fmt.Sprintf("/ci/proj/eval/%d", later), http.StatusOK), []string{cached}, nil)
	check("the evaluation it failed in", fx.get(fmt.Sprintf("/ci/proj/eval/%d", s.eval), http.StatusOK), nil, []string{"cached failure"})

	// An attempt that does not exist shows the latest.
	check("failed, attempt 9", page("?attempt=9"), []string{tab(2, true), "attempt two: boom"}, nil)

	// Retried by its policy: queued for a third attempt after a backoff, then built, flaky.
	fx.exec(`UPDATE build_jobs SET status = 'pending', retry_count = 0, claimed_by = NULL, claimed_at = NULL,
		started_at = NULL, finished_at = NULL, exit_code = NULL, error_message = NULL, retry_limit = 1,
		failure_retries = 1, retry_at = now() + interval '1 minute' WHERE id = $1`, id)
	check("queued again", page(""), []string{tab(2, false), tab(3, true) + ` <span class="badge wait">pending</span>`, "No output yet.",
		"<dt>Retry</dt><dd>build failure retried (1 of 1), not before"},
		[]string{"Failed first", "flaky"})
	claim("node-a")
	check("building", page(""), []string{tab(3, true) + ` <span class="badge busy">building</span>`}, nil)
	fx.exec(`UPDATE build_jobs SET status = 'succeeded', finished_at = now(), exit_code = 0, error_message = NULL,
		log_url = $2 WHERE id = $1`, id, "log/"+name+".3")
	check("succeeded", page(""), []string{
		tab(1, false), tab(2, false), tab(3, true) + ` <span class="badge ok">succeeded</span>`,
		">attempt three built it\n</pre>", `<span class="badge wait flaky">flaky</span>`,
		"flaky: failed 1 of 2 attempts", // the transient failure is not the build's
	}, []string{"Failed first", "<dt>Retry</dt>"})
	check("the evaluation of a flaky build", fx.get(fmt.Sprintf("/ci/proj/eval/%d", s.eval), http.StatusOK),
		[]string{`title="attributes whose build succeeded after failing without a change">1 flaky</span>`,
			`<span class="badge ok">succeeded</span> <span class="badge wait flaky" title="succeeded after failing without a change">flaky</span>`}, nil)
	check("succeeded, attempt 2", page("?attempt=2"), []string{tab(2, true), ">attempt two: boom\n</pre>"}, nil)
}
