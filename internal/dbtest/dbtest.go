// Package dbtest gives tests a real PostgreSQL: one private server per test binary and a fresh
// database per test, cloned from a template that is migrated once.
//
// A package that uses it runs its tests through Main:
//
//	func TestMain(m *testing.M) { dbtest.Main(m) }
//
// and each test asks for its own database with NewDB or NewPool. Cloning the migrated template
// takes tens to hundreds of milliseconds instead of a full migration, so tests need not share
// state and can run in parallel.
package dbtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	neturl "net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/pgembed"
)

const templateDB = "harmonia_template"

// The private server, started on first use and shared by every test in the binary.
var (
	// stateMu orders startServer against shutdown, which may run on a signal goroutine.
	stateMu    sync.Mutex
	closed     bool
	serverOnce sync.Once
	serverDir  string
	server     *pgembed.Server
	admin      *pgxpool.Pool // on database "postgres": creates and drops test databases
	serverErr  error

	templateOnce sync.Once
	templateErr  error

	// createMu serialises CREATE DATABASE: concurrent clones of one template collide on it.
	createMu sync.Mutex
	dbCount  atomic.Int64
)

// Main runs the package's tests and stops the private server afterwards, then runs after
// (cleanups of other test fixtures, such as proctest.Cleanup). It calls os.Exit.
func Main(m *testing.M, after ...func()) {
	// The server outlives a killed test binary (pg_ctl detaches it), so an interrupt stops it
	// before exiting. A test timeout panic still leaks it: nothing runs after that.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		signal.Stop(sigs) // a second interrupt kills at once
		if err := shutdown(); err != nil {
			fmt.Fprintf(os.Stderr, "dbtest: %v\n", err)
		}
		fmt.Fprintf(os.Stderr, "dbtest: %v: stopped the test PostgreSQL\n", sig)
		os.Exit(1)
	}()

	code := m.Run()
	signal.Stop(sigs)
	if err := shutdown(); err != nil {
		fmt.Fprintf(os.Stderr, "dbtest: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	for _, f := range after {
		f()
	}
	os.Exit(code)
}

// shutdown stops the server and removes its directory. It holds stateMu, so it waits for a
// start in progress and a later start finds the server gone for good.
func shutdown() error {
	stateMu.Lock()
	defer stateMu.Unlock()
	closed = true
	if admin != nil {
		admin.Close()
	}
	err := server.Stop()
	if serverDir != "" {
		if rerr := os.RemoveAll(serverDir); rerr != nil && err == nil {
			err = fmt.Errorf("remove %s: %w", serverDir, rerr)
		}
	}
	return err
}

func startServer() {
	stateMu.Lock()
	defer stateMu.Unlock()
	if closed {
		serverErr = errors.New("test PostgreSQL already shut down")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	reapOrphans()
	// A short path keeps the socket in the directory itself, not the /tmp fallback.
	serverDir, serverErr = os.MkdirTemp("", "hci-pg-")
	if serverErr != nil {
		serverErr = fmt.Errorf("create server directory: %w", serverErr)
		return
	}
	server, serverErr = pgembed.Start(ctx, pgembed.Options{
		Dir:            serverDir,
		Durable:        false,
		MaxConnections: 300,
		// Start/stop chatter would land in every failing test's output.
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if serverErr != nil {
		serverErr = fmt.Errorf("start test PostgreSQL: %w", serverErr)
		return
	}
	// Record the owner: a test binary killed by its timeout panic runs no cleanup, and the next
	// test binary stops what it left behind.
	_ = os.WriteFile(filepath.Join(serverDir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644)
	admin, serverErr = pgxpool.New(ctx, server.URL("postgres"))
	if serverErr != nil {
		serverErr = fmt.Errorf("connect to test PostgreSQL: %w", serverErr)
	}
}

// migrateTemplate creates the template database and migrates it; every test database is a
// copy of it.
func migrateTemplate() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{templateDB}.Sanitize()); err != nil {
		return fmt.Errorf("create template database: %w", err)
	}
	pool, err := pgxpool.New(ctx, server.URL(templateDB))
	if err != nil {
		return fmt.Errorf("connect to template database: %w", err)
	}
	_, err = db.Migrate(ctx, pool, "dbtest")
	// CREATE DATABASE ... TEMPLATE refuses while anyone is connected to the template.
	pool.Close()
	if err != nil {
		return fmt.Errorf("migrate template database: %w", err)
	}
	// Nobody may connect from now on, so no stray session can block a clone.
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{templateDB}.Sanitize()+" WITH ALLOW_CONNECTIONS false"); err != nil {
		return fmt.Errorf("seal template database: %w", err)
	}
	return nil
}

func ready(t testing.TB) {
	t.Helper()
	serverOnce.Do(startServer)
	if serverErr != nil {
		t.Fatalf("dbtest: %v", serverErr)
	}
}

// NewDB creates a fresh database cloned from the migrated template and returns its URL.
// The database is dropped in t.Cleanup (DROP DATABASE ... WITH (FORCE)).
func NewDB(t testing.TB) string {
	t.Helper()
	ready(t)
	templateOnce.Do(func() { templateErr = migrateTemplate() })
	if templateErr != nil {
		t.Fatalf("dbtest: %v", templateErr)
	}
	return createDB(t, templateDB)
}

// NewEmptyDB creates a fresh database without the schema (for tests of migration itself) and
// returns its URL. It is dropped in t.Cleanup.
func NewEmptyDB(t testing.TB) string {
	t.Helper()
	ready(t)
	return createDB(t, "template0")
}

func createDB(t testing.TB, template string) string {
	t.Helper()
	name := dbName(t.Name(), dbCount.Add(1))
	ident := pgx.Identifier{name}.Sanitize()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	createMu.Lock()
	_, err := admin.Exec(ctx, "CREATE DATABASE "+ident+" TEMPLATE "+pgx.Identifier{template}.Sanitize())
	createMu.Unlock()
	if err != nil {
		t.Fatalf("dbtest: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		// Not t.Context(): it is already cancelled when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
			t.Errorf("dbtest: drop database %s: %v", name, err)
		}
	})
	return server.URL(name)
}

