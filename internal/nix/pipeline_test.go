package nix

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
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

// compressible is text whose matches a reused encoder could wrongly find in an earlier stream.
func compressible(n int) []byte {
	var b bytes.Buffer
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "line %d of a text that repeats itself %d\n", i%977, i%13)
	}
	return b.Bytes()[:n]
}

// TestEncoderReuseSameBytes: the pool relies on a reset encoder writing exactly what a new
// one writes, for streams and for EncodeAll, after it compressed the same data before.
func TestEncoderReuseSameBytes(t *testing.T) {
	data := compressible(3 << 20)
	stream := func(zw *zstd.Encoder) []byte {
		var out bytes.Buffer
		zw.Reset(&out)
		for off := 0; off < len(data); off += 50000 {
			if _, err := zw.Write(data[off:min(off+50000, len(data))]); err != nil {
				t.Fatal(err)
			}
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		return out.Bytes()
	}
	fresh, err := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	want, wantAll := stream(fresh), fresh.EncodeAll(data, nil)
	zw := getEncoder()
	for i := range 3 {
		if got := stream(zw); !bytes.Equal(got, want) {
			t.Fatalf("stream %d of a reused encoder: %d bytes differ from a new encoder's %d", i, len(got), len(want))
		}
		if got := zw.EncodeAll(data, nil); !bytes.Equal(got, wantAll) {
			t.Fatalf("EncodeAll %d of a reused encoder: %d bytes differ from a new encoder's %d", i, len(got), len(wantAll))
		}
	}
}

// TestCompressConcurrent: concurrent calls each get an encoder and write the same bytes.
func TestCompressConcurrent(t *testing.T) {
	data := compressible(1 << 20)
	want := Compress(data)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			if got := Compress(data); !bytes.Equal(got, want) {
				errs <- fmt.Errorf("concurrent Compress wrote %d bytes, alone %d", len(got), len(want))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	dec, err := zstd.NewReader(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	if plain, err := dec.DecodeAll(want, nil); err != nil || !bytes.Equal(plain, data) {
		t.Fatalf("Compress output does not decode to its input: %v", err)
	}
}
