// Package cache serves the Nix binary cache protocol over HTTP from a blob store: what any Nix
// client substitutes from.
//
// Routes (GET and HEAD; HEAD sends the same headers as GET, without a body):
//
//	/nix-cache-info     generated from Config
//	/<hash>.narinfo     blob <hash>.narinfo   <hash>: 32 nix32 characters, else 400
//	/<hash>.ls          blob <hash>.ls
//	/nar/<file>         blob nar/<file>       <file> must form a blob.ValidKey, else 400
//	/log/<drv>          blob log/<drv>        stored zstd-compressed; decompressed unless the
//	                                          client accepts zstd
//
// Every key is checked (nix.ValidHashPart, blob.ValidKey) before the store is asked for it, so
// no request can name anything outside the cache layout. Any other path is 404. Paths that
// are not clean ("..", "//") are redirected to their clean form by http.ServeMux itself before
// any handler of this package runs.
package cache

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/klauspost/compress/zstd"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// DefaultPriority is the nix-cache-info Priority when Config.Priority is 0. Lower is
// preferred; cache.nixos.org uses 40.
const DefaultPriority = 30

const (
	cacheImmutable = "public, max-age=31536000, immutable" // content-addressed NARs
	cacheHit       = "public, max-age=60"                  // narinfo, .ls, logs, nix-cache-info
	cacheMiss      = "public, max-age=5"                   // short, so a path published a moment later is found
	cacheNone      = "no-store"                            // errors that are not about the object

	typeNarinfo   = "text/x-nix-narinfo"
	typeNAR       = "application/x-nix-nar"
	typeListing   = "application/json"
	typeLog       = "text/plain; charset=utf-8"
	typeCacheInfo = "text/x-nix-cache-info"
)

// Config configures a Server.
type Config struct {
	Store    blob.Store
	Priority int // nix-cache-info Priority, default 30
	Logger   *slog.Logger
}

// Server serves the binary cache. Create it with New.
type Server struct {
	store     blob.Store
	logger    *slog.Logger
	cacheInfo string
}

// New returns a server for cfg. cfg.Store must be set.
func New(cfg Config) *Server {
	if cfg.Store == nil {
		panic("cache.New: nil Store")
	}
	prio := cfg.Priority
	if prio == 0 {
		prio = DefaultPriority
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	return &Server{
		store:     cfg.Store,
		logger:    logger,
		cacheInfo: fmt.Sprintf("StoreDir: %s\nWantMassQuery: 1\nPriority: %d\n", nix.StoreDir, prio),
	}
}

// Register mounts the cache's routes on mux. A "GET" pattern also matches HEAD.
//
// The patterns are "GET /nix-cache-info", "GET /{name}" (single-segment names: .narinfo and
// .ls), "GET /nar/{file}" and "GET /log/{drv}"; mux must not already hold patterns that
// conflict with them (such as another "GET /{x}").
func (s *Server) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /nix-cache-info", s.serveCacheInfo)
	mux.HandleFunc("GET /{name}", s.serveTopLevel)
	mux.HandleFunc("GET /nar/{file}", s.serveNAR)
	mux.HandleFunc("GET /log/{drv}", s.serveLog)
}

func (s *Server) serveCacheInfo(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", typeCacheInfo)
	h.Set("Content-Length", strconv.Itoa(len(s.cacheInfo)))
	h.Set("Cache-Control", cacheHit)
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = io.WriteString(w, s.cacheInfo)
	}
}

// serveTopLevel serves /<hash>.narinfo and /<hash>.ls; other single-segment names are 404.
func (s *Server) serveTopLevel(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var ctype string
	var hash string
	switch {
	case strings.HasSuffix(name, ".narinfo"):
		hash, ctype = strings.TrimSuffix(name, ".narinfo"), typeNarinfo
	case strings.HasSuffix(name, ".ls"):
		hash, ctype = strings.TrimSuffix(name, ".ls"), typeListing
	default:
		s.fail(w, r, http.StatusNotFound, "not found", nil)
		return
	}
	if !nix.ValidHashPart(hash) {
		s.fail(w, r, http.StatusBadRequest, "invalid store path hash", nil)
		return
	}
	s.serveBlob(w, r, name, ctype, cacheHit)
}

func (s *Server) serveNAR(w http.ResponseWriter, r *http.Request) {
	key := "nar/" + r.PathValue("file")
	if err := blob.ValidKey(key); err != nil {
		s.fail(w, r, http.StatusBadRequest, "invalid NAR file name", nil)
		return
	}
	s.serveBlob(w, r, key, typeNAR, cacheImmutable)
}

// serveBlob streams key as stored.
func (s *Server) serveBlob(w http.ResponseWriter, r *http.Request, key, ctype, cacheControl string) {
	if r.Method == http.MethodHead {
		info, err := s.store.Head(r.Context(), key)
		if err != nil {
			s.storeError(w, r, key, err)
			return
		}
		setHeaders(w, ctype, cacheControl, info.Size)
		w.WriteHeader(http.StatusOK)
		return
	}
	rc, info, err := s.store.Get(r.Context(), key)
	if err != nil {
		s.storeError(w, r, key, err)
		return
	}
	defer rc.Close()
	// Small objects (narinfo, .ls, the requests Nix makes most) are read whole and written once,
	// so headers and body leave in one write; copying would flush the headers, then send the
	// body separately. NARs keep the zero-copy path.
	if info.Size >= 0 && info.Size <= smallObject {
		body, err := io.ReadAll(io.LimitReader(rc, smallObject+1))
		if err != nil || int64(len(body)) != info.Size {
			s.storeError(w, r, key, fmt.Errorf("read %s: %d of %d bytes: %w", key, len(body), info.Size, err))
			return
		}
		setHeaders(w, ctype, cacheControl, info.Size)
		w.WriteHeader(http.StatusOK)
		if _, err := w.Write(body); err != nil {
			s.copyError(r, key, 0, err)
		}
		return
	}
	setHeaders(w, ctype, cacheControl, info.Size)
	w.WriteHeader(http.StatusOK)
	if n, err := io.Copy(w, rc); err != nil {
		s.copyError(r, key, n, err)
	}
}