// NewPool returns a pgxpool on a fresh database (closed in t.Cleanup before the drop).
func NewPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	url := NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatalf("dbtest: open pool: %v", err)
	}
	// Registered after NewDB's drop, so it runs first.
	t.Cleanup(pool.Close)
	return pool
}

// PoolAs connects to the database at dbURL as user (the URL's own user if ""), for tests that
// run statements under a role's own login. The pool is closed in t.Cleanup.
func PoolAs(t testing.TB, dbURL, user string) *pgxpool.Pool {
	t.Helper()
	u, err := neturl.Parse(dbURL)
	if err != nil {
		t.Fatalf("dbtest: parse %q: %v", dbURL, err)
	}
	if user != "" {
		u.User = neturl.User(user)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatalf("dbtest: open pool as %q: %v", user, err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// ServerURL returns the URL of the private server's maintenance database "postgres" (for tests
// that need pg_terminate_backend etc. across databases).
func ServerURL(t testing.TB) string {
	t.Helper()
	ready(t)
	return server.URL("postgres")
}

// dbName derives a database name from the test name: "t_", the name lowercased with anything
// outside [a-z0-9_] turned into "_" (runs collapsed) and cut to 40 bytes, then a counter that
// keeps it unique. The result stays well inside PostgreSQL's 63-byte identifier limit.
func dbName(testName string, n int64) string {
	var b strings.Builder
	lastUnderscore := true // also drops leading underscores
	for _, r := range strings.ToLower(testName) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
			lastUnderscore = false
		} else if !lastUnderscore {
			b.WriteByte('_')
			lastUnderscore = true
		}
		if b.Len() >= 40 {
			break
		}
	}
	s := strings.TrimRight(b.String(), "_")
	if len(s) > 40 {
		s = s[:40]
	}
	return "t_" + s + "_" + strconv.FormatInt(n, 10)
}

const ownerFile = "dbtest.owner"

// reapOrphans stops and removes the servers of test binaries that died without cleaning up.
func reapOrphans() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "hci-pg-*", ownerFile))
	for _, f := range dirs {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil || pid <= 0 || syscall.Kill(pid, 0) == nil {
			continue // malformed, or its owner still runs
		}
		dir := filepath.Dir(f)
		bins, err := pgembed.FindBinaries()
		if err == nil {
			_ = exec.Command(bins.PgCtl, "-D", filepath.Join(dir, "data"), "-m", "immediate", "stop").Run()
			if os.Geteuid() == 0 { // pg_ctl refuses root; the server runs as postgres
				_ = exec.Command("runuser", "-u", "postgres", "--", bins.PgCtl, "-D", filepath.Join(dir, "data"), "-m", "immediate", "stop").Run()
			}
		}
		_ = os.RemoveAll(dir)
	}
}
