package workerproto

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// encode builds daemon replies for the fuzz seeds.
func encode(f func(w *writer)) []byte {
	var b bytes.Buffer
	w := newWriter(&b)
	f(w)
	_ = w.flush()
	return b.Bytes()
}

// FuzzReplies feeds arbitrary bytes to the reply decoders (the daemon's messages, a path info, a
// NAR): each returns a value or an error, never panics or reads forever, and never allocates
// beyond the limits.
func FuzzReplies(f *testing.F) {
	f.Add(encode(func(w *writer) {
		w.uint64(msgNext)
		w.string("a log line\n")
		w.uint64(msgStartActivity)
		w.uint64(7)
		w.uint64(0)
		w.uint64(ActBuild)
		w.string("building x")
		w.uint64(2)
		w.uint64(1)
		w.string("/nix/store/x.drv")
		w.uint64(0)
		w.uint64(3)
		w.uint64(0)
		w.uint64(msgResult)
		w.uint64(7)
		w.uint64(resBuildLogLine)
		w.uint64(1)
		w.uint64(1)
		w.string("line")
		w.uint64(msgStopActivity)
		w.uint64(7)
		w.uint64(msgLast)
	}))
	f.Add(encode(func(w *writer) {
		w.uint64(msgError)
		w.string("Error")
		w.uint64(0)
		w.string("Error")
		w.string("\x1b[31;1merror:\x1b[0m path is not valid")
		w.uint64(0)
		w.uint64(1)
		w.uint64(0)
		w.string("while doing something")
	}))
	f.Add(encode(func(w *writer) {
		for _, s := range []string{"nix-archive-1", "(", "type", "directory", "entry", "(", "name", "f", "node",
			"(", "type", "regular", "executable", "", "contents"} {
			w.string(s)
		}
		w.string("#!/bin/sh\n")
		for _, s := range []string{")", ")", ")"} {
			w.string(s)
		}
	}))
	f.Fuzz(func(t *testing.T, data []byte) {
		c := &Conn{r: newReader(bytes.NewReader(data)), w: newWriter(io.Discard)}
		var lines int
		err := c.processStderr(&Logger{Line: func(string) { lines++ }})
		var de *Error
		if err != nil && !errors.Is(err, ErrMalformed) && !errors.As(err, &de) {
			t.Fatalf("processStderr: an error that is neither malformed nor the daemon's: %v", err)
		}
		r := newReader(bytes.NewReader(data))
		copyNAR(io.Discard, r)
		if r.err == nil {
			return
		}
		if !errors.Is(r.err, ErrMalformed) && !errors.As(r.err, &de) {
			t.Fatalf("copyNAR: an error that is neither malformed nor the daemon's: %v", r.err)
		}
	})
}
