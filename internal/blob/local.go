package blob

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
)

// tmpPrefix starts the names of in-progress writes. No valid key has a segment starting with
// '.', so List never sees them and no key can name one.
const tmpPrefix = ".tmp-"

// tmpRoot holds tmpShards directories for in-progress writes; like tmpPrefix, no key can name it.
const (
	tmpRoot   = ".tmp"
	tmpShards = 16
)

// Local is a Store in a local directory. All file access goes through an os.Root opened on
// the directory, so no key (and no symlink planted inside it) can reach a file outside it.
//
// Local keeps no metadata besides the file: Info.ContentType is ContentTypeFor(key).
type Local struct {
	dir        string // absolute, cleaned
	root       *os.Root
	uploadBase string
	secret     []byte
	now        func() time.Time
	shardMade  [tmpShards]atomic.Bool
	syncs      syncGroup
}

var _ Store = (*Local)(nil)

// NewLocal returns a store in dir, creating it if needed. uploadBase (such as
// "http://node:7777") is where UploadHandler is served, for the URLs of PresignPut; secret
// keys their signatures and must be at least 16 bytes.
func NewLocal(dir string, uploadBase string, secret []byte) (*Local, error) {
	if len(secret) < 16 {
		return nil, fmt.Errorf("blob: local store secret is %d bytes, want at least 16", len(secret))
	}
	if uploadBase != "" {
		u, err := url.Parse(uploadBase)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("blob: upload base %q is not an http(s) URL", uploadBase)
		}
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("blob: %w", err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("blob: %w", err)
	}
	root, err := os.OpenRoot(abs)
	if err != nil {
		return nil, fmt.Errorf("blob: %w", err)
	}
	return &Local{
		dir:        abs,
		root:       root,
		uploadBase: strings.TrimSuffix(uploadBase, "/"),
		secret:     append([]byte(nil), secret...),
		now:        time.Now,
	}, nil
}

// Close releases the directory handle.
func (l *Local) Close() error { return l.root.Close() }

// Dir returns the store's absolute directory.
func (l *Local) Dir() string { return l.dir }

// relPath turns a key into a path relative to the store. Keys are validated first; the
// Join/Clean check is a second line of defence (os.Root is the third).
func (l *Local) relPath(key string) (string, error) {
	if err := ValidKey(key); err != nil {
		return "", err
	}
	full := filepath.Join(l.dir, filepath.FromSlash(key))
	rel, err := filepath.Rel(l.dir, full)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) ||
		filepath.IsAbs(rel) || !strings.HasPrefix(full, l.dir+string(filepath.Separator)) {
		return "", fmt.Errorf("blob: key %q resolves outside the store", key)
	}
	return rel, nil
}

func notFound(key string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return fmt.Errorf("blob: %s: %w", key, err)
}

func (l *Local) info(key string, fi fs.FileInfo) Info {
	return Info{Key: key, Size: fi.Size(), ModTime: fi.ModTime(), ContentType: ContentTypeFor(key)}
}

// Put writes the object atomically: to a temporary file in the same directory, synced, then
// renamed into place. A body that is not exactly size bytes, or whose sha256 is not o.SHA256,
// leaves nothing behind.
func (l *Local) Put(ctx context.Context, key string, r io.Reader, size int64, o PutOptions) error {
	if o.SHA256 != nil && len(o.SHA256) != sha256.Size {
		return fmt.Errorf("blob: put %s: sha256 is %d bytes, want %d", key, len(o.SHA256), sha256.Size)
	}
	return l.put(ctx, key, r, size, o.SHA256, o.IfAbsent)
}

