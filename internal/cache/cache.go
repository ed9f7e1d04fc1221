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
//	                                          client accepts zstd; the latest attempt's log
//	/log/<drv>.<n>      blob log/<drv>.<n>    the same, attempt n's own log
//
// The .drv files evaluators publish are kept in PostgreSQL (blob.Derivations, when
// Config.Derivations is set): a narinfo is looked up there first, then in the blob store, and
// an uncompressed NAR (nar/<narhash>.nar) is rendered from the .drv file stored there.
//
// Every key is checked (nix.ValidHashPart, blob.ValidKey) before the store is asked for it, so
// no request can name anything outside the cache layout. Any other path is 404. Paths that
// are not clean ("..", "//") are redirected to their clean form by http.ServeMux itself before
// any handler of this package runs.
//
// With Config.Visibility, a private project's paths (narinfo, .ls, .drv narinfo, log) are
// served only to the credentials that may read them (Visibility), and to anyone else answered
// exactly as a missing path.
//
// Narinfos, the requests Nix makes most, can be kept in memory once read (up to
// Config.NarinfoCacheBytes): a narinfo is written once and never changed, so a GET answered from
// memory gets the stored body. The garbage collector may delete one, so the store is asked again
// at most Config.NarinfoCacheTTL after the read. Misses are not kept, and HEAD always asks the
// store.
package cache

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// DefaultPriority is the nix-cache-info Priority when Config.Priority is 0. Lower is
// preferred; cache.nixos.org uses 40.
const DefaultPriority = 30

// DefaultNarinfoCacheBytes is the Config.NarinfoCacheBytes a cache role uses: about 100,000
// narinfos.
const DefaultNarinfoCacheBytes = 64 << 20

// DefaultNarinfoCacheTTL is Config.NarinfoCacheTTL when it is 0.
const DefaultNarinfoCacheTTL = 10 * time.Second

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
	Store blob.Store
	// Derivations, if set, serves the .drv objects kept in the database.
	Derivations *blob.Derivations
	Priority    int // nix-cache-info Priority, default 30
	Logger      *slog.Logger
	// Registerer, if set, receives the cache's series (requests by kind and result, bytes).
	Registerer prometheus.Registerer
	// NarinfoCacheBytes bounds the narinfos kept in memory (bodies, keys and bookkeeping). 0,
	// the default, keeps none: every request asks the store. A cache role uses
	// DefaultNarinfoCacheBytes.
	NarinfoCacheBytes int64
	// NarinfoCacheTTL is how long a narinfo read from the store is answered from memory: one
	// the garbage collector deletes is no longer served after it. Default DefaultNarinfoCacheTTL.
	NarinfoCacheTTL time.Duration
	// Clock times NarinfoCacheTTL; default clock.Real.
	Clock clock.Clock
	// Visibility, if set, keeps private projects' paths from those who may not read them. Nil
	// serves every path to everyone.
	Visibility *Visibility
}

// Server serves the binary cache. Create it with New.
type Server struct {
	store     blob.Store
	drvs      *blob.Derivations // nil: none
	logger    *slog.Logger
	cacheInfo string
	metrics   *cacheMetrics
	narinfos  *narinfoCache // nil: none kept
	vis       *Visibility   // nil: every path is everyone's
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
	s := &Server{
		store:     cfg.Store,
		drvs:      cfg.Derivations,
		logger:    logger,
		cacheInfo: fmt.Sprintf("StoreDir: %s\nWantMassQuery: 1\nPriority: %d\n", nix.StoreDir, prio),
		metrics:   newCacheMetrics(cfg.Registerer),
		vis:       cfg.Visibility,
	}
	if cfg.NarinfoCacheBytes > 0 {
		clk := cfg.Clock
		if clk == nil {
			clk = clock.Real{}
		}
		s.narinfos = newNarinfoCache(cfg.NarinfoCacheBytes, cmp.Or(cfg.NarinfoCacheTTL, DefaultNarinfoCacheTTL), clk)
	}
	return s
}

