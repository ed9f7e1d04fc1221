package e2e

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/pgembed"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

// roles are those of the nodes of these tests: HTTP, health and leadership need nothing more.
const roles = "frontend,cache"

// privatePostgres starts a PostgreSQL server of the test's own in dir: these tests pause or
// stop their server, which the shared dbtest server's other users must not see. It is stopped
// at the end of the test.
func privatePostgres(t *testing.T, dir string) *pgembed.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgembed.Start(ctx, pgembed.Options{Dir: dir, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("start private PostgreSQL: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("stop private PostgreSQL: %v", err)
		}
	})
	return srv
}

// pgDir is a directory for privatePostgres. As root the server runs as the postgres user, which
// must be able to traverse it; t.TempDir's parent is private (0700).
func pgDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "postgres")
}

// postgresProcesses returns the pids of the server running on dataDir: the postmaster (the first
// line of postmaster.pid) and every process it forked.
func postgresProcesses(t *testing.T, dataDir string) []int {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(raw), "\n")
	postmaster, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		t.Fatalf("postmaster.pid: %v", err)
	}
	pids := []int{postmaster}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, ppid, ok := procStat(pid); ok && ppid == postmaster {
			pids = append(pids, pid)
		}
	}
	return pids
}

// procStat is process pid's state letter ("T": stopped) and parent, from /proc; ok is false
// once it is gone.
func procStat(pid int) (state string, ppid int, ok bool) {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return "", 0, false
	}
	// pid (comm) state ppid ...; comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return "", 0, false
	}
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) < 2 {
		return "", 0, false
	}
	ppid, err = strconv.Atoi(fields[1])
	return fields[0], ppid, err == nil
}