func (l *Local) put(ctx context.Context, key string, r io.Reader, size int64, sum []byte, ifAbsent bool) (err error) {
	rel, err := l.relPath(key)
	if err != nil {
		return err
	}
	if size < 0 {
		return fmt.Errorf("blob: put %s: negative size %d", key, size)
	}
	dir := filepath.Dir(rel)
	if dir != "." {
		if err := l.root.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("blob: put %s: %w", key, err)
		}
	}
	var rnd [12]byte
	_, _ = rand.Read(rnd[:])
	// In-progress writes go to one of several directories beside the keys: creating a file
	// takes its directory's lock, and every key of a kind lives in one directory.
	shard := int(rnd[0]) % tmpShards
	tmpDir := filepath.Join(tmpRoot, strconv.Itoa(shard))
	if !l.shardMade[shard].Load() {
		if err := l.root.MkdirAll(tmpDir, 0o755); err != nil {
			return fmt.Errorf("blob: put %s: %w", key, err)
		}
		l.shardMade[shard].Store(true)
	}
	tmp := filepath.Join(tmpDir, tmpPrefix+hex.EncodeToString(rnd[:]))
	f, err := l.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("blob: put %s: %w", key, err)
	}
	defer func() {
		if f != nil {
			_ = f.Close()
		}
		if err != nil {
			_ = l.root.Remove(tmp)
		}
	}()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(ctxReader{ctx, r}, size+1))
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return &MismatchError{Key: key, What: "size", Want: strconv.FormatInt(size, 10), Got: "a short body"}
		}
		return fmt.Errorf("blob: put %s: %w", key, err)
	}
	if n != size {
		got := strconv.FormatInt(n, 10)
		if n > size {
			got = "more"
		}
		return &MismatchError{Key: key, What: "size", Want: strconv.FormatInt(size, 10), Got: got}
	}
	if got := h.Sum(nil); sum != nil && !hmac.Equal(got, sum) {
		return &MismatchError{Key: key, What: "sha256", Want: hex.EncodeToString(sum), Got: hex.EncodeToString(got)}
	}
	if err := f.Close(); err != nil {
		f = nil
		return fmt.Errorf("blob: put %s: %w", key, err)
	}
	f = nil
	if ifAbsent {
		// Of two racing writers, one wins: the rename never replaces an existing name.
		err := l.renameNoReplace(tmp, rel)
		if err != nil {
			_ = l.root.Remove(tmp)
		}
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%w: %s", ErrExists, key)
		}
		if err != nil {
			return fmt.Errorf("blob: put %s: %w", key, err)
		}
		return nil
	}
	if err := l.root.Rename(tmp, rel); err != nil {
		return fmt.Errorf("blob: put %s: %w", key, err)
	}
	// Durability comes from Sync, once per batch: the signer syncs before it records a build.
	// Until then the write-then-rename keeps readers from ever seeing a partial object.
	return nil
}

// renameNoReplace renames tmp to rel unless rel exists (fs.ErrExist then), in one step: the
// rename(2) flag RENAME_NOREPLACE, on directories opened through the root. File systems without
// the flag get a hard link and an unlink, which is atomic too but costs one more operation.
func (l *Local) renameNoReplace(tmp, rel string) error {
	from, err := l.root.Open(filepath.Dir(tmp))
	if err != nil {
		return err
	}
	defer from.Close()
	to, err := l.root.Open(filepath.Dir(rel))
	if err != nil {
		return err
	}
	defer to.Close()
	err = unix.Renameat2(int(from.Fd()), filepath.Base(tmp), int(to.Fd()), filepath.Base(rel), unix.RENAME_NOREPLACE)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EEXIST):
		return fs.ErrExist
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOSYS):
		if err := l.root.Link(tmp, rel); err != nil {
			return err
		}
		return l.root.Remove(tmp)
	}
	return err
}

