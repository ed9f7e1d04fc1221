package workerproto_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
	"github.com/harmonia-ci/harmonia-ci/internal/workerproto"
)

// daemon is a store and a `nix-daemon --stdio` connection to it: a chroot store of the test's,
// or the system store (builds as the nixbld build users).
type daemon struct {
	t     *testing.T
	store string // "" for the system store
	conn  *workerproto.Conn
}

// stores are the two kinds of store every build test runs on.
var stores = []struct {
	name   string
	system bool
}{{"chroot", false}, {"system", true}}

func (d *daemon) options() map[string]string {
	o := map[string]string{"sandbox-paths": strings.Join(nix.SandboxPaths(nil), " "), "substituters": ""}
	if d.store != "" {
		o["build-users-group"] = "" // a chroot store builds as root, in its own sandbox
	}
	return o
}

func newDaemon(t *testing.T) *daemon { return newDaemonOn(t, false) }

func newDaemonOn(t *testing.T, system bool) *daemon {
	t.Helper()
	nixtest.RequireNix(t)
	d := &daemon{t: t}
	if !system {
		d.store = filepath.Join(t.TempDir(), "store")
	}
	d.conn = d.open()
	return d
}

func (d *daemon) open() *workerproto.Conn {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := workerproto.Start(ctx, workerproto.StartOptions{Store: d.store, Options: d.options(),
		Env: []string{"HOME=" + d.t.TempDir(), "PATH=/usr/bin:/bin"}})
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { c.Close() })
	if err := c.SetOptions(ctx, workerproto.Options{MaxBuildJobs: 1}); err != nil {
		d.t.Fatal(err)
	}
	return c
}

// nixOut runs a Nix command on the daemon's store and returns its stdout.
func (d *daemon) nixOut(args ...string) string {
	d.t.Helper()
	var opts []string
	if d.store != "" {
		opts = append(opts, "--store", d.store)
	}
	for k, v := range d.options() {
		opts = append(opts, "--option", k, v)
	}
	cmd := exec.Command(args[0], append(args[1:], opts...)...)
	cmd.Env = append(os.Environ(), "HOME="+d.t.TempDir())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		d.t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// dump is `nix-store --dump` of p, a path of the daemon's chroot store.
func (d *daemon) dump(p string) string {
	d.t.Helper()
	out, err := exec.Command("nix-store", "--dump", filepath.Join(d.store, p)).Output()
	if err != nil {
		d.t.Fatalf("nix-store --dump %s: %v", p, err)
	}
	return string(out)
}

// instantiate writes expr's derivation into the store and returns its path and contents.
func (d *daemon) instantiate(expr string) (string, *nix.Derivation) {
	d.t.Helper()
	drvPath := strings.TrimSpace(d.nixOut("nix-instantiate", "--expr", expr))
	drv, err := nix.ReadDerivation(d.store, drvPath) // "" reads the system store
	if err != nil {
		d.t.Fatal(err)
	}
	return drvPath, drv
}

func shDrv(name, salt, script string, outputs ...string) string {
	outs := ""
	if len(outputs) > 0 {
		outs = `outputs = [ "` + strings.Join(outputs, `" "`) + `" ];`
	}
	return fmt.Sprintf(`builtins.derivation { name = %q; system = builtins.currentSystem; builder = "/bin/sh";
  salt = %q; %s args = [ "-c" %q ]; }`, name, salt, outs, script)
}

func salt(t *testing.T) string { return fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano()) }

type lines struct {
	mu sync.Mutex
	l  []string
}

func (l *lines) logger() *workerproto.Logger {
	return &workerproto.Logger{Line: func(s string) { l.mu.Lock(); l.l = append(l.l, s); l.mu.Unlock() }}
}

func (l *lines) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.ContainsFunc(l.l, func(x string) bool { return strings.Contains(x, s) })
}

// pathInfoJSON is what `nix path-info --json` says of path.
func (d *daemon) pathInfoJSON(path string) (narHash string, narSize uint64, refs []string) {
	d.t.Helper()
	args := []string{path}
	if d.store != "" {
		args = append(args, "--store", d.store)
	}
	info := nixtest.PathInfos(d.t, append(os.Environ(), "HOME="+d.t.TempDir()), args...)[path]
	return info.NarHash, uint64(info.NarSize), info.References
}

