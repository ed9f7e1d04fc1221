// Package pgembed runs a private PostgreSQL server from the server binaries installed on the
// machine: harmonia-ci's embedded default and the test suite's database.
//
// Everything lives under one directory: the cluster in Dir/data, the server log in
// Dir/postgres.log and the Unix socket in Dir/run (or a short /tmp directory when that path
// would overflow sun_path). The server listens on no TCP address and trusts local connections,
// so the socket directory's permissions are the only access control.
package pgembed

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const (
	// superuser is the bootstrap role initdb creates; trust auth needs no password.
	superuser = "harmonia"
	// database is the application database Start creates.
	database = "harmonia"
	// port only names the socket file (run/.s.PGSQL.5432): there is no TCP listener, so
	// servers in different directories never collide.
	port = 5432
	// maxSocketPath keeps the socket path clear of the 107-byte sun_path limit.
	maxSocketPath = 100
	// pgCtlTimeout is pg_ctl's -t for start and stop, in seconds.
	pgCtlTimeout = 60
	// logTailLines is how much of postgres.log a start failure quotes.
	logTailLines = 20
	// includeFile is the configuration pgembed rewrites on every start it performs, so
	// changed Options take effect; postgresql.conf includes it once, at init.
	includeFile = "pgembed.conf"
)

// Options configures Start.
type Options struct {
	// Dir holds everything: Dir/data (the cluster), Dir/postgres.log, and the Unix socket
	// directory Dir/run. Created if missing.
	Dir string
	// Durable keeps fsync and full_page_writes on. Tests set false: fsync=off,
	// synchronous_commit=off, full_page_writes=off.
	Durable bool
	// MaxConnections is max_connections; default 300.
	MaxConnections int
	// Logger for start/stop messages; nil means slog.Default().
	Logger *slog.Logger
}

// Server is a running private PostgreSQL, started or attached to by Start.
type Server struct {
	dir       string
	dataDir   string
	logFile   string
	socketDir string
	port      int
	shortSock bool // socketDir is the /tmp fallback, removed when the owner stops
	owned     bool
	bins      Binaries
	id        identity
	logger    *slog.Logger

	stopOnce sync.Once
	stopErr  error
}

// Start initialises the cluster on first use (initdb -U harmonia --auth=trust -E UTF8
// --no-locale, plus --no-sync when !Durable), configures it, starts it with pg_ctl (-w, a 60 s
// timeout), and creates the database "harmonia" if missing. If a server is already running on
// that data directory (for example `harmonia-ci up` in another process), Start attaches to it
// instead and Stop will leave it running. Concurrent Start calls on one Dir, from any number of
// processes, are serialised by an flock on Dir/pgembed.lock.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if opts.Dir == "" {
		return nil, errors.New("embedded PostgreSQL: no directory given")
	}
	if opts.MaxConnections <= 0 {
		opts.MaxConnections = 300
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	bins, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	id, err := currentIdentity(lookupUser)
	if err != nil {
		return nil, err
	}
	dir, err := prepareDir(opts.Dir, id)
	if err != nil {
		return nil, err
	}
	s := &Server{
		dir:     dir,
		dataDir: filepath.Join(dir, "data"),
		logFile: filepath.Join(dir, "postgres.log"),
		port:    port,
		bins:    bins,
		id:      id,
		logger:  logger,
	}
	s.socketDir, s.shortSock = socketDirFor(dir, s.dataDir)

	unlock, err := lockFile(ctx, filepath.Join(dir, "pgembed.lock"))
	if err != nil {
		return nil, fmt.Errorf("embedded PostgreSQL: lock %s: %w", dir, err)
	}
	defer unlock()

	initialised, err := exists(filepath.Join(s.dataDir, "PG_VERSION"))
	if err != nil {
		return nil, fmt.Errorf("embedded PostgreSQL: %w", err)
	}
	if initialised {
		running, err := s.running(ctx)
		if err != nil {
			return nil, err
		}
		if running {
			return s.attach(ctx)
		}
	} else if err := s.initdb(ctx, opts.Durable); err != nil {
		return nil, err
	}

	if err := s.start(ctx, opts); err != nil {
		return nil, err
	}
	s.owned = true
	if err := s.ensureDatabase(ctx); err != nil {
		// Don't leave a server behind that nobody will stop.
		if stopErr := s.pgCtlStop(context.WithoutCancel(ctx)); stopErr != nil {
			s.logger.Warn("stop embedded PostgreSQL after failed start", "dir", s.dir, "err", stopErr)
		}
		return nil, err
	}
	s.logger.Info("embedded PostgreSQL started", "dir", s.dir, "socket_dir", s.socketDir)
	return s, nil
}

