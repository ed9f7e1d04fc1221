// Package nixdaemon runs a private nix-daemon on a socket of its own. Processes that must not
// touch the Nix store directly — the evaluator's Nix, which runs project code as an unprivileged
// user — reach the store through it (NIX_REMOTE=daemon with NIX_DAEMON_SOCKET_PATH): the daemon
// treats them as untrusted clients, builds their imports-from-derivation in the sandbox as build
// users, and is the only thing with write access to the store.
package nixdaemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Config configures a Daemon.
type Config struct {
	// Bin is nix-daemon; default from PATH.
	Bin string
	// Options are the daemon's settings as "--option" pairs (sandbox, build users, substituters).
	Options [][2]string
	// Store is passed as --store when set (a chroot store).
	Store string
	// Env is the daemon's environment besides NIX_DAEMON_SOCKET_PATH; nil: PATH and TMPDIR.
	Env []string
	// StartTimeout bounds the wait for the socket; default 10s.
	StartTimeout time.Duration
	// Dir is where the socket goes (made 0711 if missing), so a node that was killed leaves
	// nothing behind that its next start does not reuse. "" or a path too long for a socket:
	// a temporary directory, removed by Close.
	Dir string
}

// maxSocketPath keeps the socket's path clear of the 107-byte sun_path limit.
const maxSocketPath = 100

// Daemon is a nix-daemon process listening on a socket in a private directory. It is started on
// first use and again if it has died.
type Daemon struct {
	cfg    Config
	logger *slog.Logger

	mu     sync.Mutex
	dir    string // socket directory, made at first start
	ownDir bool   // dir is a temporary directory of this Daemon
	cmd    *exec.Cmd
	exited chan struct{}
	closed bool
}

// New returns a daemon that is not running yet.
func New(cfg Config, logger *slog.Logger) *Daemon {
	if cfg.Bin == "" {
		cfg.Bin = "nix-daemon"
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 10 * time.Second
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Daemon{cfg: cfg, logger: logger.With("service", "nix-daemon")}
}

// ErrClosed is returned by Ensure after Close.
var ErrClosed = errors.New("nix daemon closed")

// Ensure starts the daemon unless it runs, and returns its socket path.
func (d *Daemon) Ensure(ctx context.Context) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return "", ErrClosed
	}
	if d.cmd != nil {
		select {
		case <-d.exited:
			d.logger.Warn("nix-daemon exited; starting it again")
			d.cmd = nil
		default:
			return d.socket(), nil
		}
	}
	if d.dir == "" {
		// Others may search the directory (0711) to reach the socket, which Nix creates
		// world-writable.
		dir := d.cfg.Dir
		if dir != "" && len(filepath.Join(dir, "socket")) <= maxSocketPath {
			if err := os.MkdirAll(dir, 0o711); err != nil {
				return "", fmt.Errorf("nix daemon: %w", err)
			}
		} else {
			var err error
			if dir, err = os.MkdirTemp("", "hci-nixd-"); err != nil {
				return "", fmt.Errorf("nix daemon: %w", err)
			}
			d.ownDir = true
		}
		if err := os.Chmod(dir, 0o711); err != nil {
			return "", fmt.Errorf("nix daemon: %w", err)
		}
		d.dir = dir
	}
	_ = os.Remove(d.socket())
	args := []string{}
	if d.cfg.Store != "" {
		args = append(args, "--store", d.cfg.Store)
	}
	for _, o := range d.cfg.Options {
		args = append(args, "--option", o[0], o[1])
	}
	cmd := exec.Command(d.cfg.Bin, args...)
	env := d.cfg.Env
	if env == nil {
		for _, k := range []string{"PATH", "TMPDIR"} {
			if v, ok := os.LookupEnv(k); ok {
				env = append(env, k+"="+v)
			}
		}
	}
	cmd.Env = append(append([]string{}, env...), "NIX_DAEMON_SOCKET_PATH="+d.socket())
	cmd.Dir = "/"
	cmd.Stdout = io.Discard
	cmd.Stderr = &logWriter{logger: d.logger}
	// Its own process group: a signal to the node's terminal does not reach it before the node
	// has stopped what uses it. It dies with the node, even one killed with SIGKILL: the
	// parent-death signal follows the thread that started it, which stays locked to the
	// goroutine waiting for it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
		close(exited)
	}()
	if err := <-started; err != nil {
		return "", fmt.Errorf("start nix-daemon: %w", err)
	}
	d.cmd, d.exited = cmd, exited
	if err := d.waitReady(ctx, exited); err != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		d.cmd = nil
		return "", err
	}
	d.logger.Debug("nix-daemon started", "socket", d.socket(), "pid", cmd.Process.Pid)
	return d.socket(), nil
}

func (d *Daemon) socket() string { return filepath.Join(d.dir, "socket") }

// Pid is the daemon's process id, 0 unless it runs. Its workers, one per connection, and the
// builds they run are its descendants.
func (d *Daemon) Pid() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil {
		return 0
	}
	select {
	case <-d.exited:
		return 0
	default:
		return d.cmd.Process.Pid
	}
}

// waitReady waits until the daemon listens on the socket: from then on a connection waits in
// the backlog until it accepts. The socket's file appears at bind, a moment before listen, when
// a connection is still refused; so the kernel's table of listening sockets is read, rather than
// a connection made (which the daemon would log as a client gone before its handshake).
func (d *Daemon) waitReady(ctx context.Context, exited <-chan struct{}) error {
	deadline := time.NewTimer(d.cfg.StartTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if listening(d.socket()) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-exited:
			return errors.New("nix-daemon exited at start (see the log for its error)")
		case <-deadline.C:
			return fmt.Errorf("nix-daemon did not listen on %s within %v", d.socket(), d.cfg.StartTimeout)
		case <-tick.C:
		}
	}
}

// Close stops the daemon (and the workers it forked for open connections) and removes its
// socket directory. Idempotent.
func (d *Daemon) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	if d.cmd != nil {
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-d.exited:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
			<-d.exited
		}
		d.cmd = nil
	}
	if d.dir != "" {
		_ = os.Remove(d.socket())
		if d.ownDir {
			_ = os.RemoveAll(d.dir)
		}
		d.dir = ""
	}
}

// logWriter passes the daemon's messages to the log, one entry per write: errors as warnings,
// the rest (a line per connection) at debug level.
type logWriter struct{ logger *slog.Logger }

func (w *logWriter) Write(p []byte) (int, error) {
	level := slog.LevelDebug
	if bytes.Contains(p, []byte("error")) {
		level = slog.LevelWarn
	}
	w.logger.Log(context.Background(), level, "nix-daemon", "output", string(bytes.TrimSpace(p)))
	return len(p), nil
}

// listening reports whether a unix socket bound at path is listening, from /proc/net/unix
// ("Num RefCount Protocol Flags Type St Inode Path"; Flags has __SO_ACCEPTCON, 0x10000, once
// listen was called).
func listening(path string) bool {
	b, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		// No /proc: the socket's file, which appears a moment before the daemon listens.
		fi, err := os.Stat(path)
		return err == nil && fi.Mode()&os.ModeSocket != 0
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		// The path is the line's end, and may hold spaces.
		if len(f) < 8 || !strings.HasSuffix(strings.TrimRight(line, "\n"), " "+path) {
			continue
		}
		if flags, err := strconv.ParseUint(f[3], 16, 32); err == nil && flags&0x10000 != 0 {
			return true
		}
	}
	return false
}