func TestHandshake(t *testing.T) {
	d := newDaemon(t)
	version := nixtest.Version(t)
	// The protocol each tested Nix speaks; the client's newest is 1.38.
	speaks := map[string]uint64{"2.8": 34, "2.26": 38}
	major, _, _ := strings.Cut(version[strings.Index(version, ".")+1:], ".")
	want, ok := speaks["2."+major]
	if !ok {
		t.Fatalf("Nix %s: which protocol does it speak? Add it to this test", version)
	}
	if d.conn.DaemonVersion != version || d.conn.DaemonMinor != want || d.conn.Minor != min(want, 38) {
		t.Errorf("daemon %q speaking 1.%d, agreed on 1.%d; want %s speaking 1.%d", d.conn.DaemonVersion,
			d.conn.DaemonMinor, d.conn.Minor, version, want)
	}
	// A daemon of this test's runs as root for a root client: it trusts it, and says so from 1.35.
	wantTrust := workerproto.Trusted
	if d.conn.Minor < 35 {
		wantTrust = workerproto.TrustUnknown
	}
	if d.conn.Trust != wantTrust {
		t.Errorf("trust %s, want %s", d.conn.Trust, wantTrust)
	}
}

// TestBuildAndReadBack builds a multi-output derivation through the daemon and checks every
// operation's answer against the Nix CLI's for the same paths.
func TestBuildAndReadBack(t *testing.T) {
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			d := newDaemonOn(t, st.system)
			ctx := context.Background()
			s := salt(t)
			dep, _ := d.instantiate(shDrv("dep", s, "echo dep > $out"))
			depOut := strings.TrimSpace(d.nixOut("nix-store", "--realise", dep))
			drvPath, drv := d.instantiate(fmt.Sprintf(`let dep = %s; in %s`, shDrv("dep", s, "echo dep > $out"),
				shDrv("multi", s, "echo building multi; echo ${dep} > $out; echo dev > $dev", "out", "dev")))
			if len(drv.Outputs) != 2 {
				t.Fatalf("outputs %v", drv.Outputs)
			}

			missing, err := d.conn.QueryMissing(ctx, []string{drvPath + "!out,dev"})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(missing.WillBuild, drvPath) {
				t.Errorf("QueryMissing: will build %v, want %s", missing.WillBuild, drvPath)
			}

			var log lines
			res, err := d.conn.BuildDerivation(ctx, drvPath, drv, []string{depOut}, log.logger())
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != workerproto.Built || res.ErrorMsg != "" {
				t.Fatalf("BuildDerivation: %s %q", res.Status, res.ErrorMsg)
			}
			if !log.has("building multi") {
				t.Errorf("the build's log did not arrive: %v", log.l)
			}

			for _, name := range []string{"out", "dev"} {
				p := drv.Outputs[name].Path
				valid, err := d.conn.IsValidPath(ctx, p)
				if err != nil || !valid {
					t.Fatalf("IsValidPath(%s) = %v, %v", p, valid, err)
				}
				info, ok, err := d.conn.QueryPathInfo(ctx, p)
				if err != nil || !ok {
					t.Fatalf("QueryPathInfo(%s): %v %v", p, ok, err)
				}
				hash, size, refs := d.pathInfoJSON(p)
				if info.NarHash != hash || info.NarSize != size || !slices.Equal(info.References, refs) || info.Deriver != drvPath {
					t.Errorf("QueryPathInfo(%s) = %+v; nix path-info says %s %d %v", p, info, hash, size, refs)
				}
				var nar bytes.Buffer
				if err := d.conn.NarFromPath(ctx, p, &nar); err != nil {
					t.Fatal(err)
				}
				if dump := d.dump(p); nar.String() != dump {
					t.Errorf("NarFromPath(%s): %d bytes differ from nix-store --dump (%d)", p, nar.Len(), len(dump))
				}
			}
			outInfo, _, _ := d.conn.QueryPathInfo(ctx, drv.Outputs["out"].Path)
			if !slices.Contains(outInfo.References, depOut) {
				t.Errorf("out's references %v lack %s", outInfo.References, depOut)
			}

			valid, err := d.conn.QueryValidPaths(ctx, []string{drv.Outputs["out"].Path, "/nix/store/00000000000000000000000000000000-nothing"})
			if err != nil || !slices.Equal(valid, []string{drv.Outputs["out"].Path}) {
				t.Errorf("QueryValidPaths = %v, %v", valid, err)
			}
			if err := d.conn.AddTempRoot(ctx, drv.Outputs["out"].Path); err != nil {
				t.Error(err)
			}
			// The connection survives an invalid path's info (not an error).
			_, ok, err := d.conn.QueryPathInfo(ctx, "/nix/store/00000000000000000000000000000000-nothing")
			if err != nil || ok {
				t.Errorf("QueryPathInfo of an invalid path: %v %v", ok, err)
			}
			var de *workerproto.Error
			if err := d.conn.NarFromPath(ctx, "/nix/store/00000000000000000000000000000000-nothing", &bytes.Buffer{}); !errors.As(err, &de) {
				t.Errorf("NarFromPath of an invalid path: %v, want a daemon error", err)
			}
			// The daemon drops the connection after that error: the client says so, and a new one works.
			if !d.conn.Broken() {
				t.Error("the connection is not marked broken after the daemon dropped it")
			}
			d.conn = d.open()
			if v, err := d.conn.IsValidPath(ctx, drvPath); err != nil || !v {
				t.Errorf("a new connection: IsValidPath = %v, %v", v, err)
			}

			// AddToStoreNar: the output's NAR into another store, which then knows it as the first did.
			other := newDaemon(t)
			var nar bytes.Buffer
			p := drv.Outputs["dev"].Path
			if err := d.conn.NarFromPath(ctx, p, &nar); err != nil {
				t.Fatal(err)
			}
			info, _, _ := d.conn.QueryPathInfo(ctx, p)
			if err := other.conn.AddToStoreNar(ctx, info, &nar, false); err != nil {
				t.Fatal(err)
			}
			got, ok, err := other.conn.QueryPathInfo(ctx, p)
			if err != nil || !ok || got.NarHash != info.NarHash || got.NarSize != info.NarSize {
				t.Errorf("after AddToStoreNar: %+v %v %v; want %+v", got, ok, err, info)
			}
			if other.dump(p) != d.dump(p) {
				t.Error("the added path's contents differ")
			}
			// A NAR that is not the declared one is refused, and nothing is added.
			bad := info
			bad.Path = drv.Outputs["out"].Path
			if err := other.conn.AddToStoreNar(ctx, bad, bytes.NewReader([]byte("not a nar")), false); err == nil {
				t.Error("AddToStoreNar accepted a NAR that is not the declared one")
			}
			if other.conn.Broken() {
				other.conn = other.open()
			}
			if v, err := other.conn.IsValidPath(ctx, bad.Path); err != nil || v {
				t.Errorf("after a refused AddToStoreNar: valid %v, %v", v, err)
			}
			// Signatures are checked unless told otherwise: an unsigned path is refused.
			third := newDaemon(t)
			nar.Reset()
			_ = d.conn.NarFromPath(ctx, p, &nar)
			if err := third.conn.AddToStoreNar(ctx, info, &nar, true); err == nil {
				t.Error("AddToStoreNar accepted an unsigned path with signatures checked")
			}
		})
	}
}

