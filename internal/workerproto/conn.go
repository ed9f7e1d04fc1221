// Package workerproto is a client of the Nix daemon's worker protocol, versions 1.29 (Nix 2.4)
// to 1.38 (Nix 2.26 and later; Lix speaks 1.35): the handshake, which settles on the older of
// the two versions, the daemon's log and error messages, and the operations a builder needs
// (options, validity and path info, temporary GC roots, adding a NAR, building a derivation or
// store paths, dumping a path as a NAR, what is missing). Every field a daemon sends in the
// negotiated version is read: a newer daemon's build results carry CPU times (1.37), its
// handshake says whether it trusts this client (1.35) and exchanges features (1.38). A
// connection is a long-lived `nix-daemon --stdio` child (which also serves a chroot store) or a
// daemon's socket.
//
// A Conn runs one operation at a time. Cancelling an operation's context closes the connection,
// which ends the daemon's work (a running build is killed with its worker); the Conn is then
// unusable and the caller opens another. A reply that does not follow the protocol is an error
// wrapping ErrMalformed, never a hang.
package workerproto

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

const (
	magic1 = 0x6e697863
	magic2 = 0x6478696f
	// clientVersion is protocol 1.38, what Nix 2.26 speaks; a daemon that speaks an older one
	// gets that one.
	clientVersion = 1<<8 | 38
	// minDaemonVersion: structured errors (1.26) and build results with times (1.29).
	minDaemonMinor = 29
)

// Trust is what the daemon says of this client at the handshake (protocol 1.35 and later): a
// trusted client (root, or one of the daemon's trusted-users) may build a derivation it sends
// and set any option; an untrusted one builds only derivations in the store, and its options
// and unsigned paths are refused.
type Trust uint8

// The daemon's answers; TrustUnknown is an older daemon's.
const (
	TrustUnknown Trust = iota
	Trusted
	NotTrusted
)

func (t Trust) String() string {
	switch t {
	case Trusted:
		return "trusted"
	case NotTrusted:
		return "not trusted"
	}
	return "unknown"
}

// ErrClosed is returned for an operation on a closed connection.
var ErrClosed = errors.New("workerproto: connection closed")

// Conn is a connection to a Nix daemon.
type Conn struct {
	r  *reader
	w  *writer
	rw io.ReadWriteCloser
	// DaemonVersion is the daemon's Nix version ("2.8.0"; "" before protocol 1.33) and Minor
	// the protocol minor version both sides speak.
	DaemonVersion string
	Minor         uint64
	// DaemonMinor is the newest protocol minor version the daemon speaks.
	DaemonMinor uint64
	// Trust is whether the daemon trusts this client (TrustUnknown before protocol 1.35).
	Trust Trust

	mu        sync.Mutex // one operation at a time
	closeOnce sync.Once
	closed    chan struct{}
	closeErr  error
	cmd       *exec.Cmd // the nix-daemon --stdio child, if any
	waitDone  chan struct{}
	grace     time.Duration
}

// StartOptions start a `nix-daemon --stdio` child.
type StartOptions struct {
	// Daemon is the nix-daemon binary; default "nix-daemon" on PATH.
	Daemon string
	// Store is a chroot store directory ("" for the system store).
	Store string
	// Options are passed as --option NAME VALUE (for example sandbox-paths); the daemon is
	// trusted, so they also hold for builds.
	Options map[string]string
	// Env is the child's environment; nil inherits none but PATH-free defaults.
	Env []string
	// Dir is the child's working directory; "" is this process's.
	Dir string
	// KillGrace is how long Close waits for the child to exit after the hang-up, and again
	// after SIGTERM, before it kills the child and its builds. Default 5s.
	KillGrace time.Duration
	// Nice is the child's nice value, which its builds inherit; 0 leaves it as this process's.
	Nice int
	// Cgroup is a cgroup directory the child is moved into as it starts, before it can start a
	// build: its builds stay there, even in sessions of their own. "" leaves it in this
	// process's.
	Cgroup string
}

