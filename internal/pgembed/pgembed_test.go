package pgembed

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// testDir returns a fresh directory the server user can reach. t.TempDir's per-test parent
// is 0700, which as root would (rightly) fail the reachability check.
func testDir(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	if os.Geteuid() == 0 {
		if err := os.Chmod(filepath.Dir(d), 0o711); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func startServer(t *testing.T, dir string) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s, err := Start(ctx, Options{Dir: dir, Logger: quiet})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	return s
}

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func TestLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := testDir(t)

	first := startServer(t, dir)
	t.Cleanup(func() { first.Stop() })
	if !first.Owned() {
		t.Fatal("first Start should own the server")
	}
	conn := connect(t, first.URL("harmonia"))
	var version string
	if err := conn.QueryRow(ctx, "SELECT version()").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(version, "PostgreSQL") {
		t.Fatalf("version() = %q", version)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE survivor (x int); INSERT INTO survivor VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)

	// A second Start while it runs attaches, and its Stop leaves the server alone.
	second := startServer(t, dir)
	if second.Owned() {
		t.Fatal("second Start should attach, not own")
	}
	if second.URL("harmonia") != first.URL("harmonia") {
		t.Fatalf("attached URL %q differs from %q", second.URL("harmonia"), first.URL("harmonia"))
	}
	if err := second.Stop(); err != nil {
		t.Fatalf("attached Stop: %v", err)
	}
	connect(t, first.URL("harmonia")).Close(ctx)

	if err := first.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := first.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if running, err := first.running(ctx); err != nil || running {
		t.Fatalf("after Stop: running=%v err=%v", running, err)
	}

	// Starting again reuses the cluster rather than running initdb over it.
	third := startServer(t, dir)
	t.Cleanup(func() { third.Stop() })
	if !third.Owned() {
		t.Fatal("restart should own the server")
	}
	var x int
	if err := connect(t, third.URL("harmonia")).QueryRow(ctx, "SELECT x FROM survivor").Scan(&x); err != nil || x != 42 {
		t.Fatalf("table from before the restart: x=%d err=%v", x, err)
	}
	if err := third.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
}

func TestLongDirUsesShortSocketDir(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(testDir(t), strings.Repeat("a-rather-long-state-directory-name/", 4))
	if len(dir) <= 110 {
		t.Fatalf("test dir too short: %d", len(dir))
	}
	s := startServer(t, dir)
	t.Cleanup(func() { s.Stop() })
	if !strings.HasPrefix(s.socketDir, "/tmp/hci-pg-") {
		t.Fatalf("socket dir %q, want the /tmp fallback", s.socketDir)
	}
	var one int
	if err := connect(t, s.URL("harmonia")).QueryRow(context.Background(), "SELECT 1").Scan(&one); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.socketDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("short socket dir left behind: %v", err)
	}
}

func TestMissingBinaries(t *testing.T) {
	empty := t.TempDir()
	_, err := findBinaries(empty, filepath.Join(empty, "nothing-*", "bin"))
	want := `embedded PostgreSQL needs the server binaries (initdb, pg_ctl, postgres): install the Debian package "postgresql" (apt-get install postgresql)`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want it to contain %q", err, want)
	}
}

func TestFindBinariesPrefersHighestVersion(t *testing.T) {
	root := t.TempDir()
	for _, v := range []string{"9.6", "15", "13"} {
		bin := filepath.Join(root, v, "bin")
		if err := os.MkdirAll(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
			if err := os.WriteFile(filepath.Join(bin, name), nil, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A $PATH pg_ctl without its siblings (like Debian's /usr/local/bin symlinks to a
	// wrapper) does not count.
	path := t.TempDir()
	if err := os.WriteFile(filepath.Join(path, "pg_ctl"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := findBinaries(path, filepath.Join(root, "*", "bin"))
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(root, "15", "bin", "postgres"); b.Postgres != want {
		t.Fatalf("Postgres = %q, want %q", b.Postgres, want)
	}
	// A symlinked pg_ctl on $PATH leads to its real directory.
	if err := os.Remove(filepath.Join(path, "pg_ctl")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "13", "bin", "pg_ctl"), filepath.Join(path, "pg_ctl")); err != nil {
		t.Fatal(err)
	}
	b, err = findBinaries(path, filepath.Join(root, "*", "bin"))
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(root, "13", "bin", "initdb"); b.Initdb != want {
		t.Fatalf("Initdb = %q, want %q", b.Initdb, want)
	}
}

func TestRootWithoutPostgresUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root switches to the postgres user")
	}
	_, err := currentIdentity(func(string) (*user.User, error) { return nil, user.UnknownUserError("postgres") })
	want := `embedded PostgreSQL: running as root needs the unprivileged "postgres" system user (created by the postgresql package)`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want it to contain %q", err, want)
	}
}

func TestUnreachableDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root runs the server as another user")
	}
	private := t.TempDir()
	if err := os.Chmod(private, 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := Start(context.Background(), Options{Dir: filepath.Join(private, "state"), Logger: quiet})
	want := "the postgres user cannot reach " + filepath.Join(private, "state") + " (parent " + private + " is not searchable)"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want it to contain %q", err, want)
	}
}

func TestMajorVersion(t *testing.T) {
	for in, want := range map[string]string{
		"pg_ctl (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)\n": "15",
		"pg_ctl (PostgreSQL) 9.6.24\n":                         "9.6",
		"pg_ctl (PostgreSQL) 17devel\n":                        "17",
		"something else":                                       "",
	} {
		if got := majorVersion(in); got != want {
			t.Errorf("majorVersion(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestStartFailureQuotesLog(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// Above PostgreSQL's limit for max_connections, so the server refuses to start.
	s, err := Start(ctx, Options{Dir: testDir(t), MaxConnections: 1 << 20, Logger: quiet})
	if err == nil {
		s.Stop()
		t.Fatal("Start succeeded with an impossible max_connections")
	}
	if !strings.Contains(err.Error(), "max_connections") {
		t.Fatalf("error does not quote the server log: %v", err)
	}
}

func TestConcurrentStart(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	const n = 4
	servers := make(chan *Server, n)
	errs := make(chan error, n)
	for range n {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			s, err := Start(ctx, Options{Dir: dir, Logger: quiet})
			servers <- s
			errs <- err
		}()
	}
	var owners []*Server
	var all []*Server
	for range n {
		s, err := <-servers, <-errs
		if err != nil {
			t.Errorf("start: %v", err)
			continue
		}
		all = append(all, s)
		if s.Owned() {
			owners = append(owners, s)
		}
	}
	t.Cleanup(func() {
		for _, s := range all {
			s.Stop()
		}
	})
	if len(owners) != 1 {
		t.Fatalf("%d servers own the cluster, want exactly 1", len(owners))
	}
}
