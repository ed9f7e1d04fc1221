// Package blobtest gives tests a real S3 server: one private MinIO per test binary, and a fresh
// bucket per call of StartMinIO.
//
// A package that uses it stops the server after its tests:
//
//	func TestMain(m *testing.M) {
//		code := m.Run()
//		blobtest.Cleanup()
//		os.Exit(code)
//	}
//
// The MinIO binary is looked up on PATH, then in $(go env GOPATH)/bin; `scripts/deps.sh test`
// builds it.
package blobtest

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
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/logtest"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
)

// Region is the region the test server runs in.
const Region = "us-east-1"

// startTimeout bounds how long the server may take to become ready.
const startTimeout = 30 * time.Second

var (
	mu        sync.Mutex // guards the fields below against Cleanup
	once      sync.Once
	startErr  error
	cmd       *exec.Cmd
	exited    chan struct{}
	dataDir   string
	cfg       blob.S3Config
	logs      *logtest.Buffer
	closed    bool
	bucketSeq atomic.Int64
)

// StartMinIO returns the configuration of a new, empty bucket on the test binary's MinIO,
// starting the server on first use.
func StartMinIO(t testing.TB) blob.S3Config {
	t.Helper()
	once.Do(func() {
		mu.Lock()
		defer mu.Unlock()
		if closed {
			startErr = errors.New("Cleanup already ran")
			return
		}
		startErr = start()
	})
	if startErr != nil {
		t.Fatalf("blobtest: %v", startErr)
	}
	c := cfg
	c.Bucket = BucketName(t.Name(), bucketSeq.Add(1))
	client, err := minio.New(c.Endpoint, &minio.Options{
		Creds:  credentials.NewStaticV4(c.AccessKey, c.SecretKey, ""),
		Region: c.Region,
	})
	if err != nil {
		t.Fatalf("blobtest: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := client.MakeBucket(ctx, c.Bucket, minio.MakeBucketOptions{Region: c.Region}); err != nil {
		t.Fatalf("blobtest: create bucket %s: %v", c.Bucket, err)
	}
	return c
}

// BucketName makes an S3 bucket name (3-63 characters of a-z, 0-9 and '-', starting and
// ending with a letter or digit) from a test name and a counter.
func BucketName(testName string, n int64) string {
	suffix := "-" + strconv.FormatInt(n, 10)
	var b strings.Builder
	b.WriteString("t-")
	dash := true
	for _, r := range strings.ToLower(testName) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
			dash = false
		} else if !dash {
			b.WriteByte('-')
			dash = true
		}
	}
	name := strings.TrimRight(b.String(), "-")
	if max := 63 - len(suffix); len(name) > max {
		name = strings.TrimRight(name[:max], "-")
	}
	return name + suffix
}

// Binary returns the path of the MinIO server binary, or an error naming how to install it.
func Binary() (string, error) { return proctest.Installed("minio") }

func randomString(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// start runs the server; mu is held.
func start() error {
	bin, err := Binary()
	if err != nil {
		return err
	}
	dataDir, err = os.MkdirTemp("", "hci-minio-")
	if err != nil {
		return err
	}
	// A port taken between freePort and MinIO's bind makes MinIO exit; retry a few times.
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		consolePort, err := freePort()
		if err != nil {
			return err
		}
		if lastErr = run(bin, port, consolePort); lastErr == nil {
			return nil
		}
	}
	_ = os.RemoveAll(dataDir)
	return lastErr
}

// run starts MinIO on port and waits until it is ready; mu is held.
func run(bin string, port, consolePort int) error {
	addr := "127.0.0.1:" + strconv.Itoa(port)
	user, pass := "hci"+randomString(8), randomString(20)
	logs = &logtest.Buffer{Limit: 1 << 20}
	c := exec.Command(bin, "server", "--quiet", "--address", addr,
		"--console-address", "127.0.0.1:"+strconv.Itoa(consolePort), filepath.Join(dataDir, "data"))
	c.Env = append(os.Environ(),
		"MINIO_ROOT_USER="+user,
		"MINIO_ROOT_PASSWORD="+pass,
		"MINIO_REGION="+Region,
		"MINIO_BROWSER=off",
		"MINIO_UPDATE=off",
		"MINIO_CI_CD=1",
	)
	c.Stdout, c.Stderr = logs, logs
	// Its own process group, so Cleanup can kill MinIO and anything it spawned.
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := c.Start(); err != nil {
		return fmt.Errorf("start minio: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = c.Wait(); close(done) }()
	cmd, exited = c, done

	deadline := time.Now().Add(startTimeout)
	client := &http.Client{Timeout: time.Second}
	ready := "http://" + addr + "/minio/health/ready"
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := client.Get(ready)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				cfg = blob.S3Config{Endpoint: addr, Region: Region, AccessKey: user, SecretKey: pass, PathStyle: true}
				return nil
			}
		}
		select {
		case <-done:
			cmd, exited = nil, nil
			return fmt.Errorf("minio exited before becoming ready:\n%s", logs.String())
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			stop()
			return fmt.Errorf("minio not ready on %s after %v:\n%s", addr, startTimeout, logs.String())
		}
	}
}

// stop kills the server's process group and waits for it; mu is held.
func stop() {
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-exited
	cmd, exited = nil, nil
}

// Cleanup stops the server, if one was started, and removes its data. Call it from TestMain
// after m.Run.
func Cleanup() {
	mu.Lock()
	defer mu.Unlock()
	closed = true
	stop()
	if dataDir != "" {
		_ = os.RemoveAll(dataDir)
		dataDir = ""
	}
}

// Logs returns what the server has written so far, for failing tests to show.
func Logs() string {
	mu.Lock()
	defer mu.Unlock()
	if logs == nil {
		return ""
	}
	return logs.String()
}
