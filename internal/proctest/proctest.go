// Package proctest runs the real harmonia-ci binary in tests: it builds the binary once per test
// binary, starts nodes as separate processes against a test database, signals them, and reads
// their logs and metrics.
package proctest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/logtest"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// Binary returns the path of a harmonia-ci binary built from this tree (once per test binary).
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "hci-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "harmonia-ci")
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/harmonia-ci")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatalf("proctest: %v", buildErr)
	}
	return binPath
}

// Cleanup removes the binary Binary built. Pass it to dbtest.Main.
func Cleanup() {
	if binPath != "" {
		_ = os.RemoveAll(filepath.Dir(binPath))
	}
}

// FastConfig is a configuration with intervals short enough for tests: heartbeats every
// 200ms, dead after 1s, leases of 1.5s checked every 100ms.
const FastConfig = `
log_level = "debug"

[cluster.heartbeat]
interval = "200ms"
dead_threshold = "1s"
dead_retention = "2s"

[cluster.leader_election]
check_interval = "100ms"
lease_duration = "1500ms"
refresh_interval = "400ms"

[cluster.shutdown]
drain_timeout = "5s"
`

// WriteFile writes content to a new file in t's temp dir and returns its path.
func WriteFile(t testing.TB, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Proc is one running harmonia-ci process.
type Proc struct {
	Name string
	cmd  *exec.Cmd
	logs *logtest.Buffer
	done chan struct{}
	err  error // set before done closes
}

// Start runs the binary with args, capturing stdout and stderr. The process is killed at the
// end of the test if still running.
func Start(t testing.TB, name string, env []string, args ...string) *Proc {
	t.Helper()
	cmd := exec.Command(Binary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	return start(t, name, cmd)
}

// start starts cmd as a Proc.
func start(t testing.TB, name string, cmd *exec.Cmd) *Proc {
	t.Helper()
	p := &Proc{Name: name, cmd: cmd, logs: &logtest.Buffer{}, done: make(chan struct{})}
	cmd.Stdout = p.logs
	cmd.Stderr = p.logs
	// A group of its own, so the cleanup also kills what it started (a git fetch outlives a
	// killed node and would write into the test's temporary directory while it is removed).
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Signal(syscall.SIGCONT)
			_ = cmd.Process.Kill()
			<-p.done
		}
		killGroup(cmd.Process.Pid)
		if t.Failed() {
			t.Logf("--- logs of %s ---\n%s", name, p.Logs())
		}
	})
	return p
}

// Run runs the binary to completion and returns its exit code and combined output.
func Run(t testing.TB, env []string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, Binary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), string(out)
		}
		t.Fatalf("run %v: %v", args, err)
	}
	return 0, string(out)
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the process.
func (p *Proc) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %s to %s: %v", sig, p.Name, err)
	}
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Wait waits up to timeout for the process to end and returns its exit code.
func (p *Proc) Wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("%s did not exit within %s", p.Name, timeout)
	}
	if p.err == nil {
		return 0
	}
	if ee, ok := p.err.(*exec.ExitError); ok {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return -int(ws.Signal())
		}
		return ee.ExitCode()
	}
	t.Fatalf("wait %s: %v", p.Name, p.err)
	return -1
}

// Logs returns everything the process printed so far.
func (p *Proc) Logs() string { return p.logs.String() }

// WaitFor polls cond until it holds or timeout passes, then fails the test with msg.
func WaitFor(t testing.TB, timeout time.Duration, msg string, cond func() bool) {
	t.Helper()
	waittest.For(t, timeout, cond, "%s", msg)
}

// Metric scrapes endpoint's /metrics and returns the value of the series whose name and labels
// are given exactly as in the exposition format, e.g. `harmonia_ci_leader_is_leader{role="maintenance"}`.
// ok is false if the node did not answer or lacks the series.
func Metric(endpoint, series string) (v float64, ok bool) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(strings.TrimRight(endpoint, "/") + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, found := strings.CutPrefix(line, series+" "); found {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// killGroup kills every process left in group pgid and waits (up to ten seconds) until none
// is running. Zombies count as gone: whether they are reaped depends on the machine's init.
func killGroup(pgid int) {
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && groupRunning(pgid) {
		time.Sleep(20 * time.Millisecond)
	}
}

// groupRunning reports whether a process of group pgid is alive and not a zombie.
func groupRunning(pgid int) bool {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces, so split after its ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) >= 3 && f[2] == strconv.Itoa(pgid) && f[0] != "Z" && f[0] != "X" {
			return true
		}
	}
	return false
}