// Register mounts the cache's routes on mux. A "GET" pattern also matches HEAD.
//
// The patterns are "GET /nix-cache-info", "GET /{name}" (single-segment names: .narinfo and
// .ls), "GET /nar/{file}" and "GET /log/{drv}"; mux must not already hold patterns that
// conflict with them (such as another "GET /{x}").
//
// With a Visibility, narinfos, .ls listings, .drv files and logs are checked path by path
// (access.StorePaths); NARs are named by their content's hash, which only the narinfo tells.
// Without one, every project's paths are served: the routes are declared pending.
func (s *Server) Register(rt *access.Routes) {
	scope := access.StorePaths
	if s.vis == nil {
		scope = access.Pending(nixUnauthenticated)
	}
	rt.Handle("GET /nix-cache-info", access.Free, http.HandlerFunc(s.serveCacheInfo))
	rt.Handle("GET /{name}", scope, s.handle(s.serveTopLevel))
	rt.Handle("GET /nar/{file}", scope, s.handle(s.serveNAR))
	rt.Handle("GET /log/{drv}", scope, s.handle(s.serveLog))
}

// mayRead reports whether r may read the paths of hash part hash: a private path to a caller
// who may not read it is errNotFound, exactly a missing path's answer (no oracle). The writer
// returned is w, or for a private path one that marks the answer private.
func (s *Server) mayRead(w http.ResponseWriter, r *http.Request, hash string) (http.ResponseWriter, error) {
	if s.vis == nil {
		return w, nil
	}
	ok, private, err := s.vis.MayRead(r.Context(), r, hash)
	switch {
	case errors.Is(err, ErrTooManyNodeChecks):
		return w, &httpapi.Error{Code: http.StatusServiceUnavailable, Msg: "too many requests", Err: err,
			Header: http.Header{"Retry-After": {"1"}}}
	case err != nil:
		return w, &httpapi.Error{Code: http.StatusBadGateway, Msg: "cache storage unavailable", Err: err}
	case !ok:
		return w, errNotFound()
	case private:
		return privateWriter{w}, nil
	}
	return w, nil
}

// vetNarinfo answers for a narinfo body before it is sent: one marked quarantined (only pull
// requests built the output) is read as mayRead reads a private path, until the path is
// released. The mark is checked on the body served, not looked up beforehand, so no answer
// learnt before the output was built lets it out.
func (s *Server) vetNarinfo(w http.ResponseWriter, r *http.Request, hash string, body []byte) (http.ResponseWriter, error) {
	if s.vis == nil || !nix.NarInfoQuarantined(body) {
		return w, nil
	}
	ok, private, err := s.vis.MayReadQuarantined(r.Context(), r, hash)
	switch {
	case err != nil:
		return w, &httpapi.Error{Code: http.StatusBadGateway, Msg: "cache storage unavailable", Err: err}
	case !ok:
		return w, errNotFound()
	case private:
		return privateWriter{w}, nil
	}
	return w, nil
}

// nixUnauthenticated is why the cache's routes are not checked yet.
const nixUnauthenticated = "the binary cache without a visibility check (cache.Config.Visibility): every project's paths are served"

// handle answers h's errors as every harmonia-ci handler does (httpapi.Handle: JSON, only Msg
// reaches the client; Nix looks at the status alone). An error drops the Content-Encoding a
// zstd log response had announced.
func (s *Server) handle(h httpapi.HandlerFunc) http.Handler {
	return httpapi.Handle(s.logger, func(w http.ResponseWriter, r *http.Request) error {
		err := h(w, r)
		if err != nil {
			w.Header().Del("Content-Encoding")
		}
		return err
	})
}

// errNotFound is a miss. It may be cached briefly (cacheMiss), so a path published a moment
// later is found.
func errNotFound() *httpapi.Error {
	return &httpapi.Error{Code: http.StatusNotFound, Msg: "not found", Header: http.Header{"Cache-Control": {cacheMiss}}}
}

