package workerproto

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
)

// maxString bounds a string or byte field the daemon sends; a longer one is a malformed reply,
// not an allocation. Build logs arrive line by line and narinfo-like fields are small.
const maxString = 64 << 20

// maxList bounds a list's length.
const maxList = 1 << 24

// ErrMalformed is wrapped by every error about a reply that does not follow the protocol.
var ErrMalformed = errors.New("malformed daemon reply")

// reader decodes the protocol's wire format: little-endian uint64s, and strings as a length, the
// bytes and zero padding to a multiple of 8. Errors are sticky: after the first, every read
// returns zero values and err says what went wrong.
type reader struct {
	r   *bufio.Reader
	err error
	buf [8]byte
}

func newReader(r io.Reader) *reader { return &reader{r: bufio.NewReaderSize(r, 64<<10)} }

func (r *reader) fail(err error) {
	if r.err == nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			err = fmt.Errorf("%w: the reply ends early (the daemon closed the connection): %w", ErrMalformed, io.ErrUnexpectedEOF)
		}
		r.err = err
	}
}

func (r *reader) uint64() uint64 {
	if r.err != nil {
		return 0
	}
	if _, err := io.ReadFull(r.r, r.buf[:]); err != nil {
		r.fail(err)
		return 0
	}
	return binary.LittleEndian.Uint64(r.buf[:])
}

func (r *reader) bool() bool { return r.uint64() != 0 }

// length reads a length no larger than limit.
func (r *reader) length(limit uint64, what string) int {
	n := r.uint64()
	if r.err == nil && n > limit {
		r.fail(fmt.Errorf("%w: %s of %d, over the limit of %d", ErrMalformed, what, n, limit))
		return 0
	}
	return int(n)
}

func (r *reader) bytes() []byte {
	n := r.length(maxString, "a string")
	if r.err != nil {
		return nil
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r.r, b); err != nil {
		r.fail(err)
		return nil
	}
	r.skipPadding(uint64(n))
	return b
}

func (r *reader) string() string { return string(r.bytes()) }

func (r *reader) skipPadding(n uint64) {
	if pad := (8 - n%8) % 8; pad > 0 && r.err == nil {
		if _, err := io.ReadFull(r.r, r.buf[:pad]); err != nil {
			r.fail(err)
			return
		}
		for _, b := range r.buf[:pad] {
			if b != 0 {
				r.fail(fmt.Errorf("%w: non-zero padding", ErrMalformed))
				return
			}
		}
	}
}

func (r *reader) strings() []string {
	n := r.length(maxList, "a list")
	if r.err != nil {
		return nil
	}
	out := make([]string, 0, min(n, 1024))
	for i := 0; i < n && r.err == nil; i++ {
		out = append(out, r.string())
	}
	return out
}

// writer encodes the wire format into a buffer; flush sends it. Errors are sticky.
type writer struct {
	w   *bufio.Writer
	err error
	buf [8]byte
}

func newWriter(w io.Writer) *writer { return &writer{w: bufio.NewWriterSize(w, 64<<10)} }

func (w *writer) uint64(v uint64) {
	if w.err != nil {
		return
	}
	binary.LittleEndian.PutUint64(w.buf[:], v)
	_, w.err = w.w.Write(w.buf[:])
}

func (w *writer) bool(v bool) {
	if v {
		w.uint64(1)
	} else {
		w.uint64(0)
	}
}

func (w *writer) bytes(b []byte) {
	w.uint64(uint64(len(b)))
	if w.err != nil {
		return
	}
	if _, w.err = w.w.Write(b); w.err != nil {
		return
	}
	if pad := (8 - len(b)%8) % 8; pad > 0 {
		clear(w.buf[:])
		_, w.err = w.w.Write(w.buf[:pad])
	}
}

func (w *writer) string(s string) { w.bytes([]byte(s)) }

func (w *writer) strings(ss []string) {
	w.uint64(uint64(len(ss)))
	for _, s := range ss {
		w.string(s)
	}
}

// stringMap writes m as a count and key, value pairs, in key order (the daemon reads them into
// a map; a fixed order keeps requests reproducible).
func (w *writer) stringMap(m map[string]string) {
	keys := slices.Sorted(maps.Keys(m))
	w.uint64(uint64(len(keys)))
	for _, k := range keys {
		w.string(k)
		w.string(m[k])
	}
}

func (w *writer) flush() error {
	if w.err == nil {
		w.err = w.w.Flush()
	}
	return w.err
}
