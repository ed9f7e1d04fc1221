// Package blob stores the binary cache's objects: a local directory or an S3-compatible bucket.
//
// Every key is checked against the binary cache layout by ValidKey before any backend touches
// it, so a key can never name a path outside the store or an object outside the layout:
//
//	nix-cache-info
//	<hash>.narinfo                  <hash>: 32 nix32 characters
//	<hash>.ls
//	nar/<filehash>.nar.zst          <filehash>: 52 nix32 characters
//	nar/<narhash>.nar               uncompressed (the .drv objects, see Derivations)
//	log/<hash>-<name>.drv           <name>: [A-Za-z0-9+\-._?=], not starting with '.'
//	log/<hash>-<name>.drv.<n>       one attempt's own log; <n>: 1 to 999999999, no leading zero
//	realisations/<hash>!<out>.doi   <out>: an output name, same characters as <name>
//
// nix32 is Nix's base32 alphabet "0123456789abcdfghijklmnpqrsvwxyz" (no e, o, t, u).
package blob

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// ErrNotFound is returned (possibly wrapped) for a key that does not exist.
var ErrNotFound = errors.New("blob not found")

// ErrExists is returned (possibly wrapped) by a Put with IfAbsent of a key that exists.
var ErrExists = errors.New("blob already exists")

// MaxURLExpiry is the longest a presigned upload URL may stay valid: a leaked URL can only write
// the exact body it was signed for, but not forever.
const MaxURLExpiry = time.Hour

// Info describes a stored object.
type Info struct {
	Key         string
	Size        int64
	ModTime     time.Time
	ContentType string
}

// Upload describes a presigned upload: the client PUTs the exact body to URL with Headers.
//
// Every header must be sent unchanged; the signature covers them. Headers includes
// Content-Length: a Go client sets http.Request.ContentLength to it instead (net/http takes
// the length from there, not from the header map). The server stores nothing unless the body
// has exactly the signed length and sha256. Expires is when the URL stops working.
type Upload struct {
	URL     string
	Method  string
	Headers http.Header
	Expires time.Time
}

// PutOptions are optional properties of a Put.
type PutOptions struct {
	ContentType string
	// SHA256 is the body's expected sha256; if set, a body with another sum is not stored.
	SHA256 []byte
	// IfAbsent stores the object only if the key does not exist yet, atomically; otherwise Put
	// stores nothing and returns an error wrapping ErrExists. Objects that are written once
	// (narinfos, NARs) use it so that two writers cannot race one over the other.
	IfAbsent bool
}

// Store is a blob store. Keys must pass ValidKey.
type Store interface {
	// Put stores exactly size bytes from r under key, replacing any object there unless
	// o.IfAbsent.
	Put(ctx context.Context, key string, r io.Reader, size int64, o PutOptions) error
	// Get opens key for reading. ErrNotFound if absent.
	Get(ctx context.Context, key string) (io.ReadCloser, Info, error)
	// Head describes key. ErrNotFound if absent.
	Head(ctx context.Context, key string) (Info, error)
	// Delete removes key. Deleting an absent key is not an error.
	Delete(ctx context.Context, key string) error
	// List calls fn for every object whose key starts with prefix, in key order; an error
	// from fn stops the listing and is returned.
	List(ctx context.Context, prefix string, fn func(Info) error) error
	// PresignPut returns an upload that can write only key, only with exactly size bytes whose
	// sha256 is sum, until expiry (at most MaxURLExpiry). A NAR (nar/…) is written once: an
	// upload to a NAR key that exists stores nothing (NAR keys are their content's hash).
	PresignPut(ctx context.Context, key string, size int64, sum []byte, contentType string, expiry time.Duration) (Upload, error)
}

// BatchDeleter is a Store that deletes many keys in one request (S3's DeleteObjects); the
// garbage collector uses it when the store has it.
type BatchDeleter interface {
	DeleteMany(ctx context.Context, keys []string) (failed []string, err error)
}

