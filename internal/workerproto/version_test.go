package workerproto

import (
	"context"
	"io"
	"net"
	"testing"
	"time"
)

// scriptedDaemon is a daemon speaking protocol 1.minor on a pipe, as Nix's daemon.cc does: it
// answers the handshake (with features from 1.38 and the trust flag from 1.35) and then one
// BuildPathsWithResults with a result carrying CPU times from 1.37.
func scriptedDaemon(t *testing.T, minor uint64) *Conn {
	t.Helper()
	client, server := net.Pipe()
	t.Cleanup(func() { client.Close(); server.Close() })
	go func() {
		r, w := newReader(server), newWriter(server)
		r.uint64() // magic 1
		w.uint64(magic2)
		w.uint64(1<<8 | minor)
		_ = w.flush()
		agreed := min(r.uint64()&0xff, minor)
		if agreed >= 38 {
			r.strings()
			w.strings([]string{"some-future-feature"})
			_ = w.flush()
		}
		r.uint64() // CPU affinity
		r.uint64() // reserveSpace
		if agreed >= 33 {
			w.string("2.99.0")
		}
		if agreed >= 35 {
			w.uint64(uint64(NotTrusted))
		}
		w.uint64(msgLast)
		_ = w.flush()

		if op := r.uint64(); op != opBuildPathsWithResults {
			return
		}
		targets := r.strings()
		r.uint64() // build mode
		w.uint64(msgLast)
		w.uint64(uint64(len(targets)))
		for _, tg := range targets {
			w.string(tg)
			w.uint64(uint64(Built))
			w.string("")
			w.uint64(1)    // times built
			w.bool(false)  // non-deterministic
			w.uint64(1000) // start
			w.uint64(1002) // stop
			if agreed >= 37 {
				w.uint64(1)
				w.uint64(1500000) // user: 1.5 s
				w.uint64(0)       // system: not measured
			}
			w.uint64(0) // built outputs
		}
		_ = w.flush()
		_, _ = io.Copy(io.Discard, server)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := NewConn(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestNegotiatedVersions: the client speaks the older of the two protocols and reads every
// field the daemon sends in it.
func TestNegotiatedVersions(t *testing.T) {
	for _, tt := range []struct {
		daemon, agreed uint64
		version        string
		trust          Trust
		cpuUser        time.Duration
	}{
		{daemon: 32, agreed: 32, trust: TrustUnknown},
		{daemon: 34, agreed: 34, version: "2.99.0", trust: TrustUnknown},
		{daemon: 35, agreed: 35, version: "2.99.0", trust: NotTrusted},
		{daemon: 37, agreed: 37, version: "2.99.0", trust: NotTrusted, cpuUser: 1500 * time.Millisecond},
		{daemon: 38, agreed: 38, version: "2.99.0", trust: NotTrusted, cpuUser: 1500 * time.Millisecond},
		{daemon: 40, agreed: 38, version: "2.99.0", trust: NotTrusted, cpuUser: 1500 * time.Millisecond},
	} {
		c := scriptedDaemon(t, tt.daemon)
		if c.Minor != tt.agreed || c.DaemonMinor != tt.daemon || c.DaemonVersion != tt.version || c.Trust != tt.trust {
			t.Errorf("daemon 1.%d: agreed 1.%d (daemon 1.%d, %q, %s), want 1.%d (%q, %s)", tt.daemon, c.Minor,
				c.DaemonMinor, c.DaemonVersion, c.Trust, tt.agreed, tt.version, tt.trust)
			continue
		}
		res, err := c.BuildPaths(context.Background(), []string{"/nix/store/00000000000000000000000000000000-x.drv!*"}, nil)
		if tt.agreed < 34 {
			if err == nil {
				t.Errorf("daemon 1.%d: BuildPaths was sent", tt.daemon)
			}
			continue
		}
		if err != nil {
			t.Errorf("daemon 1.%d: %v", tt.daemon, err)
			continue
		}
		if len(res) != 1 || res[0].Status != Built || res[0].CPUUser != tt.cpuUser || res[0].CPUSystem != 0 ||
			res[0].Stop.Sub(res[0].Start) != 2*time.Second {
			t.Errorf("daemon 1.%d: results %+v, want built with user CPU %s", tt.daemon, res, tt.cpuUser)
		}
		// The connection is still in step: nothing is left unread.
		if c.Broken() {
			t.Errorf("daemon 1.%d: the connection broke", tt.daemon)
		}
	}
}