// smallObject is the size up to which an object is sent from memory.
const smallObject = 64 << 10

func (s *Server) serveLog(w http.ResponseWriter, r *http.Request) {
	key := "log/" + r.PathValue("drv")
	if err := blob.ValidKey(key); err != nil {
		s.fail(w, r, http.StatusBadRequest, "invalid derivation name", nil)
		return
	}
	w.Header().Set("Vary", "Accept-Encoding")
	if acceptsZstd(r.Header.Values("Accept-Encoding")) {
		w.Header().Set("Content-Encoding", "zstd")
		s.serveBlob(w, r, key, typeLog, cacheHit)
		return
	}
	// Decompressed: the length is unknown until the whole log has been read.
	if r.Method == http.MethodHead {
		if _, err := s.store.Head(r.Context(), key); err != nil {
			s.storeError(w, r, key, err)
			return
		}
		setHeaders(w, typeLog, cacheHit, -1)
		w.WriteHeader(http.StatusOK)
		return
	}
	rc, _, err := s.store.Get(r.Context(), key)
	if err != nil {
		s.storeError(w, r, key, err)
		return
	}
	defer rc.Close()
	dec, err := zstd.NewReader(rc, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(1<<30))
	if err != nil {
		s.fail(w, r, http.StatusInternalServerError, "internal error", err)
		return
	}
	defer dec.Close()
	// Decode the first block before committing to 200, so that a corrupt log is an error
	// response rather than a truncated success.
	br := bufio.NewReaderSize(dec, 32<<10)
	if _, err := br.Peek(1); err != nil && !errors.Is(err, io.EOF) {
		s.fail(w, r, http.StatusBadGateway, "stored log is unreadable", fmt.Errorf("decompress %s: %w", key, err))
		return
	}
	setHeaders(w, typeLog, cacheHit, -1)
	w.WriteHeader(http.StatusOK)
	if n, err := io.Copy(w, br); err != nil {
		s.copyError(r, key, n, err)
		// Abort the chunked response, so the client sees an error, not a short log.
		panic(http.ErrAbortHandler)
	}
}

// acceptsZstd reports whether Accept-Encoding values list zstd with a non-zero quality.
func acceptsZstd(values []string) bool {
	for _, v := range values {
		for _, part := range strings.Split(v, ",") {
			coding, params, _ := strings.Cut(part, ";")
			if !strings.EqualFold(strings.TrimSpace(coding), "zstd") {
				continue
			}
			if zeroQuality(params) {
				continue
			}
			return true
		}
	}
	return false
}

// zeroQuality reports whether Accept-Encoding parameters say q=0 (refused).
func zeroQuality(params string) bool {
	for _, p := range strings.Split(params, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok || !strings.EqualFold(strings.TrimSpace(k), "q") {
			continue
		}
		q, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		return err == nil && q == 0
	}
	return false
}

func setHeaders(w http.ResponseWriter, ctype, cacheControl string, size int64) {
	h := w.Header()
	h.Set("Content-Type", ctype)
	h.Set("Cache-Control", cacheControl)
	h.Set("X-Content-Type-Options", "nosniff")
	if size >= 0 {
		h.Set("Content-Length", strconv.FormatInt(size, 10))
	}
}

// storeError answers a failed Get or Head: 404 for a missing object, else 502 with the
// detail logged only.
func (s *Server) storeError(w http.ResponseWriter, r *http.Request, key string, err error) {
	w.Header().Del("Content-Encoding")
	if errors.Is(err, blob.ErrNotFound) {
		s.fail(w, r, http.StatusNotFound, "not found", nil)
		return
	}
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		// The client went away; nobody reads the answer.
		s.logger.Debug("cache: request canceled", "path", r.URL.Path, "key", key)
		w.WriteHeader(499)
		return
	}
	s.fail(w, r, http.StatusBadGateway, "cache storage unavailable", fmt.Errorf("key %s: %w", key, err))
}

// copyError logs a body that could not be sent in full. The response is already committed;
// with a Content-Length, the client sees the short body as an error.
func (s *Server) copyError(r *http.Request, key string, n int64, err error) {
	level := slog.LevelWarn
	if r.Context().Err() != nil {
		level = slog.LevelDebug // client disconnected
	}
	s.logger.Log(r.Context(), level, "cache: sending body failed", "path", r.URL.Path, "key", key, "sent", n, "error", err)
}

// fail writes a plain-text error whose msg is safe for clients; err is logged, never sent.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, code int, msg string, err error) {
	h := w.Header()
	h.Del("Content-Encoding")
	switch {
	case code == http.StatusNotFound:
		h.Set("Cache-Control", cacheMiss)
	case code >= 500:
		h.Set("Cache-Control", cacheNone)
	}
	if code >= 500 {
		s.logger.Error("cache: request failed", "method", r.Method, "path", r.URL.Path, "status", code, "error", err)
	} else if err != nil {
		s.logger.Info("cache: request failed", "method", r.Method, "path", r.URL.Path, "status", code, "error", err)
	}
	body := msg + "\n"
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(code)
	if r.Method != http.MethodHead {
		_, _ = io.WriteString(w, body)
	}
}
