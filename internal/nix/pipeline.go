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
	// One encoder goroutine per call bounds memory and goroutines; the signer gets its
	// parallelism from compressing many paths at once.
	zw, err := zstd.NewWriter(file, zstd.WithEncoderConcurrency(1))
	if err != nil {
		return Sizes{}, fmt.Errorf("compress nar: %w", err)
	}
	nar := newHashCounter(ctx, zw)
	if err := write(nar); err != nil {
		zw.Close()
		return Sizes{}, fmt.Errorf("compress nar: %w", err)
	}
	if err := zw.Close(); err != nil {
		return Sizes{}, fmt.Errorf("compress nar: %w", err)
	}
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

var (
	zstdOnce sync.Once
	zstdEnc  *zstd.Encoder
)

// Compress returns b compressed with zstd as CompressNAR compresses a stream: for small objects
// (a .drv's NAR, a log) held in memory. One encoder is shared (EncodeAll is safe for concurrent
// use): one per object would cost more than the compression.
func Compress(b []byte) []byte {
	zstdOnce.Do(func() { zstdEnc, _ = zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1)) })
	return zstdEnc.EncodeAll(b, make([]byte, 0, len(b)/2+64))
}
