package nix

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"testing"

	"github.com/klauspost/compress/zstd"
)

func TestCompressNAR(t *testing.T) {
	root := makeTree(t)
	var file bytes.Buffer
	sizes, err := CompressNAR(context.Background(), root, &file)
	if err != nil {
		t.Fatal(err)
	}
	nar := narBytes(t, root)
	if want := FormatSHA256(sha256.Sum256(nar)); sizes.NarHash != want || sizes.NarSize != int64(len(nar)) {
		t.Errorf("NAR: got %s/%d, want %s/%d", sizes.NarHash, sizes.NarSize, want, len(nar))
	}
	if want := FormatSHA256(sha256.Sum256(file.Bytes())); sizes.FileHash != want || sizes.FileSize != int64(file.Len()) {
		t.Errorf("file: got %s/%d, want %s/%d", sizes.FileHash, sizes.FileSize, want, file.Len())
	}
	if sizes.FileSize >= sizes.NarSize {
		// The tree is mostly 1 MiB of random data, but the NAR framing must still compress.
		t.Errorf("compressed %d bytes into %d", sizes.NarSize, sizes.FileSize)
	}
	dec, err := zstd.NewReader(&file)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	var plain bytes.Buffer
	if _, err := plain.ReadFrom(dec); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(plain.Bytes(), nar) {
		t.Fatal("decompressed file differs from WriteNAR output")
	}
	if h, n, err := HashNAR(root); err != nil || h != sizes.NarHash || n != sizes.NarSize {
		t.Errorf("HashNAR = %s/%d/%v, CompressNAR said %s/%d", h, n, err, sizes.NarHash, sizes.NarSize)
	}
}

func TestCompressNARCancelled(t *testing.T) {
	root := makeTree(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := CompressNAR(ctx, root, &bytes.Buffer{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("CompressNAR with a cancelled context: err = %v, want context.Canceled", err)
	}
}