func (s *Server) serveCacheInfo(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", typeCacheInfo)
	h.Set("Content-Length", strconv.Itoa(len(s.cacheInfo)))
	h.Set("Cache-Control", cacheHit)
	w.WriteHeader(http.StatusOK)
	var n int
	if r.Method != http.MethodHead {
		n, _ = io.WriteString(w, s.cacheInfo)
	}
	s.metrics.hit(kindCacheInfo, int64(n))
}

// serveTopLevel serves /<hash>.narinfo and /<hash>.ls; other single-segment names are 404.
func (s *Server) serveTopLevel(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	var ctype string
	var hash string
	var kind objectKind
	switch {
	case strings.HasSuffix(name, ".narinfo"):
		hash, ctype, kind = strings.TrimSuffix(name, ".narinfo"), typeNarinfo, kindNarinfo
	case strings.HasSuffix(name, ".ls"):
		hash, ctype, kind = strings.TrimSuffix(name, ".ls"), typeListing, kindListing
	default:
		return errNotFound() // no object kind: not counted
	}
	if s.vis != nil && nix.ValidHashPart(hash) {
		var err error
		if w, err = s.mayRead(w, r, hash); err != nil {
			return s.metrics.failed(kind, err)
		}
	}
	// Only valid names are remembered, so a name found in memory needs no further check.
	keep := kind == kindNarinfo && s.narinfos != nil && r.Method == http.MethodGet
	if keep {
		if e := s.narinfos.get(name); e != nil {
			w, err := s.vetNarinfo(w, r, hash, e.body)
			if err != nil {
				return s.metrics.failed(kind, err)
			}
			s.sendNarinfo(w, r, e)
			return nil
		}
	}
	if !nix.ValidHashPart(hash) {
		return s.metrics.failed(kind, httpapi.Errorf(http.StatusBadRequest, "invalid store path hash"))
	}
	if kind == kindNarinfo && s.drvs != nil {
		var readStart time.Time
		if keep {
			readStart = s.narinfos.clock.Now()
		}
		body, _, err := s.drvs.NarInfo(r.Context(), hash)
		if err == nil {
			if keep {
				s.narinfos.put(name, body, readStart)
			}
			s.sendSmall(w, r, kind, name, ctype, cacheHit, body)
			return nil
		}
		if !errors.Is(err, blob.ErrNotFound) {
			return s.metrics.failed(kind, s.storeError(w, r, name, err))
		}
	}
	var vet func(http.ResponseWriter, []byte) (http.ResponseWriter, error)
	if kind == kindNarinfo && s.vis != nil {
		vet = func(w http.ResponseWriter, body []byte) (http.ResponseWriter, error) {
			return s.vetNarinfo(w, r, hash, body)
		}
	}
	if keep {
		return s.metrics.failed(kind, s.serveBlob(w, r, kind, name, ctype, cacheHit, s.narinfos, vet))
	}
	return s.metrics.failed(kind, s.serveBlob(w, r, kind, name, ctype, cacheHit, nil, vet))
}

// Header values of a narinfo answered from memory, built once: setting them costs no
// allocation. Each has one element and no spare capacity, so an Add elsewhere copies it.
var (
	narinfoContentType  = []string{typeNarinfo}
	narinfoCacheControl = []string{cacheHit}
	noSniff             = []string{"nosniff"}
)

// sendNarinfo answers a GET with a remembered narinfo: the headers setHeaders would set, and
// the body.
func (s *Server) sendNarinfo(w http.ResponseWriter, r *http.Request, e *narinfoEntry) {
	h := w.Header()
	h["Content-Type"] = narinfoContentType
	h["Cache-Control"] = narinfoCacheControl
	h["X-Content-Type-Options"] = noSniff
	h["Content-Length"] = e.length
	w.WriteHeader(http.StatusOK)
	n, err := w.Write(e.body)
	if err != nil {
		s.copyError(r, e.key, int64(n), err)
	}
	s.metrics.hit(kindNarinfo, int64(n))
}

