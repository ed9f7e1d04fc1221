package nix

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"

	"io"
	"slices"
	"strings"
)

// The store paths of content-addressed objects follow from their content, so whoever holds the
// content can check a claimed path (Nix's store-api.cc: makeStorePath, makeTextPath,
// makeFixedOutputPath). The signer publishes .drv files and sources only when it has recomputed
// their paths this way.

// makeStorePath is Nix's makeStorePath: the path of an object of type typ (with its
// references) whose identifying hash is sum.
func makeStorePath(typ string, sum [sha256.Size]byte, name string) string {
	s := typ + ":sha256:" + hex.EncodeToString(sum[:]) + ":" + StoreDir + ":" + name
	full := sha256.Sum256([]byte(s))
	// compressHash: XOR-fold the 32 bytes into 20.
	var h [20]byte
	for i, b := range full {
		h[i%20] ^= b
	}
	return StoreDir + "/" + EncodeBase32(h[:]) + "-" + name
}

// typeWithRefs is makeType: the type, then each reference (full store paths, sorted), then
// ":self" for an object that refers to itself.
func typeWithRefs(typ string, refs []string, self bool) string {
	refs = slices.Sorted(slices.Values(refs))
	for _, r := range slices.Compact(refs) {
		typ += ":" + r
	}
	if self {
		typ += ":self"
	}
	return typ
}

// TextPath is the store path of a text file with contents sum (sha256) and references, as Nix
// adds .drv files and builtins.toFile results.
func TextPath(name string, sum [sha256.Size]byte, refs []string) string {
	return makeStorePath(typeWithRefs("text", refs, false), sum, name)
}

// SourcePath is the store path of a recursively hashed path (its NAR's sha256), as Nix adds
// sources: path literals, builtins.path, fetchGit and fetchTarball results.
func SourcePath(name string, narHash [sha256.Size]byte, refs []string, self bool) string {
	return makeStorePath(typeWithRefs("source", refs, self), narHash, name)
}

// FlatFixedPath is the store path of a flat file with sha256 sum fixed in advance (builtins.path
// with recursive = false, builtins.fetchurl), which has no references.
func FlatFixedPath(name string, sum [sha256.Size]byte) string {
	inner := sha256.Sum256([]byte("fixed:out:sha256:" + hex.EncodeToString(sum[:]) + ":"))
	return makeStorePath("output:out", inner, name)
}

// FileNAR returns the NAR of a single regular file with contents.
func FileNAR(contents []byte, executable bool) []byte {
	var b bytes.Buffer
	n := &narWriter{w: bufio.NewWriter(&b)}
	for _, s := range []string{narMagic, "(", "type", "regular"} {
		n.str(s)
	}
	if executable {
		n.str("executable")
		n.str("")
	}
	n.str("contents")
	n.header(uint64(len(contents)))
	_, _ = n.w.Write(contents)
	n.pad(uint64(len(contents)))
	n.str(")")
	_ = n.w.Flush()
	return b.Bytes()
}

// NARFacts is what InspectNAR learns from a NAR.
type NARFacts struct {
	NarHash [sha256.Size]byte
	NarSize int64
	// SingleFile is set when the NAR is one regular file; FileHash is then its contents' sha256.
	SingleFile, Executable bool
	FileHash               [sha256.Size]byte
}

