// Package minioserver runs a private MinIO server: loopback only, random credentials, its data
// in a directory of the caller's. The tests' S3 (package blobtest) and `harmonia-ci bench gc`
// use it; `scripts/deps.sh test` builds the binary.
package minioserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
)

// Region is the region the server runs in.
const Region = "us-east-1"

// startTimeout bounds how long the server may take to become ready.
const startTimeout = 30 * time.Second

// Server is a running MinIO.
type Server struct {
	// Config reaches the server (no bucket).
	Config  blob.S3Config
	Version string

	cmd    *exec.Cmd
	exited chan struct{}
	out    *boundedBuffer
	stop   sync.Once
}

// Find returns the MinIO binary: on PATH, else in $GOPATH/bin or ~/go/bin, where
// scripts/deps.sh installs it.
func Find() (string, error) {
	if p, err := exec.LookPath("minio"); err == nil {
		return p, nil
	}
	var dirs []string
	if gopath := os.Getenv("GOPATH"); gopath != "" {
		dirs = append(dirs, filepath.Join(strings.Split(gopath, string(os.PathListSeparator))[0], "bin"))
	}
	if home, err := os.UserHomeDir(); err == nil {
		dirs = append(dirs, filepath.Join(home, "go", "bin"))
	}
	for _, d := range dirs {
		p := filepath.Join(d, "minio")
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New("no minio binary on PATH or in ~/go/bin (scripts/deps.sh test builds it)")
}

// Start runs bin with its data under dir and waits until it is ready. A port taken between
// choosing it and MinIO's bind makes MinIO exit, so it tries a few times.
func Start(ctx context.Context, bin, dir string) (*Server, error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		s, err := start(ctx, bin, dir)
		if err == nil || ctx.Err() != nil {
			return s, err
		}
		lastErr = err
	}
	return nil, lastErr
}

func start(ctx context.Context, bin, dir string) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	consolePort, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	user, pass := "hci"+randomHex(8), randomHex(20)
	s := &Server{
		Config:  blob.S3Config{Endpoint: addr, Region: Region, AccessKey: user, SecretKey: pass, PathStyle: true},
		Version: version(bin),
		exited:  make(chan struct{}),
		out:     &boundedBuffer{limit: 1 << 20},
	}
	s.cmd = exec.Command(bin, "server", "--quiet", "--address", addr,
		"--console-address", "127.0.0.1:"+strconv.Itoa(consolePort), filepath.Join(dir, "data"))
	s.cmd.Env = append(os.Environ(),
		"MINIO_ROOT_USER="+user,
		"MINIO_ROOT_PASSWORD="+pass,
		"MINIO_REGION="+Region,
		"MINIO_BROWSER=off",
		"MINIO_UPDATE=off",
		"MINIO_CI_CD=1",
	)
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	// Its own process group, so Stop reaches anything it spawned; killed if we die first.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start minio: %w", err)
	}
	go func() { _ = s.cmd.Wait(); close(s.exited) }()

	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(startTimeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/minio/health/ready", nil)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		select {
		case <-s.exited:
			return nil, fmt.Errorf("minio exited before becoming ready:\n%s", s.out.String())
		case <-ctx.Done():
			s.Stop()
			return nil, ctx.Err()
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("minio not ready on %s after %s:\n%s", addr, startTimeout, s.out.String())
		}
	}
}

// Stop kills the server's process group and waits for it. Idempotent.
func (s *Server) Stop() {
	s.stop.Do(func() {
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
	})
}

// Logs returns the first MiB the server wrote.
func (s *Server) Logs() string { return s.out.String() }

// CreateBucket makes a bucket named name.
func (s *Server) CreateBucket(ctx context.Context, name string) error {
	client, err := minio.New(s.Config.Endpoint, &minio.Options{
		Creds:  credentials.NewStaticV4(s.Config.AccessKey, s.Config.SecretKey, ""),
		Region: s.Config.Region,
	})
	if err != nil {
		return fmt.Errorf("create bucket %s: %w", name, err)
	}
	if err := client.MakeBucket(ctx, name, minio.MakeBucketOptions{Region: s.Config.Region}); err != nil {
		return fmt.Errorf("create bucket %s: %w", name, err)
	}
	return nil
}

func version(bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "unknown"
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return first
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// boundedBuffer keeps the first limit bytes a process writes, for error messages.
type boundedBuffer struct {
	mu    sync.Mutex
	b     []byte
	limit int
}

func (t *boundedBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if room := t.limit - len(t.b); room > 0 {
		t.b = append(t.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (t *boundedBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