// Start runs a `nix-daemon --stdio` child and handshakes with it. The child and its builds end
// when the connection is closed.
func Start(ctx context.Context, o StartOptions) (*Conn, error) {
	bin := o.Daemon
	if bin == "" {
		bin = "nix-daemon"
	}
	args := []string{"--stdio"}
	if o.Store != "" {
		args = append(args, "--store", o.Store)
	}
	for k, v := range o.Options {
		args = append(args, "--option", k, v)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = o.Env
	cmd.Dir = o.Dir
	// A build that kept the daemon's stderr open must not keep Wait (and Close) waiting.
	cmd.WaitDelay = closeGrace
	// Its own process group, so Close reaches the daemon's children; killed if we die first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("start nix-daemon: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("start nix-daemon: %w", err)
	}
	stderr := &tailBuffer{limit: 8 << 10}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start nix-daemon: %w", err)
	}
	if o.Cgroup != "" {
		if err := os.WriteFile(filepath.Join(o.Cgroup, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return nil, fmt.Errorf("start nix-daemon: move it to cgroup %s: %w", o.Cgroup, err)
		}
	}
	if o.Nice != 0 {
		// Before the handshake: the daemon forks its builds only once asked to.
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, cmd.Process.Pid, o.Nice); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return nil, fmt.Errorf("start nix-daemon: set its nice value to %d: %w", o.Nice, err)
		}
	}
	c := newConn(pipe{stdout, stdin})
	c.cmd, c.waitDone, c.grace = cmd, make(chan struct{}), o.KillGrace
	if c.grace <= 0 {
		c.grace = closeGrace
	}
	go func() { _ = cmd.Wait(); close(c.waitDone) }()
	if err := c.handshake(ctx); err != nil {
		c.Close()
		if msg := stderr.String(); msg != "" {
			return nil, fmt.Errorf("%w (nix-daemon said: %s)", err, msg)
		}
		return nil, err
	}
	return c, nil
}

