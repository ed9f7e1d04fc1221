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
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/minioserver"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
)

// Region is the region the test server runs in.
const Region = minioserver.Region

var (
	mu        sync.Mutex // guards the fields below against Cleanup
	once      sync.Once
	startErr  error
	server    *minioserver.Server
	dataDir   string
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
	c := server.Config
	c.Bucket = BucketName(t.Name(), bucketSeq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := server.CreateBucket(ctx, c.Bucket); err != nil {
		t.Fatalf("blobtest: %v", err)
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

// start runs the server; mu is held.
func start() error {
	bin, err := Binary()
	if err != nil {
		return err
	}
	if dataDir, err = os.MkdirTemp("", "hci-minio-"); err != nil {
		return err
	}
	if server, err = minioserver.Start(context.Background(), bin, dataDir); err != nil {
		_ = os.RemoveAll(dataDir)
		return err
	}
	return nil
}

// Cleanup stops the server, if one was started, and removes its data. Call it from TestMain
// after m.Run.
func Cleanup() {
	mu.Lock()
	defer mu.Unlock()
	closed = true
	if server != nil {
		server.Stop()
	}
	if dataDir != "" {
		_ = os.RemoveAll(dataDir)
		dataDir = ""
	}
}

// Logs returns what the server has written so far, for failing tests to show.
func Logs() string {
	mu.Lock()
	defer mu.Unlock()
	if server == nil {
		return ""
	}
	return server.Logs()
}