// Syncer is a Store whose writes become durable only when Sync returns (the local directory).
// Callers sync before they record anything that refers to what they wrote.
type Syncer interface {
	// Sync makes every object written so far durable.
	Sync(ctx context.Context) error
	// SyncKeys makes the named objects durable, which for a few objects costs less than Sync
	// when the file system holds other writers' data too (a Nix store, a build).
	SyncKeys(ctx context.Context, keys []string) error
}

const nix32Alphabet = "0123456789abcdfghijklmnpqrsvwxyz"

// maxNameLen is Nix's limit on the name part of a store path (including ".drv").
const maxNameLen = 211

func isNix32(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if strings.IndexByte(nix32Alphabet, s[i]) < 0 {
			return false
		}
	}
	return true
}

// validName reports whether s is a valid store path name (or output name) per Nix's rules.
func validName(s string) error {
	if s == "" {
		return errors.New("empty name")
	}
	if len(s) > maxNameLen {
		return fmt.Errorf("name is %d bytes, over %d", len(s), maxNameLen)
	}
	if s[0] == '.' {
		return errors.New("name starts with '.'")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("+-._?=", c) >= 0:
		default:
			return fmt.Errorf("name contains %q (allowed: A-Z a-z 0-9 + - . _ ? =)", c)
		}
	}
	return nil
}

// ValidKey reports whether key is an object of the binary cache layout (see the package
// documentation). Anything else, including any path with "..", a leading '/', empty segments
// or an unknown prefix, is rejected with an error saying why.
func ValidKey(key string) error {
	if err := validKey(key); err != nil {
		return fmt.Errorf("invalid blob key %q: %w", key, err)
	}
	return nil
}