// URL returns a libpq/pgx connection URL for database dbname over the Unix socket.
func (s *Server) URL(dbname string) string {
	return fmt.Sprintf("postgres://%s@/%s?host=%s&port=%d&sslmode=disable",
		superuser, url.PathEscape(dbname), url.QueryEscape(s.socketDir), s.port)
}

// Owned reports whether this process started the server (and so Stop will stop it).
func (s *Server) Owned() bool { return s != nil && s.owned }

// Stop stops the server if this process started it (pg_ctl stop -m fast -w). A server Start
// attached to is left running. Stop is idempotent and safe on a nil Server.
func (s *Server) Stop() error {
	if s == nil {
		return nil
	}
	s.stopOnce.Do(func() {
		if !s.owned {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*pgCtlTimeout*time.Second)
		defer cancel()
		// Under the lock, so a concurrent Start does not attach to a server going away.
		unlock, err := lockFile(ctx, filepath.Join(s.dir, "pgembed.lock"))
		if err != nil {
			s.stopErr = fmt.Errorf("stop embedded PostgreSQL: lock %s: %w", s.dir, err)
			return
		}
		defer unlock()
		if err := s.pgCtlStop(ctx); err != nil {
			s.stopErr = err
			return
		}
		if s.shortSock {
			// Empty once the server is down; best effort, the next start recreates it.
			_ = os.Remove(s.socketDir)
		}
		s.logger.Info("embedded PostgreSQL stopped", "dir", s.dir)
	})
	return s.stopErr
}

// attach adopts a server someone else started on this data directory.
func (s *Server) attach(ctx context.Context) (*Server, error) {
	// The running server's own record beats our derivation: it may have been started with
	// another path to the same directory.
	if sock, p, ok := readPostmasterPID(filepath.Join(s.dataDir, "postmaster.pid")); ok {
		s.socketDir, s.port = sock, p
	}
	if err := s.ensureDatabase(ctx); err != nil {
		return nil, fmt.Errorf("attach to running embedded PostgreSQL in %s: %w", s.dir, err)
	}
	s.logger.Info("attached to running embedded PostgreSQL", "dir", s.dir, "socket_dir", s.socketDir)
	return s, nil
}

// initdb creates the cluster in a scratch directory and renames it into place, so Dir/data
// exists only once it is complete and a crash mid-init leaves nothing to trip over.
func (s *Server) initdb(ctx context.Context, durable bool) error {
	tmp := s.dataDir + ".init"
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("embedded PostgreSQL: remove leftover %s: %w", tmp, err)
	}
	if err := s.id.mkdir(tmp); err != nil {
		return fmt.Errorf("embedded PostgreSQL: %w", err)
	}
	args := []string{"-D", tmp, "-U", superuser, "--auth=trust", "-E", "UTF8", "--no-locale"}
	if !durable {
		args = append(args, "--no-sync")
	}
	if out, err := s.id.command(ctx, s.bins.Initdb, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("embedded PostgreSQL: initdb: %w: %s", err, lastLines(string(out), logTailLines))
	}
	f, err := os.OpenFile(filepath.Join(tmp, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("embedded PostgreSQL: configure: %w", err)
	}
	_, err = fmt.Fprintf(f, "\n# harmonia-ci: settings managed by pgembed, rewritten on every start.\ninclude = '%s'\n", includeFile)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("embedded PostgreSQL: configure: %w", err)
	}
	if err := os.Rename(tmp, s.dataDir); err != nil {
		return fmt.Errorf("embedded PostgreSQL: %w", err)
	}
	s.logger.Info("embedded PostgreSQL cluster initialised", "dir", s.dataDir)
	return nil
}