// TestBuildFailure: a failing build is a result with its status and error text; the connection
// goes on.
func TestBuildFailure(t *testing.T) {
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			d := newDaemonOn(t, st.system)
			ctx := context.Background()
			drvPath, drv := d.instantiate(shDrv("fails", salt(t), "echo about to fail; exit 3"))
			var log lines
			res, err := d.conn.BuildDerivation(ctx, drvPath, drv, nil, log.logger())
			if err != nil {
				t.Fatal(err)
			}
			if res.Status.Success() || !strings.Contains(res.ErrorMsg, "failed with exit code 3") {
				t.Errorf("a failing build: %s %q", res.Status, res.ErrorMsg)
			}
			if !log.has("about to fail") {
				t.Errorf("its log did not arrive: %v", log.l)
			}
			if v, err := d.conn.IsValidPath(ctx, drvPath); err != nil || !v {
				t.Errorf("after a failed build: %v %v", v, err)
			}
		})
	}
}

// TestBuildLimits: the daemon's own limits end a build with their status.
func TestBuildLimits(t *testing.T) {
	for _, tt := range []struct {
		name    string
		opts    workerproto.Options
		script  string
		status  workerproto.BuildStatus
		message string
	}{
		{"timeout", workerproto.Options{MaxBuildJobs: 1, Overrides: map[string]string{"timeout": "1"}},
			"while :; do :; done", workerproto.TimedOut, "timed out"},
		{"max-silent", workerproto.Options{MaxBuildJobs: 1, MaxSilentTime: time.Second},
			"while :; do :; done", workerproto.TimedOut, "of silence"},
		{"log size", workerproto.Options{MaxBuildJobs: 1, Overrides: map[string]string{"max-build-log-size": "1000"}},
			"while :; do echo 0123456789012345678901234567890123456789; done", workerproto.LogLimitExceeded, "log"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := newDaemon(t)
			ctx := context.Background()
			if err := d.conn.SetOptions(ctx, tt.opts); err != nil {
				t.Fatal(err)
			}
			drvPath, drv := d.instantiate(shDrv("limited", salt(t), tt.script))
			res, err := d.conn.BuildDerivation(ctx, drvPath, drv, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != tt.status || !strings.Contains(res.ErrorMsg, tt.message) {
				t.Errorf("%s %q; want %s, %q", res.Status, res.ErrorMsg, tt.status, tt.message)
			}
		})
	}
}