// SyncKeys makes the named objects durable: each file and each directory that names one is
// fsynced, all at once, so that the journal commits them together. Unlike Sync it writes back
// nothing else the file system holds: on a builder's or a cache's disk that is the Nix store,
// whose builds leave megabytes dirty. A key that does not exist is an error.
func (l *Local) SyncKeys(ctx context.Context, keys []string) error {
	names := map[string]bool{}
	for _, k := range keys {
		rel, err := l.relPath(k)
		if err != nil {
			return err
		}
		names[rel] = true
		names[filepath.Dir(rel)] = true
	}
	var g errgroup.Group
	for name := range names {
		g.Go(func() error {
			f, err := l.root.Open(name)
			if err != nil {
				return fmt.Errorf("blob: sync %s: %w", name, err)
			}
			defer f.Close()
			if err := f.Sync(); err != nil {
				return fmt.Errorf("blob: sync %s: %w", name, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// Sync makes every object written so far durable (syncfs(2) on the store's file system): one
// flush per batch of objects instead of two fsyncs per object, which on this kind of disk cost
// more than everything else a small object needs. Concurrent callers share flushes (see
// syncGroup).
func (l *Local) Sync(ctx context.Context) error {
	return l.syncs.do(func() error {
		d, err := l.root.Open(".")
		if err != nil {
			return fmt.Errorf("blob: sync: %w", err)
		}
		defer d.Close()
		if err := unix.Syncfs(int(d.Fd())); err != nil {
			return fmt.Errorf("blob: sync: %w", err)
		}
		return nil
	})
}

// MismatchError reports a body that differs from what was declared: its size or its sha256.
type MismatchError struct {
	Key       string
	What      string // "size" or "sha256"
	Want, Got string
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("blob: put %s: %s mismatch: declared %s, body has %s; nothing stored", e.Key, e.What, e.Want, e.Got)
}

// ctxReader stops a copy when ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// Get opens key. The caller must close the reader.
func (l *Local) Get(ctx context.Context, key string) (io.ReadCloser, Info, error) {
	rel, err := l.relPath(key)
	if err != nil {
		return nil, Info{}, err
	}
	f, err := l.root.Open(rel)
	if err != nil {
		return nil, Info{}, notFound(key, err)
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, Info{}, notFound(key, err)
	}
	if !fi.Mode().IsRegular() {
		_ = f.Close()
		return nil, Info{}, fmt.Errorf("blob: %s is not a regular file", key)
	}
	return f, l.info(key, fi), nil
}

// Head describes key.
func (l *Local) Head(ctx context.Context, key string) (Info, error) {
	rel, err := l.relPath(key)
	if err != nil {
		return Info{}, err
	}
	fi, err := l.root.Stat(rel)
	if err != nil {
		return Info{}, notFound(key, err)
	}
	if !fi.Mode().IsRegular() {
		return Info{}, fmt.Errorf("blob: %s is not a regular file", key)
	}
	return l.info(key, fi), nil
}

// Delete removes key; an absent key is not an error.
func (l *Local) Delete(ctx context.Context, key string) error {
	rel, err := l.relPath(key)
	if err != nil {
		return err
	}
	if err := l.root.Remove(rel); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("blob: delete %s: %w", key, err)
	}
	return nil
}

// List calls fn for each object whose key starts with prefix. Only files whose path is a
// valid key are listed (not temporary files, not anything else placed in the directory).
func (l *Local) List(ctx context.Context, prefix string, fn func(Info) error) error {
	if err := validPrefix(prefix); err != nil {
		return err
	}
	// Start at the deepest directory the prefix names.
	start := "."
	if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
		start = prefix[:i]
	}
	err := fs.WalkDir(l.root.FS(), start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == start && errors.Is(err, fs.ErrNotExist) {
				return fs.SkipAll
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if d.IsDir() {
			if p == start {
				return nil
			}
			// Descend only into directories that can hold keys with the prefix.
			if !strings.HasPrefix(p+"/", prefix) && !strings.HasPrefix(prefix, p+"/") {
				return fs.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || !strings.HasPrefix(p, prefix) || ValidKey(p) != nil {
			return nil
		}
		fi, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil // deleted while listing
		} else if err != nil {
			return err
		}
		return fn(l.info(p, fi))
	})
	if err != nil {
		return fmt.Errorf("blob: list %q: %w", prefix, err)
	}
	return nil
}

// PresignPut returns a URL on uploadBase that UploadHandler accepts for exactly this key,
// size, sha256 and content type, until expiry.
func (l *Local) PresignPut(ctx context.Context, key string, size int64, sum []byte, contentType string, expiry time.Duration) (Upload, error) {
	if l.uploadBase == "" {
		return Upload{}, errors.New("blob: local store has no upload base URL")
	}
	if err := checkPresign(key, size, sum, expiry); err != nil {
		return Upload{}, err
	}
	if contentType == "" {
		contentType = ContentTypeFor(key)
	}
	return l.signedUpload(key, size, sum, contentType, l.now().Add(expiry).Truncate(time.Second)), nil
}

// signedUpload is the upload URL of key, signed for exactly size bytes with sha256 sum and
// contentType, until expires. PresignPut has checked them.
func (l *Local) signedUpload(key string, size int64, sum []byte, contentType string, expires time.Time) Upload {
	sumHex := hex.EncodeToString(sum)
	q := url.Values{}
	q.Set("expires", strconv.FormatInt(expires.Unix(), 10))
	q.Set("size", strconv.FormatInt(size, 10))
	q.Set("sha256", sumHex)
	q.Set("sig", hex.EncodeToString(l.sign(http.MethodPut, key, expires.Unix(), size, sumHex, contentType)))
	h := http.Header{}
	h.Set("Content-Type", contentType)
	h.Set("Content-Length", strconv.FormatInt(size, 10))
	return Upload{
		URL:     l.uploadBase + "/api/blob/" + escapeKey(key) + "?" + q.Encode(),
		Method:  http.MethodPut,
		Headers: h,
		Expires: expires,
	}
}

// escapeKey escapes each segment of key for a URL path ('?' can occur in a derivation name).
func escapeKey(key string) string {
	segs := strings.Split(key, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return strings.Join(segs, "/")
}

func (l *Local) sign(method, key string, expires, size int64, sumHex, contentType string) []byte {
	m := hmac.New(sha256.New, l.secret)
	fmt.Fprintf(m, "%s|%s|%d|%d|%s|%s", method, key, expires, size, sumHex, contentType)
	return m.Sum(nil)
}

// UploadHandler serves PUT /api/blob/{key...} for URLs from PresignPut. Only NARs and logs are
// uploaded this way (the signer writes narinfos itself). It answers 403 for a missing, wrong or
// expired signature, an expiry beyond MaxURLExpiry or another kind of key; 400 for an invalid
// key or a body whose length or sha256 is not the signed one (nothing is stored then); 411
// without a Content-Length; 408 for a body that does not arrive within uploadDeadline of its
// size; and 200 once the object is in place. A NAR that exists already is
// left as it is (its key is its content's hash), so re-uploading one succeeds.
func (l *Local) UploadHandler(logger *slog.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("PUT /api/blob/{key...}", httpapi.Handle(logger, l.serveUpload))
	return mux
}

// Upload deadlines: a body may take uploadGrace plus one second per minUploadRate bytes, so a
// large NAR on a slow link is not cut off by the server's general read timeout.
const (
	uploadGrace   = 30 * time.Second
	minUploadRate = 1000 // bytes per second
)

func uploadDeadline(size int64) time.Duration {
	return uploadGrace + time.Duration(size/minUploadRate)*time.Second
}

func (l *Local) serveUpload(w http.ResponseWriter, r *http.Request) error {
	key := r.PathValue("key")
	q := r.URL.Query()
	expires, err1 := strconv.ParseInt(q.Get("expires"), 10, 64)
	size, err2 := strconv.ParseInt(q.Get("size"), 10, 64)
	sumHex := q.Get("sha256")
	sum, err3 := hex.DecodeString(sumHex)
	sig, err4 := hex.DecodeString(q.Get("sig"))
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || len(sum) != sha256.Size || size < 0 {
		return httpapi.Errorf(http.StatusForbidden, "blob upload: missing or malformed expires, size, sha256 or sig parameter")
	}
	want := l.sign(r.Method, key, expires, size, sumHex, r.Header.Get("Content-Type"))
	if !hmac.Equal(sig, want) {
		return httpapi.Errorf(http.StatusForbidden, "blob upload: signature does not match this key, size, sha256 and content type")
	}
	now := l.now()
	if !now.Before(time.Unix(expires, 0)) {
		return httpapi.Errorf(http.StatusForbidden, "blob upload: URL expired at %s", time.Unix(expires, 0).UTC().Format(time.RFC3339))
	}
	if time.Unix(expires, 0).After(now.Add(MaxURLExpiry + time.Minute)) {
		return httpapi.Errorf(http.StatusForbidden, "blob upload: URL valid until %s, beyond the %v ceiling", time.Unix(expires, 0).UTC().Format(time.RFC3339), MaxURLExpiry)
	}
	if err := ValidKey(key); err != nil {
		return httpapi.Errorf(http.StatusBadRequest, "blob upload: %v", err)
	}
	if !IsNAR(key) && !strings.HasPrefix(key, "log/") {
		return httpapi.Errorf(http.StatusForbidden, "blob upload: only nar/ and log/ objects are uploaded; the signer writes %s itself", key)
	}
	if IsNAR(key) && !bytes.Equal(narKeySum(key), sum) {
		return httpapi.Errorf(http.StatusBadRequest, "blob upload: %s is not named after the sha256 %s", key, sumHex)
	}
	if r.ContentLength < 0 {
		return httpapi.Errorf(http.StatusLengthRequired, "blob upload: Content-Length required")
	}
	if r.ContentLength != size {
		return httpapi.Errorf(http.StatusBadRequest, "blob upload: Content-Length %d is not the signed size %d; nothing stored", r.ContentLength, size)
	}
	// Signed, so worth waiting for: the deadline follows the declared size.
	if err := http.NewResponseController(w).SetReadDeadline(time.Now().Add(uploadDeadline(size))); err != nil {
		return fmt.Errorf("blob upload: set read deadline: %w", err)
	}
	// A NAR is written once; one whose size is not its key's (cut short by a crash before the
	// signer's sync) is replaced, or it would be refused as "not uploaded" forever.
	writeOnce := IsNAR(key)
	if fi, err := l.Head(r.Context(), key); writeOnce && err == nil && fi.Size != size {
		writeOnce = false
	}
	err := l.put(r.Context(), key, r.Body, size, sum, writeOnce)
	var mm *MismatchError
	switch {
	case errors.As(err, &mm):
		return httpapi.Errorf(http.StatusBadRequest, "blob upload: %s", mm.Error())
	case errors.Is(err, ErrExists):
		// The same content is there already.
	case errors.Is(err, os.ErrDeadlineExceeded):
		// The client's fault, not the store's: a 500 would page someone about a slow link.
		return &httpapi.Error{Code: http.StatusRequestTimeout, Msg: fmt.Sprintf("blob upload: the %d-byte body did not arrive within %v; nothing stored", size, uploadDeadline(size)), Err: err}
	case err != nil:
		return &httpapi.Error{Code: http.StatusInternalServerError, Msg: "blob upload: storing failed", Err: err}
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// ContentTypeFor returns the content type the binary cache serves key with.
func ContentTypeFor(key string) string {
	switch {
	case key == "nix-cache-info":
		return "text/x-nix-cache-info"
	case strings.HasSuffix(key, ".narinfo"):
		return "text/x-nix-narinfo"
	case strings.HasPrefix(key, "nar/"):
		return "application/x-nix-nar"
	case strings.HasPrefix(key, "log/"):
		return "text/plain; charset=utf-8"
	case strings.HasSuffix(key, ".ls"), strings.HasSuffix(key, ".doi"):
		return "application/json"
	}
	return "application/octet-stream"
}

// checkingReader passes r through but withholds the final bytes, returning an error instead,
// unless r holds exactly size bytes whose sha256 is sum (if set). A consumer that stops after
// size bytes therefore never receives a complete wrong body.
type checkingReader struct {
	r    io.Reader
	key  string
	size int64
	sum  []byte // nil: length only
	h    hash.Hash
	n    int64
	done bool
}

func newCheckingReader(r io.Reader, key string, size int64, sum []byte) *checkingReader {
	return &checkingReader{r: r, key: key, size: size, sum: sum, h: sha256.New()}
}

func (v *checkingReader) Read(p []byte) (int, error) {
	if v.done {
		return 0, io.EOF
	}
	if rem := v.size - v.n; int64(len(p)) > rem {
		p = p[:rem]
	}
	var n int
	var err error
	if len(p) > 0 {
		n, err = v.r.Read(p)
		v.h.Write(p[:n])
		v.n += int64(n)
	}
	if v.n < v.size {
		if err == io.EOF {
			return 0, &MismatchError{Key: v.key, What: "size", Want: strconv.FormatInt(v.size, 10), Got: strconv.FormatInt(v.n, 10)}
		}
		return n, err
	}
	// All size bytes are read: r must end here and match the sum.
	var one [1]byte
	if m, _ := io.ReadFull(v.r, one[:]); m > 0 {
		return 0, &MismatchError{Key: v.key, What: "size", Want: strconv.FormatInt(v.size, 10), Got: "more"}
	}
	if got := v.h.Sum(nil); v.sum != nil && !hmac.Equal(got, v.sum) {
		return 0, &MismatchError{Key: v.key, What: "sha256", Want: hex.EncodeToString(v.sum), Got: hex.EncodeToString(got)}
	}
	v.done = true
	return n, nil
}