// Dial connects to a daemon's socket (the system daemon: /nix/var/nix/daemon-socket/socket).
func Dial(ctx context.Context, socket string) (*Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("connect to nix-daemon: %w", err)
	}
	c := newConn(nc)
	if err := c.handshake(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// NewConn handshakes over rw, an established connection to a daemon.
func NewConn(ctx context.Context, rw io.ReadWriteCloser) (*Conn, error) {
	c := newConn(rw)
	if err := c.handshake(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func newConn(rw io.ReadWriteCloser) *Conn {
	return &Conn{r: newReader(rw), w: newWriter(rw), rw: rw, closed: make(chan struct{})}
}

func (c *Conn) handshake(ctx context.Context) error {
	return c.do(ctx, func() error {
		c.w.uint64(magic1)
		if err := c.w.flush(); err != nil {
			return fmt.Errorf("workerproto handshake: %w", err)
		}
		if m := c.r.uint64(); c.r.err == nil && m != magic2 {
			return fmt.Errorf("workerproto handshake: %w: magic %#x", ErrMalformed, m)
		}
		v := c.r.uint64()
		if c.r.err != nil {
			return fmt.Errorf("workerproto handshake: %w", c.r.err)
		}
		if v>>8 != 1 || v&0xff < minDaemonMinor {
			return fmt.Errorf("workerproto handshake: the daemon speaks protocol %d.%d; at least 1.%d is needed", v>>8, v&0xff, minDaemonMinor)
		}
		c.DaemonMinor = v & 0xff
		c.Minor = min(c.DaemonMinor, clientVersion&0xff)
		c.w.uint64(clientVersion)
		if c.Minor >= 38 {
			// Features: this client asks for none, so none are in use whatever the daemon's.
			c.w.strings(nil)
			if err := c.w.flush(); err != nil {
				return fmt.Errorf("workerproto handshake: %w", err)
			}
			c.r.strings()
		}
		c.w.uint64(0) // no CPU affinity (obsolete)
		c.w.uint64(0) // reserveSpace (obsolete)
		if err := c.w.flush(); err != nil {
			return fmt.Errorf("workerproto handshake: %w", err)
		}
		if c.Minor >= 33 {
			c.DaemonVersion = c.r.string()
		}
		if c.Minor >= 35 {
			switch t := c.r.uint64(); {
			case c.r.err != nil:
			case t <= uint64(NotTrusted):
				c.Trust = Trust(t)
			default:
				c.r.fail(fmt.Errorf("%w: trust flag %d", ErrMalformed, t))
			}
		}
		if c.r.err != nil {
			return fmt.Errorf("workerproto handshake: %w", c.r.err)
		}
		if err := c.processStderr(nil); err != nil {
			return fmt.Errorf("workerproto handshake: %w", err)
		}
		return nil
	})
}

// do runs an operation: one at a time, and a cancelled ctx closes the connection so that a
// blocked read or write returns at once.
func (c *Conn) do(ctx context.Context, op func() error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.closed:
		return ErrClosed
	default:
	}
	if c.r.err != nil || c.w.err != nil {
		return fmt.Errorf("workerproto: the connection failed earlier: %w", errors.Join(c.r.err, c.w.err))
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	err := op()
	if !stop() {
		// The context ended during the operation: its error is the cause, not the closed pipe.
		return fmt.Errorf("workerproto: %w", context.Cause(ctx))
	}
	if err == nil && (c.r.err != nil || c.w.err != nil) {
		err = errors.Join(c.r.err, c.w.err)
	}
	return err
}

// closeGrace is how long a `nix-daemon --stdio` child may take by default to stop its build
// and exit once its connection is closed, before it is told to (SIGTERM), and again before it
// is killed.
const closeGrace = 5 * time.Second

// Close closes the connection. The daemon sees the hang-up, stops what it is doing (a running
// build is killed by the daemon itself: the build runs in a session of its own, which killing
// the daemon would leave running) and exits; a `nix-daemon --stdio` child is waited for, then
// sent SIGTERM, then killed with its process group and its children's (the builds).
// Idempotent; it returns once the child is gone.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		close(c.closed)
		c.closeErr = c.rw.Close()
		if c.cmd == nil {
			return
		}
		pid := c.cmd.Process.Pid
		for _, sig := range []syscall.Signal{0, syscall.SIGTERM, syscall.SIGKILL} {
			switch sig {
			case syscall.SIGTERM:
				_ = syscall.Kill(-pid, sig)
			case syscall.SIGKILL:
				// The daemon is not reaped before waitDone, so its children are still its
				// children and its group id is still its own.
				builds := childProcessGroups(pid)
				_ = syscall.Kill(-pid, sig)
				for _, g := range builds {
					_ = syscall.Kill(-g, sig)
				}
				defer waitGroupGone(pid)
			}
			t := time.NewTimer(c.grace)
			select {
			case <-c.waitDone:
				t.Stop()
				return
			case <-t.C:
			}
		}
		<-c.waitDone
	})
	return c.closeErr
}

// waitGroupGone waits, up to closeGrace, until no process of group pgid is left (a process the
// daemon started in its group, killed with it, is reaped by init a moment later).
func waitGroupGone(pgid int) {
	deadline := time.Now().Add(closeGrace)
	for syscall.Kill(-pgid, 0) == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polling the kernel's process table: there is no event
	}
}

// Pid is the `nix-daemon --stdio` child's process id (also its process group's), or 0 for a
// socket connection.
func (c *Conn) Pid() int {
	if c.cmd == nil {
		return 0
	}
	return c.cmd.Process.Pid
}

// Broken reports whether the connection can no longer be used: closed, or a read or write
// failed (the caller opens another).
func (c *Conn) Broken() bool {
	select {
	case <-c.closed:
		return true
	default:
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.r.err != nil || c.w.err != nil
}

// pipe joins a child's stdout and stdin into one connection.
type pipe struct {
	io.ReadCloser
	w io.WriteCloser
}

func (p pipe) Write(b []byte) (int, error) { return p.w.Write(b) }

func (p pipe) Close() error { return errors.Join(p.w.Close(), p.ReadCloser.Close()) }

// tailBuffer keeps the first limit bytes the daemon writes to its stderr, for error messages.
type tailBuffer struct {
	mu    sync.Mutex
	b     []byte
	limit int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if room := t.limit - len(t.b); room > 0 {
		t.b = append(t.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