func (s *Server) serveNAR(w http.ResponseWriter, r *http.Request) error {
	key := "nar/" + r.PathValue("file")
	if err := blob.ValidKey(key); err != nil {
		return s.metrics.failed(kindNAR, httpapi.Errorf(http.StatusBadRequest, "invalid NAR file name"))
	}
	if s.drvs != nil && blob.IsPlainNAR(key) {
		nar, _, err := s.drvs.NAR(r.Context(), key)
		if err == nil {
			s.sendSmall(w, r, kindNAR, key, typeNAR, cacheImmutable, nar)
			return nil
		}
		if !errors.Is(err, blob.ErrNotFound) {
			return s.metrics.failed(kindNAR, s.storeError(w, r, key, err))
		}
	}
	return s.metrics.failed(kindNAR, s.serveBlob(w, r, kindNAR, key, typeNAR, cacheImmutable, nil, nil))
}

// sendSmall answers with body, read whole (a .drv object from the database), and counts the hit.
func (s *Server) sendSmall(w http.ResponseWriter, r *http.Request, kind objectKind, key, ctype, cacheControl string, body []byte) {
	setHeaders(w, ctype, cacheControl, int64(len(body)))
	w.WriteHeader(http.StatusOK)
	var n int
	if r.Method != http.MethodHead {
		var err error
		if n, err = w.Write(body); err != nil {
			s.copyError(r, key, int64(n), err)
		}
	}
	s.metrics.hit(kind, int64(n))
}

// serveBlob streams key as stored and counts the hit; the caller counts errors. A GET whose
// body is read whole (a small object) is remembered in keep, if set. vet, if set, reads the
// body whole (for a HEAD too) and answers for it before anything is sent.
func (s *Server) serveBlob(w http.ResponseWriter, r *http.Request, kind objectKind, key, ctype, cacheControl string, keep *narinfoCache,
	vet func(http.ResponseWriter, []byte) (http.ResponseWriter, error)) error {
	if r.Method == http.MethodHead && vet == nil {
		info, err := s.store.Head(r.Context(), key)
		if err != nil {
			return s.storeError(w, r, key, err)
		}
		setHeaders(w, ctype, cacheControl, info.Size)
		w.WriteHeader(http.StatusOK)
		s.metrics.hit(kind, 0)
		return nil
	}
	var readStart time.Time
	if keep != nil {
		readStart = keep.clock.Now() // before the read: a deletion after it is seen within the TTL
	}
	rc, info, err := s.store.Get(r.Context(), key)
	if err != nil {
		return s.storeError(w, r, key, err)
	}
	defer rc.Close()
	// Small objects (narinfo, .ls, the requests Nix makes most) are read whole and written once,
	// so headers and body leave in one write; copying would flush the headers, then send the
	// body separately. NARs keep the zero-copy path.
	if info.Size >= 0 && (info.Size <= smallObject || vet != nil) {
		body, err := readWhole(rc, info.Size)
		if err != nil {
			return s.storeError(w, r, key, fmt.Errorf("read %s: %w", key, err))
		}
		if keep != nil {
			keep.put(key, body, readStart)
		}
		if vet != nil {
			if w, err = vet(w, body); err != nil {
				return err
			}
		}
		setHeaders(w, ctype, cacheControl, info.Size)
		w.WriteHeader(http.StatusOK)
		var n int
		if r.Method != http.MethodHead {
			if n, err = w.Write(body); err != nil {
				s.copyError(r, key, 0, err)
			}
		}
		s.metrics.hit(kind, int64(n))
		return nil
	}
	if vet != nil {
		return s.storeError(w, r, key, fmt.Errorf("read %s: the store does not say its size", key))
	}
	setHeaders(w, ctype, cacheControl, info.Size)
	w.WriteHeader(http.StatusOK)
	n, err := io.Copy(w, rc)
	if err != nil {
		s.copyError(r, key, n, err)
	}
	s.metrics.hit(kind, n)
	return nil
}

// smallObject is the size up to which an object is sent from memory.
const smallObject = 64 << 10

