package bench

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/node"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// TestStartNodeReady: WaitReady returns once the node is registered active, which is what the
// benchmarks used to poll the nodes table for, and reports a node that stops before it is ready.
func TestStartNodeReady(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { taken.Close() })
	for _, tt := range []struct {
		name      string
		listen    string
		wantReady bool
	}{
		{"ready", "127.0.0.1:0", true},
		{"its address taken", taken.Addr().String(), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cfg := config.Default()
			cfg.DatabaseURL, cfg.StateDir, cfg.Listen = dbtest.NewDB(t), t.TempDir(), tt.listen
			cfg.Node.ID = "bench-ready"
			cfg.Node.Roles = []string{config.RoleCache}
			cfg.Auth.ClusterSecret = RandomHex(16)
			stopped := make(chan error, 1)
			n := StartNode(ctx, cfg, Logger(nil), node.Options{Version: "test"}, stopped)
			defer n.Stop()

			err := WaitReady(ctx, n)
			if (err == nil) != tt.wantReady {
				t.Fatalf("WaitReady: %v, want ready %v", err, tt.wantReady)
			}
			if !tt.wantReady {
				if err := <-stopped; err == nil {
					t.Fatal("the node stopped on its own with no error")
				}
				return
			}
			d, err := OpenDatabase(ctx, DatabaseOptions{URL: cfg.DatabaseURL, App: "test", PoolConns: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			var status string
			if err := d.Pool.QueryRow(ctx, `SELECT status FROM nodes WHERE id = $1`, cfg.Node.ID).Scan(&status); err != nil || status != "active" {
				t.Fatalf("node status %q (%v) once ready, want active", status, err)
			}
			if err := n.Stop(); err != nil {
				t.Fatalf("Stop: %v", err)
			}
		})
	}
}
