package nix

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
)

// narMagic opens every NAR.
const narMagic = "nix-archive-1"

// narWriter emits NAR tokens. Errors are sticky so the serialiser can be written as a straight
// sequence of calls and checked once per node.
type narWriter struct {
	w   *bufio.Writer
	err error
	buf [8]byte
}

func (n *narWriter) str(s string) {
	if n.err != nil {
		return
	}
	n.header(uint64(len(s)))
	if n.err == nil {
		_, n.err = n.w.WriteString(s)
	}
	n.pad(uint64(len(s)))
}

func (n *narWriter) header(size uint64) {
	if n.err != nil {
		return
	}
	binary.LittleEndian.PutUint64(n.buf[:], size)
	_, n.err = n.w.Write(n.buf[:])
}

// pad writes the zero bytes that align a string of the given length to 8 bytes.
func (n *narWriter) pad(size uint64) {
	if n.err != nil || size%8 == 0 {
		return
	}
	var zero [8]byte
	_, n.err = n.w.Write(zero[:8-size%8])
}

// WriteNAR serialises the file, directory or symlink at path as a NAR, byte for byte as
// `nix-store --dump` does. File contents are streamed, so memory use does not depend on file
// size. Files other than regular files, directories and symlinks are an error, as in Nix.
func WriteNAR(w io.Writer, path string) error {
	n := &narWriter{w: bufio.NewWriterSize(w, 64<<10)}
	n.str(narMagic)
	if n.err != nil {
		return fmt.Errorf("write nar: %w", n.err)
	}
	if err := n.node(path); err != nil {
		return fmt.Errorf("write nar %s: %w", path, err)
	}
	if err := n.w.Flush(); err != nil {
		return fmt.Errorf("write nar %s: %w", path, err)
	}
	return nil
}

func (n *narWriter) node(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	n.str("(")
	switch mode := fi.Mode(); {
	case mode.IsRegular():
		if err := n.regular(path, fi); err != nil {
			return err
		}
	case mode.IsDir():
		if err := n.directory(path); err != nil {
			return err
		}
	case mode&fs.ModeSymlink != 0:
		target, err := os.Readlink(path)
		if err != nil {
			return err
		}
		n.str("type")
		n.str("symlink")
		n.str("target")
		n.str(target)
	default:
		return fmt.Errorf("%s: unsupported file type %s", path, mode.Type())
	}
	n.str(")")
	return n.err
}

func (n *narWriter) regular(path string, fi fs.FileInfo) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	n.str("type")
	n.str("regular")
	// Nix tests only the owner's execute bit (S_IXUSR), not any x bit.
	if fi.Mode().Perm()&0o100 != 0 {
		n.str("executable")
		n.str("")
	}
	n.str("contents")
	// The length prefix is written before the contents, so the file must not change size
	// while it is read; CopyN plus the EOF probe below catch both growth and truncation.
	size := uint64(fi.Size())
	n.header(size)
	if n.err != nil {
		return n.err
	}
	copied, err := io.CopyN(n.w, f, int64(size))
	if err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%s: file shrank while archiving (%d of %d bytes)", path, copied, size)
		}
		return err
	}
	var probe [1]byte
	if m, _ := f.Read(probe[:]); m != 0 {
		return fmt.Errorf("%s: file grew while archiving", path)
	}
	n.pad(size)
	return n.err
}

func (n *narWriter) directory(path string) error {
	d, err := os.Open(path)
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	// NAR entries are ordered by raw bytes (Nix keeps them in a std::map<std::string>), never
	// by locale; Go's string comparison is bytewise.
	sort.Strings(names)
	n.str("type")
	n.str("directory")
	for _, name := range names {
		n.str("entry")
		n.str("(")
		n.str("name")
		n.str(name)
		n.str("node")
		if n.err != nil {
			return n.err
		}
		if err := n.node(filepath.Join(path, name)); err != nil {
			return err
		}
		n.str(")")
	}
	return n.err
}
