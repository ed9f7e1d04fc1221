package workerproto_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/workerproto"
)

// fakeDaemon answers the client's greeting with reply (then closes, unless hang) on a pipe.
func fakeDaemon(t *testing.T, reply []byte, hang bool) net.Conn {
	client, server := net.Pipe()
	go func() {
		var magic [8]byte
		if _, err := io.ReadFull(server, magic[:]); err != nil {
			return
		}
		_, _ = server.Write(reply)
		if hang {
			_, _ = io.Copy(io.Discard, server) // reads everything, answers nothing
		}
		server.Close()
	}()
	t.Cleanup(func() { client.Close() })
	return client
}

func u64(vs ...uint64) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return b
}

// TestMalformedDaemon: a daemon that answers wrongly, stops half-way or not at all gives an
// error, never a hang.
func TestMalformedDaemon(t *testing.T) {
	for _, tt := range []struct {
		name      string
		reply     []byte
		hang      bool
		malformed bool
	}{
		{"wrong magic", u64(0x1234, 1<<8|34), false, true},
		{"old protocol", u64(0x6478696f, 1<<8|20), false, false},
		{"truncated", u64(0x6478696f)[:5], false, true},
		{"silent", nil, true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := workerproto.NewConn(ctx, fakeDaemon(t, tt.reply, tt.hang))
			if err == nil {
				t.Fatal("a broken daemon was accepted")
			}
			if tt.malformed && !errors.Is(err, workerproto.ErrMalformed) {
				t.Errorf("%v; want a malformed reply", err)
			}
			if tt.hang && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%v; want the deadline", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("took %s", d)
			}
		})
	}
}
