// Package e2e tests harmonia-ci as users run it: real harmonia-ci processes on a real
// PostgreSQL, killed, paused and drained the way real nodes are.
package e2e

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/blobtest"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/giteatest"
	"github.com/harmonia-ci/harmonia-ci/internal/nodetoken"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

func TestMain(m *testing.M) { dbtest.Main(m, proctest.Cleanup, blobtest.Cleanup, giteatest.Cleanup) }

const (
	// clusterSecret is the secret of the e2e clusters' signers; other nodes get node tokens.
	clusterSecret = "e2e-cluster-secret-0123456789"
	adminToken    = "e2e-admin-token-0123456789"
	leaderRole    = "maintenance"
	isLeader      = `harmonia_ci_leader_is_leader{role="maintenance"}`
)

// fixture is a cluster of harmonia-ci processes on one fresh database.
type fixture struct {
	t       *testing.T
	dbURL   string
	pool    *pgxpool.Pool
	cfgPath string
	procs   map[string]*proctest.Proc
}

func newFixture(t *testing.T, extraConfig string) *fixture {
	t.Helper()
	url := dbtest.NewDB(t)
	return newFixtureOn(t, url, extraConfig)
}

func newFixtureOn(t *testing.T, url, extraConfig string) *fixture {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	tokenFile := proctest.WriteFile(t, "admin-token", adminToken+"\n")
	cfg := proctest.FastConfig + extraConfig + fmt.Sprintf("\n[auth]\nadmin_token_file = %q\n", tokenFile)
	return &fixture{
		t: t, dbURL: url, pool: pool, procs: map[string]*proctest.Proc{},
		cfgPath: proctest.WriteFile(t, "harmonia-ci.toml", cfg),
	}
}

// start runs `harmonia-ci serve` as node id.
func (f *fixture) start(id string, extra ...string) *proctest.Proc {
	f.t.Helper()
	args := []string{"serve", "--config", f.cfgPath, "--database-url", f.dbURL,
		"--node-id", id, "--listen", "127.0.0.1:0", "--state-dir", filepath.Join(stateDir(f.t), "state")}
	if !slices.Contains(extra, "--roles") {
		// Every role but the signer, which needs a signing key, and the builder, which needs the
		// signer (the build tests start both).
		args = append(args, "--roles", "frontend,evaluator,cache")
	}
	args = append(args, extra...)
	p := proctest.Start(f.t, id, nil, args...)
	f.procs[id] = p
	return p
}

// startActive starts nodes and waits until each is registered and active.
func (f *fixture) startActive(ids ...string) {
	f.t.Helper()
	for _, id := range ids {
		f.start(id)
	}
	for _, id := range ids {
		proctest.WaitFor(f.t, 30*time.Second, "node "+id+" active", func() bool {
			return f.nodeStatus(id) == status.NodeActive
		})
	}
}

// nodeStatus is the node's status in the nodes table, "" if it has no row.
func (f *fixture) nodeStatus(id string) status.NodeStatus {
	var s status.NodeStatus
	err := f.pool.QueryRow(context.Background(), `SELECT status FROM nodes WHERE id = $1`, id).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	if err != nil {
		f.t.Fatalf("read node %s: %v", id, err)
	}
	return s
}

func (f *fixture) incarnation(id string) string {
	var s string
	if err := f.pool.QueryRow(context.Background(), `SELECT incarnation::text FROM nodes WHERE id = $1`, id).Scan(&s); err != nil {
		f.t.Fatalf("read incarnation of %s: %v", id, err)
	}
	return s
}

func (f *fixture) endpoint(id string) string {
	var s string
	if err := f.pool.QueryRow(context.Background(), `SELECT endpoint FROM nodes WHERE id = $1`, id).Scan(&s); err != nil {
		f.t.Fatalf("read endpoint of %s: %v", id, err)
	}
	return s
}

// lease returns the holder of the maintenance role if its lease is valid.
func (f *fixture) lease() (node string, epoch int64, valid bool) {
	err := f.pool.QueryRow(context.Background(),
		`SELECT node_id, epoch, lease_until > now() FROM leaders WHERE role = $1`, leaderRole).Scan(&node, &epoch, &valid)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0, false
	}
	if err != nil {
		f.t.Fatalf("read lease: %v", err)
	}
	return node, epoch, valid
}

// leaderViews asks every running process whether it thinks it leads.
func (f *fixture) leaderViews(endpoints map[string]string) map[string]float64 {
	views := map[string]float64{}
	for id, ep := range endpoints {
		if f.procs[id].Exited() {
			continue
		}
		if v, ok := proctest.Metric(ep, isLeader); ok {
			views[id] = v
		}
	}
	return views
}

// steadyLeader waits until the cluster agrees on one leader: a valid lease names a running
// node, that node's metrics say it leads and every other running node's say it does not.
func (f *fixture) steadyLeader(timeout time.Duration, running ...string) (string, int64) {
	f.t.Helper()
	endpoints := map[string]string{}
	for _, id := range running {
		endpoints[id] = f.endpoint(id)
	}
	var leader string
	var epoch int64
	var last string
	defer func() {
		if f.t.Failed() {
			f.t.Logf("last view: %s", last)
		}
	}()
	proctest.WaitFor(f.t, timeout, "one agreed leader among "+fmt.Sprint(running), func() bool {
		node, e, valid := f.lease()
		views := f.leaderViews(endpoints)
		last = fmt.Sprintf("lease %s epoch %d valid %v; views %v", node, e, valid, views)
		if !valid {
			return false
		}
		if len(views) != len(running) {
			return false
		}
		for id, v := range views {
			if (id == node) != (v == 1) {
				return false
			}
		}
		leader, epoch = node, e
		return true
	})
	return leader, epoch
}

// checkFencing asserts the fencing invariant over every leader-only write so far: ordered by
// commit (id), epochs never go backwards, so no write of an old epoch landed after a newer
// epoch's first write.
func (f *fixture) checkFencing() {
	f.t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT id, epoch, node_id FROM maintenance_runs WHERE role = $1 ORDER BY id`, leaderRole)
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	var lastEpoch int64
	var n int
	for rows.Next() {
		var id, epoch int64
		var node string
		if err := rows.Scan(&id, &epoch, &node); err != nil {
			f.t.Fatal(err)
		}
		if epoch < lastEpoch {
			f.t.Fatalf("fencing violated: maintenance run %d by %s under epoch %d committed after epoch %d had written", id, node, epoch, lastEpoch)
		}
		lastEpoch = epoch
		n++
	}
	if n == 0 {
		f.t.Fatal("no leader-only writes recorded: the maintenance leader never ran")
	}
}

// nodeEnv is the environment of node id in roles (comma-separated) besides base: a signer gets
// the cluster secret, a builder or evaluator its node token, as in a real deployment.
func nodeEnv(t *testing.T, base []string, id, roles string) []string {
	t.Helper()
	env := slices.Clone(base)
	rs := strings.Split(roles, ",")
	switch {
	case slices.Contains(rs, "signer"):
		env = append(env, "HARMONIA_CLUSTER_SECRET="+clusterSecret)
	case slices.Contains(rs, "builder") || slices.Contains(rs, "evaluator"):
		env = append(env, "HARMONIA_NODE_TOKEN="+nodeToken(t, id, rs...))
	}
	return env
}

// nodeToken issues node id's token in roles under the clusters' secret.
func nodeToken(t *testing.T, id string, roles ...string) string {
	t.Helper()
	k, err := nodetoken.NewKey(clusterSecret)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := k.Issue(nodetoken.Identity{NodeID: id, Roles: roles})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
