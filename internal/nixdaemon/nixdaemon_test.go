package nixdaemon

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// ping asks the daemon on socket whether the store answers, as a Nix client does.
func ping(t *testing.T, socket string) error {
	t.Helper()
	cmd := exec.Command("nix", "--extra-experimental-features", "nix-command", "store", "ping", "--store", "unix://"+socket)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Logf("nix store ping: %s", out)
	}
	return err
}

// The daemon serves on its socket, comes back after it died, and leaves nothing once closed.
func TestDaemonLifecycle(t *testing.T) {
	if _, err := exec.LookPath("nix-daemon"); err != nil {
		t.Fatal("nix-daemon not found: install nix-bin (scripts/deps.sh does)")
	}
	dir := filepath.Join(t.TempDir(), "nix-daemon")
	d := New(Config{Dir: dir, Options: [][2]string{{"substituters", ""}}}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	socket, err := d.Ensure(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if socket != filepath.Join(dir, "socket") {
		t.Fatalf("socket %s, want it in %s", socket, dir)
	}
	if err := ping(t, socket); err != nil {
		t.Fatalf("the daemon does not answer: %v", err)
	}
	if again, err := d.Ensure(ctx); err != nil || again != socket {
		t.Fatalf("Ensure of a running daemon = %s, %v", again, err)
	}

	// Killed, it is started again on next use.
	d.mu.Lock()
	pid := d.cmd.Process.Pid
	exited := d.exited
	d.mu.Unlock()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	if socket, err = d.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ping(t, socket); err != nil {
		t.Fatalf("the restarted daemon does not answer: %v", err)
	}

	d.Close()
	d.Close() // idempotent
	if _, err := os.Stat(socket); !os.IsNotExist(err) {
		t.Fatalf("the socket is still there after Close: %v", err)
	}
	if _, err := d.Ensure(ctx); err != ErrClosed {
		t.Fatalf("Ensure after Close = %v, want ErrClosed", err)
	}
}