// isAttempt reports whether s is an attempt number as log keys spell it: a positive decimal
// without leading zeros.
func isAttempt(s string) bool {
	if s == "" || len(s) > 9 || s[0] == '0' {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func validKey(key string) error {
	switch {
	case key == "":
		return errors.New("empty key")
	case key == "nix-cache-info":
		return nil
	case strings.HasPrefix(key, "/"):
		return errors.New("absolute path")
	case strings.Contains(key, "//"), strings.HasSuffix(key, "/"):
		return errors.New("empty path segment")
	case strings.Contains(key, "\\"):
		return errors.New("backslash in key")
	}
	for _, seg := range strings.Split(key, "/") {
		if seg == "." || seg == ".." {
			return fmt.Errorf("path segment %q", seg)
		}
	}
	dir, base, nested := strings.Cut(key, "/")
	if !nested {
		if h, ok := strings.CutSuffix(key, ".narinfo"); ok {
			return checkHash(h, 32, "narinfo hash")
		}
		if h, ok := strings.CutSuffix(key, ".ls"); ok {
			return checkHash(h, 32, "listing hash")
		}
		return errors.New("not nix-cache-info, <hash>.narinfo or <hash>.ls")
	}
	if strings.Contains(base, "/") {
		return errors.New("too many path segments")
	}
	switch dir {
	case "nar":
		h, ok := strings.CutSuffix(base, ".nar.zst")
		if !ok {
			h, ok = strings.CutSuffix(base, ".nar")
		}
		if !ok {
			return errors.New("nar key must be nar/<filehash>.nar.zst or nar/<narhash>.nar")
		}
		return checkHash(h, 52, "nar file hash")
	case "log":
		// log/<drv>.<attempt> is one attempt's own log; log/<drv> the latest.
		if i := strings.LastIndexByte(base, '.'); i >= 0 && isAttempt(base[i+1:]) {
			base = base[:i]
		}
		rest, ok := strings.CutSuffix(base, ".drv")
		if !ok {
			return errors.New("log key must be log/<hash>-<name>.drv or log/<hash>-<name>.drv.<attempt>")
		}
		h, name, ok := strings.Cut(rest, "-")
		if !ok {
			return errors.New("log key must be log/<hash>-<name>.drv")
		}
		if err := checkHash(h, 32, "derivation hash"); err != nil {
			return err
		}
		if err := validName(name + ".drv"); err != nil {
			return fmt.Errorf("derivation name: %w", err)
		}
		return nil
	case "realisations":
		rest, ok := strings.CutSuffix(base, ".doi")
		if !ok {
			return errors.New("realisation key must be realisations/<hash>!<out>.doi")
		}
		h, out, ok := strings.Cut(rest, "!")
		if !ok {
			return errors.New("realisation key must be realisations/<hash>!<out>.doi")
		}
		if err := checkHash(h, 32, "derivation hash"); err != nil {
			return err
		}
		if err := validName(out); err != nil {
			return fmt.Errorf("output name: %w", err)
		}
		return nil
	}
	return fmt.Errorf("unknown prefix %q (want nar/, log/ or realisations/)", dir+"/")
}

func checkHash(h string, n int, what string) error {
	if !isNix32(h, n) {
		return fmt.Errorf("%s %q is not %d nix32 characters", what, h, n)
	}
	return nil
}

// validPrefix checks a List prefix: any prefix of some valid key is accepted, but nothing that
// could escape the store.
func validPrefix(prefix string) error {
	if strings.HasPrefix(prefix, "/") || strings.Contains(prefix, "\\") || strings.Contains(prefix, "//") {
		return fmt.Errorf("invalid blob list prefix %q", prefix)
	}
	for _, seg := range strings.Split(prefix, "/") {
		if seg == "." || seg == ".." {
			return fmt.Errorf("invalid blob list prefix %q: path segment %q", prefix, seg)
		}
	}
	return nil
}

func checkPresign(key string, size int64, sum []byte, expiry time.Duration) error {
	if err := ValidKey(key); err != nil {
		return err
	}
	if size < 0 {
		return fmt.Errorf("presign %s: negative size %d", key, size)
	}
	if len(sum) != 32 {
		return fmt.Errorf("presign %s: sha256 is %d bytes, want 32", key, len(sum))
	}
	if expiry < time.Second || expiry > MaxURLExpiry {
		return fmt.Errorf("presign %s: expiry %v is not between 1s and %v", key, expiry, MaxURLExpiry)
	}
	if IsNAR(key) && !bytes.Equal(narKeySum(key), sum) {
		return fmt.Errorf("presign %s: a NAR key is the sha256 of its content, and this one is not %x", key, sum)
	}
	return nil
}

// IsNAR reports whether key names a NAR (nar/<filehash>.nar.zst, or nar/<narhash>.nar).
func IsNAR(key string) bool { return strings.HasPrefix(key, "nar/") }

// narKeySum is the sha256 a valid NAR key names: of the stored file in both forms.
func narKeySum(key string) []byte {
	h := strings.TrimPrefix(key, "nar/")
	if t, ok := strings.CutSuffix(h, ".nar.zst"); ok {
		h = t
	} else {
		h = strings.TrimSuffix(h, ".nar")
	}
	b, err := nix.DecodeBase32(h)
	if err != nil {
		return nil
	}
	return b
}

// LogPath is the path a cache node serves a log of blob key key under ("/" + the key, each
// segment escaped: a store name may contain '?'), or "" for a key that is not a plain "log/…"
// one.
func LogPath(key string) string {
	rest, ok := strings.CutPrefix(key, "log/")
	if !ok || rest == "" {
		return ""
	}
	segs := strings.Split(rest, "/")
	for i, seg := range segs {
		if seg == "" || seg == "." || seg == ".." || strings.ContainsAny(seg, "\\\x00\r\n") {
			return ""
		}
		segs[i] = url.PathEscape(seg)
	}
	return "/log/" + strings.Join(segs, "/")
}
