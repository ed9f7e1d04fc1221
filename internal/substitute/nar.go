package substitute

import (
	"compress/bzip2"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// OpenNAR downloads the NAR of a found path and returns it decompressed. The reader checks the
// stream against the signed narinfo: a stream that grows past NarSize fails as soon as it
// does, and at its end one that is shorter than NarSize or whose sha256 is not NarHash fails
// instead of returning io.EOF. Nothing read is trustworthy until Read has returned io.EOF.
//
// The NAR's URL is resolved against the cache as Nix does (cache + "/" + URL); absolute URLs,
// which would send the request to another server, are refused. Compression may be "none",
// "zstd", "xz" or "bzip2". FileHash and FileSize are not checked: they are not signed, and
// Nix ignores them too.
func (f *Fetcher) OpenNAR(ctx context.Context, found *Found) (io.ReadCloser, error) {
	if found == nil || found.Info == nil {
		return nil, errors.New("open nar: no narinfo")
	}
	ni := found.Info
	fail := func(err error) error { return fmt.Errorf("open nar %s from %s: %w", ni.StorePath, found.Cache, err) }
	want, err := nix.ParseSHA256(ni.NarHash)
	if err != nil {
		return nil, fail(err)
	}
	if ni.NarSize <= 0 {
		return nil, fail(fmt.Errorf("NarSize %d", ni.NarSize))
	}
	decompress, ok := decompressors[ni.Compression]
	if !ok {
		return nil, fail(fmt.Errorf("unsupported compression %q", ni.Compression))
	}
	u, err := narURL(found.Cache, ni.URL)
	if err != nil {
		return nil, fail(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fail(err)
	}
	resp, err := f.client().Do(req)
	if err != nil {
		return nil, fail(err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fail(fmt.Errorf("GET %s: unexpected status %s", ni.URL, resp.Status))
	}
	dec, err := decompress(resp.Body)
	if err != nil {
		resp.Body.Close()
		return nil, fail(fmt.Errorf("%s: %w", ni.Compression, err))
	}
	return &narReader{
		r: dec, body: resp.Body, sum: sha256.New(), size: ni.NarSize, want: want,
		what: "nar " + ni.StorePath + " from " + found.Cache,
	}, nil
}

// narURL resolves a narinfo URL against the cache's base URL.
func narURL(cache, rel string) (string, error) {
	base, err := cacheURL(cache)
	if err != nil {
		return "", err
	}
	r, err := url.Parse(rel)
	if err != nil {
		return "", fmt.Errorf("NAR URL: %w", err)
	}
	if r.Scheme != "" || r.Host != "" || strings.HasPrefix(rel, "/") {
		return "", fmt.Errorf("NAR URL %q: only URLs relative to the cache are supported", rel)
	}
	return base + "/" + rel, nil
}

// decompressors maps a narinfo Compression to a decompressing reader; Close releases it. The
// xz decoder, like liblzma in Nix, allocates the dictionary an xz header asks for (up to
// 1.5 GiB); only the NAR's hash, at its end, vouches for the stream.
var decompressors = map[string]func(io.Reader) (io.ReadCloser, error){
	"none": func(r io.Reader) (io.ReadCloser, error) { return io.NopCloser(r), nil },
	"zstd": func(r io.Reader) (io.ReadCloser, error) {
		// libzstd, which Nix uses, refuses windows over 128 MiB unless told otherwise; so do we,
		// rather than let a stream make us allocate whatever its header asks for.
		d, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(128<<20))
		if err != nil {
			return nil, err
		}
		return d.IOReadCloser(), nil
	},
	"xz": func(r io.Reader) (io.ReadCloser, error) {
		d, err := xz.NewReader(r)
		if err != nil {
			return nil, err
		}
		return io.NopCloser(d), nil
	},
	"bzip2": func(r io.Reader) (io.ReadCloser, error) { return io.NopCloser(bzip2.NewReader(r)), nil },
}

// narReader verifies a decompressed NAR against its signed size and hash. Errors are sticky.
type narReader struct {
	r    io.ReadCloser // decompressed
	body io.Closer
	sum  hash.Hash
	n    int64
	size int64
	want [sha256.Size]byte
	what string
	err  error
}

func (v *narReader) Read(p []byte) (int, error) {
	if v.err != nil {
		return 0, v.err
	}
	n, err := v.r.Read(p)
	if v.n += int64(n); v.n > v.size {
		v.err = fmt.Errorf("%s: longer than its NarSize of %d bytes", v.what, v.size)
		return 0, v.err
	}
	v.sum.Write(p[:n])
	switch {
	case err == io.EOF:
		if v.err = v.verify(); v.err != nil {
			return 0, v.err
		}
		v.err = io.EOF
		return n, io.EOF
	case err != nil:
		v.err = fmt.Errorf("%s: %w", v.what, err)
		return 0, v.err
	}
	return n, nil
}

// verify checks the whole stream once it has ended.
func (v *narReader) verify() error {
	if v.n != v.size {
		return fmt.Errorf("%s: truncated: %d of %d bytes", v.what, v.n, v.size)
	}
	var got [sha256.Size]byte
	v.sum.Sum(got[:0])
	if got != v.want {
		return fmt.Errorf("%s: NAR hash is %s, want %s", v.what, nix.FormatSHA256(got), nix.FormatSHA256(v.want))
	}
	return nil
}

// Close releases the decompressor and the connection.
func (v *narReader) Close() error {
	v.r.Close()
	return v.body.Close()
}

// ReadFile returns the contents of a found path that is a single regular file, such as a .drv,
// verified like OpenNAR's stream. A path that is anything else, or a file longer than limit
// bytes, is an error.
func (f *Fetcher) ReadFile(ctx context.Context, found *Found, limit int64) ([]byte, error) {
	rc, err := f.OpenNAR(ctx, found)
	if err != nil {
		return nil, fmt.Errorf("read file: %w", err)
	}
	defer rc.Close()
	contents, _, err := nix.ReadFileNAR(rc, limit)
	if err != nil {
		return nil, fmt.Errorf("read file %s: %w", found.Info.StorePath, err)
	}
	return contents, nil
}
