package blob_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/logtest"
)

// trickle is a slow client's body: chunk bytes every interval. The sleep models the link; it
// synchronises nothing.
type trickle struct {
	data     []byte
	chunk    int
	interval time.Duration
}

func (r *trickle) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	time.Sleep(r.interval)
	n := copy(p[:min(len(p), r.chunk)], r.data)
	r.data = r.data[n:]
	return n, nil
}

// serveUploads serves l's upload handler from a real http.Server with the node's header timeout
// (internal/web's NewServer) and readTimeout, logging to logs.
func serveUploads(t *testing.T, dir string, readTimeout time.Duration, logs io.Writer) *blob.Local {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := openLocal(t, dir, "http://"+ln.Addr().String(), testSecret)
	srv := &http.Server{
		Handler:           l.UploadHandler(slog.New(slog.NewTextHandler(logs, nil))),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       readTimeout,
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("upload server: %v", err)
		}
	})
	return l
}

// TestLocalSlowUpload: a signed upload may take as long as its size allows (30 s plus a second
// per kB), however short the server's general ReadTimeout; past that it is cut off.
func TestLocalSlowUpload(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name        string
		readTimeout time.Duration
		nar         bool // a NAR, else a log
		size        int
		chunk       int
		interval    time.Duration
		ok          bool
	}{
		// 67 s against the node's 1 minute ReadTimeout; the upload deadline is 130 s.
		{"100 kB NAR at 1.5 kB/s under the node's timeouts", time.Minute, true, 100_000, 150, 100 * time.Millisecond, true},
		// 20 s against a 5 s ReadTimeout; the upload deadline is 60 s.
		{"30 kB log at 1.5 kB/s past a 5 s ReadTimeout", 5 * time.Second, false, 30_000, 150, 100 * time.Millisecond, true},
		// 40 s against its upload deadline of 31 s: a signed URL buys time, not forever.
		{"1 kB log at 25 B/s past its 31 s deadline", 5 * time.Second, false, 1000, 50, 2 * time.Second, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var logs logtest.Buffer
			l := serveUploads(t, t.TempDir(), c.readTimeout, &logs)
			body := bytes.Repeat([]byte("slow link "), c.size/10)
			sum := sha256.Sum256(body)
			key := "log/" + h32 + "-slow.drv"
			if c.nar {
				key = narKey(body)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			u, err := l.PresignPut(ctx, key, int64(len(body)), sum[:], "", blob.MaxURLExpiry)
			if err != nil {
				t.Fatal(err)
			}
			req, err := http.NewRequestWithContext(ctx, u.Method, u.URL, &trickle{data: body, chunk: c.chunk, interval: c.interval})
			if err != nil {
				t.Fatal(err)
			}
			req.ContentLength = int64(len(body))
			for k, v := range u.Headers {
				if k != "Content-Length" {
					req.Header[k] = v
				}
			}
			start := time.Now()
			resp, err := http.DefaultClient.Do(req)
			elapsed := time.Since(start)
			status := fmt.Sprint(err)
			if err == nil {
				msg, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				status = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(msg)))
			}
			t.Logf("after %v: %s", elapsed.Round(time.Millisecond), status)
			if c.ok {
				if err != nil || resp.StatusCode != http.StatusOK {
					t.Fatalf("slow upload: %s, want 200\nserver log:\n%s", status, logs.String())
				}
				if elapsed <= c.readTimeout {
					t.Fatalf("the upload took %v, within the server's ReadTimeout %v: it tested nothing", elapsed, c.readTimeout)
				}
				if got, _ := content(t, l, key); got != string(body) {
					t.Errorf("after the slow upload the key holds %d bytes, want %d", len(got), len(body))
				}
				return
			}
			// The server answers 408 when its read times out; a client still writing its body
			// may see the connection close instead.
			if err == nil && resp.StatusCode != http.StatusRequestTimeout {
				t.Fatalf("an upload slower than its deadline got %s, want 408", status)
			}
			// Cut off by the handler's deadline (30 s + 1 s per kB), not by the server's ReadTimeout.
			if elapsed < 30*time.Second {
				t.Errorf("cut off after %v, before the upload deadline of 31 s", elapsed)
			}
			if !strings.Contains(logs.String(), "i/o timeout") {
				t.Errorf("server log does not show the read timing out:\n%s", logs.String())
			}
			assertMissing(t, l, key)
			if got := files(t, l.Dir()); len(got) != 0 {
				t.Errorf("files in store = %v, want none", got)
			}
		})
	}
}
