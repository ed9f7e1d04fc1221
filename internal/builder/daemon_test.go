package builder

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixdaemon"
	"github.com/harmonia-ci/harmonia-ci/internal/nixgen"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
)

// TestBuildThroughAnExistingDaemon is a builder on someone else's nix-daemon, as a NixOS host
// runs it ([build] daemon): the daemon's own settings hold (its sandbox, its store). A daemon
// that trusts the builder's user builds the derivation the builder sends; one that does not
// builds it from its store, after the builder added the .drv closure from the cache, and
// takes the inputs only signed by a key of its own trusted-public-keys.
func TestBuildThroughAnExistingDaemon(t *testing.T) {
	nixtest.RequireNix(t)
	t.Parallel()
	c := newStoreTestCache(t)
	expr := nixgen.Lib(storeTestSalt(t)) + ` let a = mk "a" [ ]; b = mk "b" [ a ]; c = mk "c" [ b ]; in { inherit a b c; }`
	drvs := storeTestInstantiate(t, "", expr, "a", "b", "c")
	storeTestBuildSystem(t, drvs["a"], drvs["b"])
	outA, outB, outC := storeTestOut(t, "", drvs["a"]), storeTestOut(t, "", drvs["b"]), storeTestOut(t, "", drvs["c"])
	c.publish(t, outA, outB)
	c.publish(t, strings.Fields(storeTestRun(t, "nix-store", "--query", "--requisites", drvs["c"]))...)
	// Which protocol tells the builder whether the daemon trusts it: 1.35 (Nix 2.15) and later.
	// An older daemon is taken as not trusting.
	version := nixtest.Version(t)
	saysTrust := !strings.HasPrefix(version, "2.8.")

	for _, tt := range []struct {
		name         string
		trustedUsers string
		clusterKey   bool // the daemon's trusted-public-keys hold the cluster's key
		wantTrusted  bool
		wantErr      string
	}{
		{name: "trusted", trustedUsers: "root", wantTrusted: saysTrust, clusterKey: !saysTrust},
		{name: "untrusted", trustedUsers: "", clusterKey: true},
		{name: "untrusted without the cluster's key", trustedUsers: "", wantErr: "add the cluster's key"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := storeTestCtx(t)
			keys := "none-1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
			if tt.clusterKey {
				keys = c.key.Public().String()
			}
			root := t.TempDir()
			d := nixdaemon.New(nixdaemon.Config{Store: root, Options: [][2]string{
				{"trusted-users", tt.trustedUsers}, {"build-users-group", ""}, {"substituters", ""},
				{"sandbox-paths", strings.Join(nix.SandboxPaths(nil), " ")},
				{"trusted-public-keys", keys}, {"require-sigs", "true"},
			}}, queuetest.TestLogger(t))
			t.Cleanup(d.Close)
			socket, err := d.Ensure(ctx)
			if err != nil {
				t.Fatal(err)
			}
			s := &Store{Daemon: socket, Substituters: []string{c.url}, TrustedKeys: []string{c.key.Public().String()}}
			info, err := s.Init(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.Version != version || info.Trusted != tt.wantTrusted {
				t.Errorf("Init = %+v, want Nix %s, trusted %v", info, version, tt.wantTrusted)
			}
			ss := storeTestOpen(t, s)
			drvC, err := ss.Derivation(ctx, drvs["c"])
			if err != nil {
				t.Fatal(err)
			}
			inputs, err := ss.InputPaths(ctx, drvs["c"], drvC, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ss.EnsureInputs(ctx, inputs, storeTestSystemHashes, queuetest.TestLogger(t)); err != nil {
				if tt.wantErr != "" && strings.Contains(err.Error(), tt.wantErr) {
					return
				}
				t.Fatalf("EnsureInputs: %v", err)
			}
			if tt.wantErr != "" {
				t.Fatalf("EnsureInputs succeeded; want an error saying %q", tt.wantErr)
			}
			var log bytes.Buffer
			outs, err := ss.Build(ctx, drvs["c"], drvC, inputs, BuildLimits{Timeout: time.Minute}, &log)
			if err != nil || outs["out"] != outC {
				t.Fatalf("Build = %v, %v\n%s", outs, err, log.String())
			}
			if got, err := os.ReadFile(filepath.Join(root, outC)); err != nil || string(got) != "c\nb\na\n" {
				t.Fatalf("c's output in the daemon's store holds %q, %v", got, err)
			}
			if !strings.Contains(log.String(), "building c") {
				t.Errorf("build log %q lacks the builder's output", log.String())
			}
			// Sent to a daemon that trusts the builder; from the store otherwise.
			if _, inStore := storeTestValid(t, &Store{Root: root}, drvs["c"]); inStore == tt.wantTrusted {
				t.Errorf("the .drv is in the daemon's store: %v; want %v", inStore, !tt.wantTrusted)
			}
		})
	}
}

// TestBuilderRefusesOldNix: a daemon older than MinNixVersion stops the builder at start, with
// a message naming its version and the oldest supported one.
func TestBuilderRefusesOldNix(t *testing.T) {
	t.Parallel()
	socket := filepath.Join(t.TempDir(), "socket")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		// Nix 2.5's daemon: protocol 1.33, which names its version after the handshake.
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		u64 := func(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
		var buf [8]byte
		_, _ = io.ReadFull(conn, buf[:]) // magic
		_, _ = conn.Write(append(u64(0x6478696f), u64(1<<8|33)...))
		for range 3 { // the client's version, CPU affinity, reserveSpace
			_, _ = io.ReadFull(conn, buf[:])
		}
		v := "2.5.1"
		_, _ = conn.Write(append(append(u64(uint64(len(v))), v+"\x00\x00\x00"...), u64(0x616c7473)...))
		_, _ = io.Copy(io.Discard, conn)
	}()
	_, err = (&Store{Daemon: socket}).Init(storeTestCtx(t))
	if !errors.Is(err, ErrNixTooOld) || !strings.Contains(err.Error(), "2.5.1 (protocol 1.33)") ||
		!strings.Contains(err.Error(), "Nix "+MinNixVersion+" (protocol 1.34) or later") {
		t.Fatalf("Init on Nix 2.5: %v; want ErrNixTooOld naming 2.5.1 and %s", err, MinNixVersion)
	}
}
