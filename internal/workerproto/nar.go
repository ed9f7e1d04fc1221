package workerproto

import (
	"encoding/binary"
	"fmt"
	"io"
)

// maxNARDepth bounds directory nesting in a NAR the daemon sends.
const maxNARDepth = 256

// copyNAR copies exactly one NAR from r to dst, parsing it as it goes: the daemon sends a path's
// NAR with no length in front, so its end is found by its structure. A daemon that fails while
// it writes the NAR (the path is not valid) sends an error message in its place and then drops
// the connection: the error is returned, and the connection is broken.
func copyNAR(dst io.Writer, r *reader) {
	n := narCopier{r: r, w: newWriter(dst)}
	n.expect("nix-archive-1")
	n.node(0)
	if n.daemonErr != nil {
		r.fail(fmt.Errorf("%w (the daemon drops the connection after this)", n.daemonErr))
		return
	}
	if err := n.w.flush(); err != nil && r.err == nil {
		r.fail(fmt.Errorf("write the NAR: %w", err))
	}
}

type narCopier struct {
	r         *reader
	w         *writer
	daemonErr *Error
}

// token reads a short string of the NAR's structure and writes it on.
func (n *narCopier) token() string {
	if n.daemonErr != nil || n.r.err != nil {
		return ""
	}
	// No token is that long: it is the daemon's error message instead.
	if b, err := n.r.r.Peek(8); err == nil && binary.LittleEndian.Uint64(b) == msgError {
		n.r.uint64()
		n.daemonErr = n.r.daemonError()
		return ""
	}
	s := n.r.length(4096, "a NAR token")
	if n.r.err != nil {
		return ""
	}
	b := make([]byte, s)
	if _, err := io.ReadFull(n.r.r, b); err != nil {
		n.r.fail(err)
		return ""
	}
	n.r.skipPadding(uint64(s))
	n.w.bytes(b)
	return string(b)
}

func (n *narCopier) expect(want string) {
	if got := n.token(); n.r.err == nil && n.daemonErr == nil && got != want {
		n.r.fail(fmt.Errorf("%w: NAR: want %q, got %q", ErrMalformed, want, got))
	}
}

// contents streams a regular file's contents (any size) to the writer.
func (n *narCopier) contents() {
	if n.daemonErr != nil {
		return
	}
	size := n.r.uint64()
	n.w.uint64(size)
	if n.r.err != nil || n.w.err != nil {
		return
	}
	if _, err := io.CopyN(n.w.w, n.r.r, int64(size)); err != nil {
		n.r.fail(err)
		return
	}
	n.r.skipPadding(size)
	if pad := (8 - size%8) % 8; pad > 0 {
		var zero [8]byte
		_, n.w.err = n.w.w.Write(zero[:pad])
	}
}

func (n *narCopier) node(depth int) {
	if depth > maxNARDepth {
		n.r.fail(fmt.Errorf("%w: NAR nested deeper than %d", ErrMalformed, maxNARDepth))
		return
	}
	n.expect("(")
	n.expect("type")
	switch t := n.token(); t {
	case "regular":
		tok := n.token()
		if tok == "executable" {
			n.expect("")
			tok = n.token()
		}
		if n.r.err == nil && n.daemonErr == nil && tok != "contents" {
			n.r.fail(fmt.Errorf("%w: NAR: want contents, got %q", ErrMalformed, tok))
			return
		}
		n.contents()
		n.expect(")")
	case "symlink":
		n.expect("target")
		n.token()
		n.expect(")")
	case "directory":
		for n.r.err == nil && n.daemonErr == nil {
			switch tok := n.token(); tok {
			case ")":
				return
			case "entry":
				n.expect("(")
				n.expect("name")
				n.token()
				n.expect("node")
				n.node(depth + 1)
				n.expect(")")
			default:
				if n.r.err == nil && n.daemonErr == nil {
					n.r.fail(fmt.Errorf("%w: NAR: want entry or ), got %q", ErrMalformed, tok))
				}
			}
		}
	default:
		if n.r.err == nil && n.daemonErr == nil {
			n.r.fail(fmt.Errorf("%w: NAR: node type %q", ErrMalformed, t))
		}
	}
}