// TestStoppedBuildIsGone: a build stopped mid-way, by cancelling its context (which closes the
// connection) or by stopping its daemon (SIGTERM, as a service manager would), is gone with all
// its processes; the operation returns instead of hanging, the old connection is of no further
// use, and a new connection works.
func TestStoppedBuildIsGone(t *testing.T) {
	for _, st := range stores {
		for _, how := range []string{"cancel", "sigterm"} {
			t.Run(st.name+"/"+how, func(t *testing.T) {
				d := newDaemonOn(t, st.system)
				marker := salt(t)
				drvPath, drv := d.instantiate(shDrv("endless", marker, "echo started; : "+marker+"; while :; do :; done"))
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				var log lines
				done := make(chan error, 1)
				go func() {
					_, err := d.conn.BuildDerivation(ctx, drvPath, drv, nil, log.logger())
					done <- err
				}()
				waittest.For(t, 30*time.Second, func() bool { return log.has("started") }, "the build to start")
				if n := processesWith(marker); n == 0 {
					t.Fatal("no process of the build found")
				}
				if how == "cancel" {
					cancel()
				} else if err := syscall.Kill(d.conn.Pid(), syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
				select {
				case err := <-done:
					if how == "cancel" && !errors.Is(err, context.Canceled) || err == nil {
						t.Errorf("the stopped build returned %v", err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the stopped build did not return")
				}
				waittest.For(t, 10*time.Second, func() bool { return processesWith(marker) == 0 }, "the build's processes to end")
				if how == "cancel" && !d.conn.Broken() {
					t.Error("the connection is still usable after a cancel")
				}
				// A cancel closes the connection; a stopped daemon said why (its error) and
				// exited: either way the next operation fails, it does not hang.
				if _, err := d.conn.IsValidPath(context.Background(), drvPath); err == nil {
					t.Error("the old connection still answers")
				}
				c := d.open()
				if v, err := c.IsValidPath(context.Background(), drvPath); err != nil || !v {
					t.Errorf("a new connection: %v %v", v, err)
				}
			})
		}
	}
}

// processesWith counts the processes whose command line contains s.
func processesWith(s string) int {
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	n := 0
	for _, f := range dirs {
		if b, err := os.ReadFile(f); err == nil && bytes.Contains(b, []byte(s)) {
			n++
		}
	}
	return n
}

// TestTempRootHoldsWhileConnected: a temporary root keeps a path from the garbage collector for
// as long as its connection lasts.
func TestTempRootHoldsWhileConnected(t *testing.T) {
	d := newDaemon(t)
	ctx := context.Background()
	src := filepath.Join(t.TempDir(), "garbage.txt")
	if err := os.WriteFile(src, []byte(salt(t)), 0o644); err != nil {
		t.Fatal(err)
	}
	p := strings.TrimSpace(d.nixOut("nix-store", "--add", src))
	if err := d.conn.AddTempRoot(ctx, p); err != nil {
		t.Fatal(err)
	}
	d.nixOut("nix-store", "--gc")
	if v, err := d.conn.IsValidPath(ctx, p); err != nil || !v {
		t.Fatalf("a temporarily rooted path was collected: %v %v", v, err)
	}
	d.conn.Close()
	d.nixOut("nix-store", "--gc")
	c := d.open()
	if v, err := c.IsValidPath(ctx, p); err != nil || v {
		t.Errorf("the path outlived its connection's root: %v %v", v, err)
	}
}
