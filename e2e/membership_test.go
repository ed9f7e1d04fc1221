package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

// TestDeadNodeLifecycle: a node that stops beating is marked dead after the threshold; its row
// stays while a build is still claimed in its name; a restart under the same id gets a new
// incarnation and releases that build; once dead with nothing claimed, the row is cleaned up.
func TestDeadNodeLifecycle(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "")
	f.startActive("leader")
	f.start("worker", "--roles", "cache")
	proctest.WaitFor(t, 30*time.Second, "worker active", func() bool { return f.nodeStatus("worker") == status.NodeActive })
	firstInc := f.incarnation("worker")

	ctx := context.Background()
	drv := "/nix/store/" + strings.Repeat("a", 32) + "-claimed.drv"
	if _, err := f.pool.Exec(ctx, `INSERT INTO derivations (drv_path, hash_part, name, system, nar_hash, nar_size)
		VALUES ($1, $2, 'claimed', 'x86_64-linux', 'sha256:x', 1)`, drv, strings.Repeat("a", 32)); err != nil {
		t.Fatal(err)
	}
	var jobID int64
	if err := f.pool.QueryRow(ctx, `INSERT INTO build_jobs (drv_path, system, status, claimed_by, claimed_at, attempt)
		VALUES ($1, 'x86_64-linux', 'building', 'worker', now(), 1) RETURNING id`, drv).Scan(&jobID); err != nil {
		t.Fatal(err)
	}

	f.procs["worker"].Signal(t, syscall.SIGKILL)
	f.procs["worker"].Wait(t, 10*time.Second)
	killedAt := time.Now()
	// Threshold 1s, checked every heartbeat interval (200ms).
	proctest.WaitFor(t, 1*time.Second+slack, "worker marked dead", func() bool { return f.nodeStatus("worker") == status.NodeDead })
	t.Logf("marked dead %s after kill", time.Since(killedAt).Round(time.Millisecond))
	// Past the 2s retention the row must stay for as long as a build is claimed in its name (the
	// reaper may release the claim first; then the row may go).
	waittest.Hold(t, 3*time.Second, func() {
		var orphaned bool
		if err := f.pool.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM nodes WHERE id = 'worker')
			AND EXISTS (SELECT 1 FROM build_jobs WHERE claimed_by = 'worker' AND status = 'building')`).Scan(&orphaned); err != nil {
			t.Fatal(err)
		}
		if orphaned {
			t.Fatal("the dead worker's row went away while a build was still claimed in its name")
		}
	})

	f.start("worker", "--roles", "cache")
	proctest.WaitFor(t, 30*time.Second, "worker back", func() bool {
		return f.nodeStatus("worker") == status.NodeActive && f.incarnation("worker") != firstInc
	})
	var st status.JobStatus
	var retries int
	var claimedBy *string
	if err := f.pool.QueryRow(ctx, `SELECT status, retry_count, claimed_by FROM build_jobs WHERE id = $1`, jobID).Scan(&st, &retries, &claimedBy); err != nil {
		t.Fatal(err)
	}
	if st != status.JobPending || retries != 1 || claimedBy != nil {
		t.Fatalf("after the restart the old claim is (%s, retry %d, claimed_by %v), want (pending, retry 1, nil)", st, retries, claimedBy)
	}

	f.procs["worker"].Signal(t, syscall.SIGKILL)
	f.procs["worker"].Wait(t, 10*time.Second)
	proctest.WaitFor(t, 1*time.Second+slack, "worker dead again", func() bool { return f.nodeStatus("worker") == status.NodeDead })
	proctest.WaitFor(t, 2*time.Second+slack, "dead worker's row cleaned up", func() bool { return f.nodeStatus("worker") == "" })
	if got := f.nodeStatus("leader"); got != status.NodeActive {
		t.Fatalf("the live node is %q, want active", got)
	}
}

// TestDrain drains nodes the three ways an operator can: the API (which needs the admin
// token), the CLI naming a node, and the CLI on the local node. Each drained node stops, exits
// 0 and deregisters; a refused request changes nothing.
func TestDrain(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "")
	f.startActive("api", "cli", "local", "stays")
	ep := f.endpoint("stays")

	post := func(target, token string) int {
		req, err := http.NewRequest(http.MethodPost, ep+"/api/nodes/"+target+"/drain", nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		name, token string
		want        int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"wrong token", "not-the-token", http.StatusUnauthorized},
		{"token prefix", adminToken[:5], http.StatusUnauthorized},
	} {
		if got := post("api", tc.token); got != tc.want {
			t.Errorf("%s: POST drain = %d, want %d", tc.name, got, tc.want)
		}
	}
	var draining bool
	if err := f.pool.QueryRow(context.Background(), `SELECT draining FROM nodes WHERE id = 'api'`).Scan(&draining); err != nil || draining {
		t.Fatalf("after refused requests draining = %v (err %v), want false", draining, err)
	}
	if got := post("no-such-node", adminToken); got != http.StatusNotFound {
		t.Errorf("drain of an unknown node = %d, want 404", got)
	}
	if got := post("bad%20id", adminToken); got != http.StatusBadRequest {
		t.Errorf("drain of an invalid node id = %d, want 400", got)
	}

	if got := post("api", adminToken); got != http.StatusAccepted {
		t.Fatalf("drain with the admin token = %d, want 202", got)
	}
	code, out := proctest.Run(t, nil, "drain", "cli", "--config", f.cfgPath, "--database-url", f.dbURL)
	if code != 0 || !strings.Contains(out, "drain requested for node cli") {
		t.Fatalf("harmonia-ci drain cli: exit %d, output:\n%s", code, out)
	}
	code, out = proctest.Run(t, nil, "drain", "--config", f.cfgPath, "--database-url", f.dbURL, "--node-id", "local")
	if code != 0 || !strings.Contains(out, "drain requested for node local") {
		t.Fatalf("harmonia-ci drain (local node): exit %d, output:\n%s", code, out)
	}
	code, out = proctest.Run(t, nil, "drain", "ghost", "--config", f.cfgPath, "--database-url", f.dbURL)
	if code == 0 || !strings.Contains(out, "node not found") {
		t.Fatalf("harmonia-ci drain ghost: exit %d, want an error naming the missing node; output:\n%s", code, out)
	}

	for _, id := range []string{"api", "cli", "local"} {
		p := f.procs[id]
		if code := p.Wait(t, 15*time.Second); code != 0 {
			t.Errorf("%s exited %d after drain, want 0", id, code)
		}
		if !strings.Contains(p.Logs(), "shutting down: drain requested") || !strings.Contains(p.Logs(), "deregistered") {
			t.Errorf("%s's log does not show a drain and deregistration", id)
		}
		if s := f.nodeStatus(id); s != "" {
			t.Errorf("%s still has a node row (status %s)", id, s)
		}
	}
	if f.procs["stays"].Exited() || f.nodeStatus("stays") != status.NodeActive {
		t.Fatal("the node nobody drained stopped")
	}
	f.steadyLeader(10*time.Second, "stays")
}

// TestConcurrentStartMigratesOnce starts five nodes at the same moment on an empty database:
// the schema is applied exactly once and every node starts.
func TestConcurrentStartMigratesOnce(t *testing.T) {
	t.Parallel()
	f := newFixtureOn(t, emptyDB(t), "")
	ids := []string{"c1", "c2", "c3", "c4", "c5"}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mu.Lock()
			defer mu.Unlock()
			f.start(id)
		}()
	}
	wg.Wait()
	for _, id := range ids {
		proctest.WaitFor(t, 60*time.Second, id+" active", func() bool {
			var s status.NodeStatus
			err := f.pool.QueryRow(context.Background(), `SELECT status FROM nodes WHERE id = $1`, id).Scan(&s)
			return err == nil && s == status.NodeActive
		})
	}
	rows, err := f.pool.Query(context.Background(), `SELECT version, count(*) OVER (PARTITION BY version) FROM schema_migrations`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var versions int
	for rows.Next() {
		var v, n int
		if err := rows.Scan(&v, &n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Fatalf("migration %d recorded %d times", v, n)
		}
		versions++
	}
	if versions == 0 {
		t.Fatal("no migrations recorded")
	}
	appliers := 0
	for _, id := range ids {
		if strings.Contains(f.procs[id].Logs(), "applied database migrations") {
			appliers++
		}
	}
	if appliers != 1 {
		t.Fatalf("%d nodes applied migrations, want exactly 1", appliers)
	}
	f.steadyLeader(30*time.Second, ids...)
}

func emptyDB(t *testing.T) string {
	t.Helper()
	return dbtest.NewEmptyDB(t)
}

// TestBadConfigurationIsRejected: every kind of bad input stops the binary before it touches
// anything, with a message that names the problem.
func TestBadConfigurationIsRejected(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		config string
		args   []string
		want   []string
	}{
		{"unknown key", "[cluster.heartbeat]\nintervall = \"5s\"\n", nil, []string{"cluster.heartbeat.intervall", "unknown key"}},
		{"malformed duration", "[cluster.heartbeat]\ninterval = \"5x\"\n", nil, []string{"cluster.heartbeat.interval", `"5x"`}},
		{"malformed size", "[build]\nmax_log_size = \"64 parsecs\"\n", nil, []string{"build.max_log_size", "64 parsecs"}},
		{"refresh too slow for the lease", "[cluster.leader_election]\nlease_duration = \"60s\"\nrefresh_interval = \"30s\"\n", nil, []string{"cluster.leader_election.refresh_interval", "lease_duration/3"}},
		{"dead threshold below two beats", "[cluster.heartbeat]\ninterval = \"30s\"\ndead_threshold = \"45s\"\n", nil, []string{"cluster.heartbeat.dead_threshold"}},
		{"max_jobs zero", "[node]\nmax_jobs = 0\n", nil, []string{"node.max_jobs"}},
		{"wrong type", "[node]\nmax_jobs = \"four\"\n", nil, []string{"node.max_jobs", "four"}},
		{"syntax error", "[node\n", nil, []string{"line"}},
		{"unknown role flag", "", []string{"--roles", "builder,buildr"}, []string{"node.roles", `"buildr"`}},
		{"bad node id flag", "", []string{"--node-id", "bad id!"}, []string{"node.id", "bad id!"}},
		{"bad listen flag", "", []string{"--listen", "nope"}, []string{"listen", "nope"}},
		{"missing config file", "", []string{"--config", "/nonexistent/harmonia-ci.toml"}, []string{"/nonexistent/harmonia-ci.toml"}},
		{"missing token file", "[auth]\nadmin_token_file = \"/nonexistent/token\"\n", nil, []string{"auth.admin_token_file", "/nonexistent/token"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := []string{"serve", "--database-url", "postgres://unused@/none?host=/nonexistent"}
			if tc.config != "" {
				args = append(args, "--config", proctest.WriteFile(t, "bad.toml", tc.config))
			}
			args = append(args, tc.args...)
			code, out := proctest.Run(t, nil, args...)
			if code == 0 {
				t.Fatalf("harmonia-ci %v exited 0; want a rejection", args)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("message does not contain %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, "connect") {
				t.Errorf("bad configuration reached the database step:\n%s", out)
			}
		})
	}
}

// TestUpRunsEmbeddedCluster runs the README's main command: `harmonia-ci up` with nothing
// configured starts a private PostgreSQL in the state directory, serves HTTP, leads its own
// maintenance, and on SIGTERM stops everything and exits 0; a second start reuses the data.
func TestUpRunsEmbeddedCluster(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	// As root the embedded server runs as the postgres user, which must be able to traverse
	// the state directory's parents; t.TempDir's parent is private (0700).
	if err := os.Chmod(filepath.Dir(state), 0o711); err != nil {
		t.Fatal(err)
	}
	listen := freeAddr(t)
	env := []string{"HARMONIA_DATABASE_URL="}
	up := proctest.Start(t, "up", env, "up", "--state-dir", state, "--listen", listen, "--node-id", "solo")
	waitHealthy(t, up, "http://"+listen)
	code, out := proctest.Run(t, env, "cluster", "status", "--json", "--state-dir", state)
	if code != 0 || !strings.Contains(out, `"id": "solo"`) {
		t.Fatalf("cluster status against the running embedded database: exit %d\n%s", code, out)
	}
	proctest.WaitFor(t, 30*time.Second, "solo leads maintenance", func() bool {
		v, ok := proctest.Metric("http://"+listen, isLeader)
		return ok && v == 1
	})
	up.Signal(t, syscall.SIGTERM)
	if code := up.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("up exited %d after SIGTERM", code)
	}
	if !strings.Contains(up.Logs(), "embedded PostgreSQL stopped") {
		t.Fatalf("up did not stop its database:\n%s", up.Logs())
	}

	up2 := proctest.Start(t, "up again", env, "up", "--state-dir", state, "--listen", listen, "--node-id", "solo")
	waitHealthy(t, up2, "http://"+listen)
	if strings.Contains(up2.Logs(), "initialised") || strings.Contains(up2.Logs(), "applied database migrations") {
		t.Fatalf("second start re-initialised the database:\n%s", up2.Logs())
	}
	up2.Signal(t, syscall.SIGINT)
	if code := up2.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("up exited %d after SIGINT", code)
	}
}

func waitHealthy(t *testing.T, p *proctest.Proc, base string) {
	t.Helper()
	proctest.WaitFor(t, 60*time.Second, base+"/healthz answers 200", func() bool {
		if p.Exited() {
			t.Fatalf("%s exited before becoming healthy:\n%s", p.Name, p.Logs())
		}
		resp, err := http.Get(base + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

func freeAddr(t *testing.T) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", proctest.FreePort(t))
}