// InspectNAR reads a whole NAR from r, hashing it and, when it is a single regular file, that
// file's contents. Only the head of the NAR is parsed: whether the rest is well formed is
// Nix's business when it unpacks it (the hash covers every byte).
func InspectNAR(r io.Reader) (NARFacts, error) {
	var f NARFacts
	narSum := sha256.New()
	cr := &countingReader{r: io.TeeReader(r, narSum)}
	br := bufio.NewReaderSize(cr, 64<<10)
	p := narTokens{r: br}
	head := []string{narMagic, "(", "type"}
	for _, want := range head {
		if got, err := p.str(256); err != nil || got != want {
			return f, fmt.Errorf("inspect nar: not a NAR (want %q)", want)
		}
	}
	typ, err := p.str(256)
	if err != nil {
		return f, fmt.Errorf("inspect nar: %w", err)
	}
	if typ == "regular" {
		tok, err := p.str(256)
		if err != nil {
			return f, fmt.Errorf("inspect nar: %w", err)
		}
		if tok == "executable" {
			if _, err := p.str(256); err != nil {
				return f, fmt.Errorf("inspect nar: %w", err)
			}
			f.Executable = true
			if tok, err = p.str(256); err != nil {
				return f, fmt.Errorf("inspect nar: %w", err)
			}
		}
		if tok != "contents" {
			return f, fmt.Errorf("inspect nar: want contents, got %q", tok)
		}
		size, err := p.u64()
		if err != nil {
			return f, fmt.Errorf("inspect nar: %w", err)
		}
		fileSum := sha256.New()
		if _, err := io.CopyN(fileSum, br, int64(size)); err != nil {
			return f, fmt.Errorf("inspect nar: file contents: %w", err)
		}
		copy(f.FileHash[:], fileSum.Sum(nil))
		f.SingleFile = true
	}
	if _, err := io.Copy(io.Discard, br); err != nil {
		return f, fmt.Errorf("inspect nar: %w", err)
	}
	copy(f.NarHash[:], narSum.Sum(nil))
	f.NarSize = cr.n
	return f, nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// narTokens reads NAR tokens: a little-endian 64-bit length, the bytes, zero padding to 8.
type narTokens struct {
	r   *bufio.Reader
	buf [8]byte
}

func (t *narTokens) u64() (uint64, error) {
	if _, err := io.ReadFull(t.r, t.buf[:]); err != nil {
		return 0, fmt.Errorf("truncated: %w", err)
	}
	return binary.LittleEndian.Uint64(t.buf[:]), nil
}

func (t *narTokens) str(limit uint64) (string, error) {
	n, err := t.u64()
	if err != nil {
		return "", err
	}
	if n > limit {
		return "", errors.New("token too long")
	}
	b := make([]byte, n+(8-n%8)%8)
	if _, err := io.ReadFull(t.r, b); err != nil {
		return "", fmt.Errorf("truncated: %w", err)
	}
	return string(b[:n]), nil
}

// ContentAddress recomputes the store path of an object whose NAR facts and references are
// known, trying the ways Nix adds sources: recursive (a NAR hash), text (a single
// non-executable file) and flat fixed-output (a single file without references). It returns
// the narinfo CA field of the way that yields path, or an error saying the path does not
// follow from its content.
func ContentAddress(path string, f NARFacts, refs []string) (string, error) {
	sp, err := ParseStorePath(path)
	if err != nil {
		return "", err
	}
	self := slices.Contains(refs, path)
	others := slices.DeleteFunc(slices.Clone(refs), func(r string) bool { return r == path })
	if SourcePath(sp.Name, f.NarHash, others, self) == path {
		return "fixed:r:" + FormatSHA256(f.NarHash), nil
	}
	if f.SingleFile && !f.Executable && !self {
		if TextPath(sp.Name, f.FileHash, refs) == path {
			return "text:" + FormatSHA256(f.FileHash), nil
		}
		if len(refs) == 0 && FlatFixedPath(sp.Name, f.FileHash) == path {
			return "fixed:" + FormatSHA256(f.FileHash), nil
		}
	}
	return "", fmt.Errorf("%s is not the content address of its NAR and references", path)
}

// DerivationPath recomputes the store path of a .drv file from its text: a text path named
// after the derivation whose references are its input sources and input derivations.
func DerivationPath(name string, text []byte) (string, *Derivation, error) {
	if !strings.HasSuffix(name, ".drv") {
		return "", nil, fmt.Errorf("derivation name %q does not end in .drv", name)
	}
	d, err := ParseDerivation(text)
	if err != nil {
		return "", nil, err
	}
	return TextPath(name, sha256.Sum256(text), d.References()), d, nil
}