// start configures and starts a cluster that is initialised but not running.
func (s *Server) start(ctx context.Context, opts Options) error {
	if err := s.checkVersion(ctx); err != nil {
		return err
	}
	if err := s.writeConfig(opts); err != nil {
		return fmt.Errorf("embedded PostgreSQL: configure: %w", err)
	}
	if err := s.prepareSocketDir(); err != nil {
		return fmt.Errorf("embedded PostgreSQL: %w", err)
	}
	// pg_ctl opens the log as the server user, which may not create files in Dir.
	lf, err := os.OpenFile(s.logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("embedded PostgreSQL: %w", err)
	}
	logStart, _ := lf.Seek(0, 2)
	lf.Close()
	if err := s.id.chown(s.logFile); err != nil {
		return fmt.Errorf("embedded PostgreSQL: %w", err)
	}

	out, err := s.id.command(ctx, s.bins.PgCtl, "start", "-D", s.dataDir, "-l", s.logFile,
		"-w", "-t", strconv.Itoa(pgCtlTimeout), "-s").CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if tail := s.logTail(logStart); tail != "" {
			msg += "\n" + s.logFile + ":\n" + tail
		}
		return fmt.Errorf("start postgres: %w: %s", err, msg)
	}
	return nil
}

// checkVersion turns "database files are incompatible with server" into advice.
func (s *Server) checkVersion(ctx context.Context) error {
	raw, err := os.ReadFile(filepath.Join(s.dataDir, "PG_VERSION"))
	if err != nil {
		return fmt.Errorf("embedded PostgreSQL: %w", err)
	}
	cluster := strings.TrimSpace(string(raw))
	out, err := s.id.command(ctx, s.bins.PgCtl, "--version").Output()
	if err != nil {
		return fmt.Errorf("embedded PostgreSQL: %s --version: %w", s.bins.PgCtl, err)
	}
	binary := majorVersion(string(out))
	if binary != "" && binary != cluster {
		return fmt.Errorf("embedded PostgreSQL: the cluster in %s was created by PostgreSQL %s but the server binaries in %s are PostgreSQL %s: install PostgreSQL %s's server or upgrade the cluster with pg_upgrade",
			s.dataDir, cluster, filepath.Dir(s.bins.PgCtl), binary, cluster)
	}
	return nil
}

// majorVersion extracts "15" from "pg_ctl (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)".
func majorVersion(out string) string {
	_, rest, ok := strings.Cut(out, "(PostgreSQL) ")
	if !ok {
		return ""
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return ""
	}
	// Keep the numeric prefix: "15.14", "9.6.24", "17devel" -> "17".
	v := f[0]
	if i := strings.IndexFunc(v, func(r rune) bool { return r != '.' && (r < '0' || r > '9') }); i >= 0 {
		v = v[:i]
	}
	parts := strings.Split(v, ".")
	// From 10 on the major version is one number; before it, two.
	if n, err := strconv.Atoi(parts[0]); err == nil && n < 10 && len(parts) >= 2 {
		return parts[0] + "." + parts[1]
	}
	return parts[0]
}

func (s *Server) writeConfig(opts Options) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by harmonia-ci (internal/pgembed) on every start; edits are lost.\n")
	fmt.Fprintf(&b, "listen_addresses = ''\n")
	fmt.Fprintf(&b, "port = %d\n", s.port)
	fmt.Fprintf(&b, "unix_socket_directories = %s\n", confQuote(s.socketDir))
	fmt.Fprintf(&b, "unix_socket_permissions = 0700\n")
	fmt.Fprintf(&b, "max_connections = %d\n", opts.MaxConnections)
	fmt.Fprintf(&b, "shared_buffers = 128MB\n")
	// The queue's ready index keeps a claimed job's entry until VACUUM, and every claim walks
	// over those: at 100,000 queued jobs the default minute between autovacuum's visits doubled
	// a claim's pages (see docs/benchmarks.md, the queue).
	fmt.Fprintf(&b, "autovacuum_naptime = 5s\n")
	fmt.Fprintf(&b, "log_min_messages = warning\n")
	fmt.Fprintf(&b, "log_line_prefix = '%%m [%%p] '\n")
	if opts.Durable {
		fmt.Fprintf(&b, "fsync = on\nsynchronous_commit = on\nfull_page_writes = on\n")
	} else {
		fmt.Fprintf(&b, "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n")
	}
	p := filepath.Join(s.dataDir, includeFile)
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		return err
	}
	return s.id.chown(p)
}

// confQuote quotes a postgresql.conf string value.
func confQuote(v string) string {
	return "'" + strings.ReplaceAll(v, "'", "''") + "'"
}