// pausePostgres stops (SIGSTOP) the server on dataDir and all its processes, like a VM that
// froze or a host swapping itself to death: connections stay open and nothing answers. The
// returned resume is also run at the end of the test, so a failure never leaves it stopped.
func pausePostgres(t *testing.T, dataDir string) (resume func()) {
	t.Helper()
	// The postmaster first, so it forks nothing that the list below would miss.
	pids := postgresProcesses(t, dataDir)
	if err := syscall.Kill(pids[0], syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP postmaster: %v", err)
	}
	// kill returns before the signal is delivered: a backend the postmaster forks until it is
	// stopped would be missed by the list below, and answer queries the whole pause.
	waittest.For(t, 10*time.Second, func() bool { state, _, _ := procStat(pids[0]); return state == "T" },
		"the postmaster (pid %d) stopped", pids[0])
	pids = postgresProcesses(t, dataDir)
	stopped := []int{pids[0]}
	resume = func() {
		for _, pid := range stopped {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	for _, pid := range pids[1:] {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err == nil {
			stopped = append(stopped, pid)
		}
	}
	t.Logf("paused PostgreSQL: %d processes", len(stopped))
	return resume
}

// timedGet asks base+path and returns the status, the JSON error message if any, and how long the
// answer took; a request that takes longer than limit fails the test.
func timedGet(t *testing.T, base, path string, limit time.Duration) (int, string, time.Duration) {
	t.Helper()
	client := http.Client{Timeout: limit}
	start := time.Now()
	resp, err := client.Get(base + path)
	if err != nil {
		t.Fatalf("GET %s: %v (after %s)", path, err, time.Since(start).Round(time.Millisecond))
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	took := time.Since(start)
	var e struct{ Error string }
	_ = json.Unmarshal(body, &e)
	return resp.StatusCode, e.Error, took
}

// TestDatabasePaused: PostgreSQL paused for 30 s. Health and cluster endpoints answer 503
// "database unavailable" within 10 s the whole time, the node keeps running, and it is
// active again once the server resumes.
func TestDatabasePaused(t *testing.T) {
	t.Parallel()
	const (
		pause = 30 * time.Second
		limit = 10 * time.Second
	)
	dir := pgDir(t)
	srv := privatePostgres(t, dir)
	f := newFixtureOn(t, srv.URL("harmonia"), "")
	if _, err := db.Migrate(context.Background(), f.pool, "e2e"); err != nil {
		t.Fatal(err)
	}
	p := f.start("steady", "--roles", roles)
	proctest.WaitFor(t, 30*time.Second, "node steady active", func() bool {
		if p.Exited() {
			t.Fatalf("the node exited:\n%s", p.Logs())
		}
		return f.nodeStatus("steady") == status.NodeActive
	})
	base := f.endpoint("steady")
	for _, path := range []string{"/healthz", "/api/cluster"} {
		if code, msg, _ := timedGet(t, base, path, limit); code != http.StatusOK {
			t.Fatalf("GET %s before the pause: %d %q, want 200", path, code, msg)
		}
	}

	resume := pausePostgres(t, filepath.Join(dir, "data"))
	pausedAt := time.Now()
	rounds := 0
	for time.Since(pausedAt) < pause {
		for _, path := range []string{"/healthz", "/api/cluster"} {
			code, msg, took := timedGet(t, base, path, limit)
			if code != http.StatusServiceUnavailable || msg != "database unavailable" {
				t.Fatalf("GET %s while PostgreSQL is paused: %d %q after %s, want 503 \"database unavailable\"",
					path, code, msg, took.Round(time.Millisecond))
			}
			if rounds == 0 {
				t.Logf("GET %s while paused: 503 after %s", path, took.Round(time.Millisecond))
			}
		}
		if p.Exited() {
			t.Fatal("the node exited while PostgreSQL was paused")
		}
		rounds++
	}
	resume()
	resumedAt := time.Now()
	t.Logf("resumed PostgreSQL after %s (%d rounds of requests)", time.Since(pausedAt).Round(time.Millisecond), rounds)

	proctest.WaitFor(t, 60*time.Second, "/healthz answers 200 again", func() bool {
		code, _, _ := timedGet(t, base, "/healthz", limit)
		return code == http.StatusOK
	})
	// A fresh heartbeat: last_seen is from after the pause, not the one before it.
	proctest.WaitFor(t, 30*time.Second, "the node active again, with a fresh heartbeat", func() bool {
		var fresh bool
		err := f.pool.QueryRow(context.Background(), `SELECT status = 'active' AND last_seen > now() - interval '2 seconds'
			FROM nodes WHERE id = 'steady'`).Scan(&fresh)
		return err == nil && fresh
	})
	if code, msg, _ := timedGet(t, base, "/api/cluster", limit); code != http.StatusOK {
		t.Fatalf("GET /api/cluster after the pause: %d %q, want 200", code, msg)
	}
	t.Logf("active again %s after the resume", time.Since(resumedAt).Round(time.Millisecond))
}

// TestNodeStartsBeforeItsDatabase: a node whose configured PostgreSQL is down at start keeps
// running and retrying, says so in its log (without the URL's password), and becomes active once
// the server is up.
func TestNodeStartsBeforeItsDatabase(t *testing.T) {
	t.Parallel()
	const password = "e2e-secret-password"
	dir := pgDir(t)
	srv := privatePostgres(t, dir) // creates the cluster and the database
	url := strings.Replace(srv.URL("harmonia"), "postgres://harmonia@", "postgres://harmonia:"+password+"@", 1)
	if url == srv.URL("harmonia") {
		t.Fatalf("cannot put a password into %s", url)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}

	f := newFixtureOn(t, url, "") // trust authentication ignores the password
	p := f.start("early", "--roles", roles)
	proctest.WaitFor(t, 30*time.Second, "the node to retry its database twice", func() bool {
		if p.Exited() {
			t.Fatalf("the node exited while its database was down:\n%s", p.Logs())
		}
		return strings.Count(p.Logs(), "database unavailable; retrying") >= 2
	})

	privatePostgres(t, dir)
	startedAt := time.Now()
	proctest.WaitFor(t, 60*time.Second, "the node active once its database is up", func() bool {
		if p.Exited() {
			t.Fatalf("the node exited:\n%s", p.Logs())
		}
		var st status.NodeStatus
		err := f.pool.QueryRow(context.Background(), `SELECT status FROM nodes WHERE id = 'early'`).Scan(&st)
		return err == nil && st == status.NodeActive
	})
	t.Logf("active %s after the database started", time.Since(startedAt).Round(time.Millisecond))
	if code, msg, _ := timedGet(t, f.endpoint("early"), "/healthz", 10*time.Second); code != http.StatusOK {
		t.Errorf("GET /healthz: %d %q, want 200", code, msg)
	}
	if strings.Contains(p.Logs(), password) {
		t.Errorf("the node's log shows the database password:\n%s", p.Logs())
	}
}