// readWhole reads a body of exactly size bytes into a buffer of that size; a shorter or longer
// body is an error.
func readWhole(r io.Reader, size int64) ([]byte, error) {
	body := make([]byte, size)
	if n, err := io.ReadFull(r, body); err != nil {
		return nil, fmt.Errorf("%d of %d bytes: %w", n, size, err)
	}
	var extra [1]byte
	if _, err := io.ReadFull(r, extra[:]); err == nil {
		return nil, fmt.Errorf("more than %d bytes", size)
	} else if !errors.Is(err, io.EOF) {
		return nil, err
	}
	return body, nil
}

func (s *Server) serveLog(w http.ResponseWriter, r *http.Request) error {
	return s.metrics.failed(kindLog, s.sendLog(w, r))
}

// sendLog serves a log and counts its hit; serveLog counts its errors.
func (s *Server) sendLog(w http.ResponseWriter, r *http.Request) error {
	key := "log/" + r.PathValue("drv")
	if err := blob.ValidKey(key); err != nil {
		return httpapi.Errorf(http.StatusBadRequest, "invalid derivation name")
	}
	w.Header().Set("Vary", "Accept-Encoding")
	if drv := r.PathValue("drv"); s.vis != nil && len(drv) > nix.HashPartLen && nix.ValidHashPart(drv[:nix.HashPartLen]) {
		var err error
		if w, err = s.mayRead(w, r, drv[:nix.HashPartLen]); err != nil {
			return err
		}
	}
	if acceptsZstd(r.Header.Values("Accept-Encoding")) {
		w.Header().Set("Content-Encoding", "zstd")
		return s.serveBlob(w, r, kindLog, key, typeLog, cacheHit, nil, nil)
	}
	// Decompressed: the length is unknown until the whole log has been read.
	if r.Method == http.MethodHead {
		if _, err := s.store.Head(r.Context(), key); err != nil {
			return s.storeError(w, r, key, err)
		}
		setHeaders(w, typeLog, cacheHit, -1)
		w.WriteHeader(http.StatusOK)
		s.metrics.hit(kindLog, 0)
		return nil
	}
	rc, _, err := s.store.Get(r.Context(), key)
	if err != nil {
		return s.storeError(w, r, key, err)
	}
	defer rc.Close()
	dec, err := zstd.NewReader(rc, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(1<<30))
	if err != nil {
		return fmt.Errorf("open zstd reader for %s: %w", key, err)
	}
	defer dec.Close()
	// Decode the first block before committing to 200, so that a corrupt log is an error
	// response rather than a truncated success.
	br := bufio.NewReaderSize(dec, 32<<10)
	if _, err := br.Peek(1); err != nil && !errors.Is(err, io.EOF) {
		return &httpapi.Error{Code: http.StatusBadGateway, Msg: "stored log is unreadable", Err: fmt.Errorf("decompress %s: %w", key, err)}
	}
	setHeaders(w, typeLog, cacheHit, -1)
	w.WriteHeader(http.StatusOK)
	n, err := io.Copy(w, br)
	if err != nil {
		s.copyError(r, key, n, err)
		s.metrics.failed(kindLog, err)
		s.metrics.bytes(kindLog, n)
		// Abort the chunked response, so the client sees an error, not a short log.
		panic(http.ErrAbortHandler)
	}
	s.metrics.hit(kindLog, n)
	return nil
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

// storeError is the answer to a failed Get or Head: 404 for a missing object, else 502 with the
// detail logged only.
func (s *Server) storeError(w http.ResponseWriter, r *http.Request, key string, err error) error {
	if errors.Is(err, blob.ErrNotFound) {
		return errNotFound()
	}
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		// The client went away; nobody reads the answer.
		s.logger.Debug("cache: request canceled", "path", r.URL.Path, "key", key)
		w.Header().Del("Content-Encoding")
		w.WriteHeader(499)
		return nil
	}
	return &httpapi.Error{Code: http.StatusBadGateway, Msg: "cache storage unavailable", Err: fmt.Errorf("key %s: %w", key, err)}
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