// prepareSocketDir makes the socket directory, private to the server user. The /tmp fallback
// sits in a world-writable directory, so one that someone else made is refused, not reused.
func (s *Server) prepareSocketDir() error {
	if !s.shortSock {
		if err := s.id.mkdir(s.socketDir); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		if err := s.id.chown(s.socketDir); err != nil {
			return err
		}
		return os.Chmod(s.socketDir, 0o700)
	}
	err := s.id.mkdir(s.socketDir)
	if err == nil || !errors.Is(err, os.ErrExist) {
		return err
	}
	fi, err := os.Lstat(s.socketDir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != s.id.uid || fi.Mode().Perm() != 0o700 {
		return fmt.Errorf("socket directory %s exists but is not a private directory of uid %d; remove it", s.socketDir, s.id.uid)
	}
	return nil
}

// running asks pg_ctl whether a server runs on the data directory.
func (s *Server) running(ctx context.Context) (bool, error) {
	out, err := s.id.command(ctx, s.bins.PgCtl, "status", "-D", s.dataDir).CombinedOutput()
	if err == nil {
		return true, nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 3 { // 3: no server running
		return false, nil
	}
	return false, fmt.Errorf("embedded PostgreSQL: pg_ctl status: %w: %s", err, strings.TrimSpace(string(out)))
}

func (s *Server) pgCtlStop(ctx context.Context) error {
	out, err := s.id.command(ctx, s.bins.PgCtl, "stop", "-D", s.dataDir, "-m", "fast",
		"-w", "-t", strconv.Itoa(pgCtlTimeout), "-s").CombinedOutput()
	if err == nil {
		return nil
	}
	// Already down (stopped by hand, crashed): the goal is reached.
	if running, serr := s.running(ctx); serr == nil && !running {
		return nil
	}
	return fmt.Errorf("stop postgres: %w: %s", err, strings.TrimSpace(string(out)))
}

// ensureDatabase creates the application database unless it exists. It waits, up to a
// deadline, for a server that is still starting up (one started outside pgembed).
func (s *Server) ensureDatabase(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := connectWhenReady(ctx, s.URL("postgres"))
	if err != nil {
		return fmt.Errorf("connect to postgres: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var one int
	err = conn.QueryRow(ctx, sqlDatabaseExists, database).Scan(&one)
	if err == nil {
		return nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("look up database %q: %w", database, err)
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{database}.Sanitize())
	var pgErr *pgconn.PgError
	if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42P04") { // duplicate_database: a concurrent creator won
		return fmt.Errorf("create database %q: %w", database, err)
	}
	return nil
}

func connectWhenReady(ctx context.Context, dsn string) (*pgx.Conn, error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		conn, err := pgx.Connect(ctx, dsn)
		if err == nil {
			return conn, nil
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code != "57P03" { // only cannot_connect_now is worth waiting for
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-tick.C:
		}
	}
}

// logTail returns the last lines the server logged since offset.
func (s *Server) logTail(offset int64) string {
	f, err := os.Open(s.logFile)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() < offset {
		offset = 0 // truncated or replaced
	}
	if _, err := f.Seek(offset, 0); err != nil {
		return ""
	}
	buf := make([]byte, 64<<10)
	n, _ := f.Read(buf)
	return lastLines(string(buf[:n]), logTailLines)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// socketDirFor picks Dir/run, or, when the socket path would not fit in sun_path, a short
// directory derived from the data directory alone, so every process finds the same one
// without any record of it.
func socketDirFor(dir, dataDir string) (string, bool) {
	run := filepath.Join(dir, "run")
	if len(run+"/.s.PGSQL."+strconv.Itoa(port)) <= maxSocketPath {
		return run, false
	}
	sum := sha256.Sum256([]byte(dataDir))
	// Not os.TempDir: $TMPDIR may itself be long.
	return "/tmp/hci-pg-" + hex.EncodeToString(sum[:])[:12], true
}

// readPostmasterPID reads the port (line 4) and first socket directory (line 5) a running
// server recorded in postmaster.pid.
func readPostmasterPID(path string) (socketDir string, port int, ok bool) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", 0, false
	}
	lines := strings.Split(string(raw), "\n")
	if len(lines) < 5 {
		return "", 0, false
	}
	p, err := strconv.Atoi(strings.TrimSpace(lines[3]))
	sock := strings.TrimSpace(lines[4])
	if err != nil || sock == "" {
		return "", 0, false
	}
	return sock, p, true
}

func exists(p string) (bool, error) {
	_, err := os.Stat(p)
	if err == nil {
		return true, nil
	}
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return false, err
}
