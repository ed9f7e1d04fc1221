package cluster_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

func TestReadStatus(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ctx := ctxTimeout(t, 10*time.Second)

	b := register(t, pool, "b-node")
	if err := b.SetStatus(ctx, status.NodeActive); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Beat(ctx, cluster.Load{CurrentJobs: 2, CPU: 0.25, Memory: 0.5}); err != nil {
		t.Fatal(err)
	}
	a := register(t, pool, "a-node")
	insertNode(t, pool, "c-node", status.NodeDead, 10*time.Minute)

	mustExec(t, pool, `
INSERT INTO leaders (role, node_id, incarnation, epoch, lease_until)
VALUES ('maintenance', 'b-node', $1, 3, now() + interval '1 minute'),
       ('expired-role', 'a-node', $2, 5, now() - interval '1 second')`, b.Incarnation(), a.Incarnation())

	s, err := cluster.ReadStatus(ctx, pool)
	if err != nil {
		t.Fatalf("ReadStatus: %v", err)
	}
	if len(s.Nodes) != 3 || s.Nodes[0].ID != "a-node" || s.Nodes[1].ID != "b-node" || s.Nodes[2].ID != "c-node" {
		t.Fatalf("nodes %+v, want a-node, b-node, c-node in order", s.Nodes)
	}
	nb := s.Nodes[1]
	if nb.Status != status.NodeActive || nb.Incarnation != b.Incarnation() || nb.CurrentJobs != 2 ||
		nb.CPUUsage != 0.25 || nb.MemoryUsage != 0.5 || nb.MaxJobs != 4 || nb.Endpoint != "http://b-node:8080" ||
		nb.Hostname != "b-node.example" || len(nb.Systems) != 1 || nb.Systems[0] != testSystem {
		t.Fatalf("b-node status %+v", nb)
	}
	if nb.LastSeenSecondsAgo < 0 || nb.LastSeenSecondsAgo > 10 {
		t.Fatalf("b-node last seen %v s ago", nb.LastSeenSecondsAgo)
	}
	if nc := s.Nodes[2]; nc.Status != status.NodeDead || nc.LastSeenSecondsAgo < 590 {
		t.Fatalf("c-node %+v, want dead, last seen ~600 s ago", nc)
	}
	want := map[status.NodeStatus]int{status.NodeJoining: 1, status.NodeActive: 1, status.NodeDraining: 0, status.NodeDead: 1}
	for k, v := range want {
		if s.Counts[k] != v {
			t.Fatalf("counts %v, want %v", s.Counts, want)
		}
	}

	if len(s.Leaders) != 2 {
		t.Fatalf("leaders %+v, want 2", s.Leaders)
	}
	byRole := map[string]cluster.LeaderStatus{}
	for _, l := range s.Leaders {
		byRole[l.Role] = l
	}
	if l := byRole["maintenance"]; !l.Valid || l.NodeID != "b-node" || l.Epoch != 3 || l.Incarnation != b.Incarnation() {
		t.Fatalf("maintenance leader %+v, want valid, b-node, epoch 3", l)
	}
	if l := byRole["expired-role"]; l.Valid || l.NodeID != "a-node" || l.Epoch != 5 {
		t.Fatalf("expired leader %+v, want not valid", l)
	}
	if s.Leaders[0].Role != "expired-role" {
		t.Fatalf("leaders not ordered by role: %+v", s.Leaders)
	}
}

func TestReadStatusEmpty(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	s, err := cluster.ReadStatus(ctxTimeout(t, 10*time.Second), pool)
	if err != nil {
		t.Fatalf("ReadStatus: %v", err)
	}
	if len(s.Nodes) != 0 || len(s.Leaders) != 0 || s.Counts[status.NodeActive] != 0 {
		t.Fatalf("empty cluster status %+v", s)
	}
}

func TestNodeCountCollector(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	insertNode(t, pool, "a", status.NodeActive, 0)
	insertNode(t, pool, "b", status.NodeActive, 0)
	insertNode(t, pool, "c", status.NodeDead, time.Hour)

	reg := prometheus.NewRegistry()
	reg.MustRegister(cluster.NewNodeCountCollector(pool))
	want := map[status.NodeStatus]float64{status.NodeActive: 2, status.NodeDead: 1, status.NodeDraining: 0, status.NodeJoining: 0}
	for st, n := range want {
		if got := metricValue(t, reg, "harmonia_ci_nodes", "status", string(st)); got != n {
			t.Fatalf("harmonia_ci_nodes{status=%q} = %v, want %v", st, got, n)
		}
	}
	if got := metricValue(t, reg, "harmonia_ci_database_up"); got != 1 {
		t.Fatalf("harmonia_ci_database_up = %v, want 1", got)
	}

	pool.Close()
	if got := metricValue(t, reg, "harmonia_ci_database_up"); got != 0 {
		t.Fatalf("harmonia_ci_database_up with the database unreachable = %v, want 0", got)
	}
}
