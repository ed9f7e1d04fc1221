package nix

import (
	"context"
	"crypto/sha256"
	"fmt"
	"hash"
	"io"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// Sizes describes one cache entry: the NAR as Nix hashes it and the compressed file as stored.
type Sizes struct {
	NarHash  string // "sha256:<nix32>" of the uncompressed NAR
	NarSize  int64
	FileHash string // "sha256:<nix32>" of the compressed file
	FileSize int64
}

// hashCounter hashes and counts everything written through it, and stops the pipeline when the
// context is cancelled (checked per write, which is per buffer, not per byte).
type hashCounter struct {
	ctx context.Context
	w   io.Writer
	h   hash.Hash
	n   int64
}

func newHashCounter(ctx context.Context, w io.Writer) *hashCounter {
	return &hashCounter{ctx: ctx, w: w, h: sha256.New()}
}

func (c *hashCounter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := c.w.Write(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	return n, err
}

func (c *hashCounter) sum() string {
	var s [sha256.Size]byte
	c.h.Sum(s[:0])
	return FormatSHA256(s)
}

// CompressNAR serialises path as a NAR, compresses it with zstd into dst and returns the hashes
// and sizes of both forms, in one streaming pass: the NAR is never held in memory or on disk.
// On error dst holds a partial file and the caller must discard it.
func CompressNAR(ctx context.Context, path string, dst io.Writer) (Sizes, error) {
	return CompressNARFrom(ctx, func(w io.Writer) error { return WriteNAR(w, path) }, dst)
}

// CompressNARFrom is CompressNAR for a NAR that write produces (a Nix daemon's NarFromPath).
func CompressNARFrom(ctx context.Context, write func(w io.Writer) error, dst io.Writer) (Sizes, error) {
	file := newHashCounter(ctx, dst)
	// One encoder per call, without goroutines of its own: callers get their parallelism from
	// compressing many paths at once.
	zw := getEncoder()
	zw.Reset(file)
	nar := newHashCounter(ctx, zw)
	if err := write(nar); err != nil {
		// Closed (dst is discarded anyway) and not pooled: the stream failed half-way.
		zw.Close()
		return Sizes{}, fmt.Errorf("compress nar: %w", err)
	}
	if err := zw.Close(); err != nil {
		return Sizes{}, fmt.Errorf("compress nar: %w", err)
	}
	zw.Reset(nil) // drop dst
	encoders.Put(zw)
	return Sizes{NarHash: nar.sum(), NarSize: nar.n, FileHash: file.sum(), FileSize: file.n}, nil
}

// HashNAR returns the NAR hash ("sha256:<nix32>") and NAR size of path, as recorded in Nix's
// database and shown by `nix path-info`.
func HashNAR(path string) (narHash string, narSize int64, err error) {
	c := newHashCounter(context.Background(), io.Discard)
	if err := WriteNAR(c, path); err != nil {
		return "", 0, fmt.Errorf("hash nar: %w", err)
	}
	return c.sum(), c.n, nil
}

// encoders keeps zstd encoders between calls: a new one allocates and clears about 10 MB
// (its 8 MB window and match tables), which cost as much as compressing a few MB. Reset starts
// an independent frame, byte for byte what a new encoder writes. Each has one goroutine, so
// callers compress in parallel with an encoder each.
var encoders sync.Pool

func getEncoder() *zstd.Encoder {
	if zw, ok := encoders.Get().(*zstd.Encoder); ok {
		return zw
	}
	zw, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	if err != nil {
		panic(fmt.Sprintf("zstd encoder: %v", err)) // the options are constants
	}
	return zw
}

// Compress returns b compressed with zstd as CompressNAR compresses a stream: for small objects
// (a .drv's NAR, a log) held in memory. Encoders come from the pool, so concurrent calls do not
// wait for each other.
func Compress(b []byte) []byte {
	zw := getEncoder()
	defer encoders.Put(zw)
	return zw.EncodeAll(b, make([]byte, 0, len(b)/2+64))
}
