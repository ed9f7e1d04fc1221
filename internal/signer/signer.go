// Package signer is the signer role: it hands builders presigned upload URLs, then verifies what
// they uploaded, signs and writes the narinfos, records canonical NAR hashes and marks builds
// succeeded. NAR bytes never pass through it.
//
// The protocol, for a builder:
//
//  1. POST /api/upload-slots with the outputs it built (hashes and sizes computed while
//     compressing) and, optionally, its log. An output whose compressed NAR the store already
//     has (same key, same size: the key is the file's hash) is skipped; for the others the
//     answer carries a presigned PUT that can only write exactly that file.
//  2. PUT each file to its URL, sending every returned header.
//  3. POST /api/build-complete with its claim (job id, node id, attempt), the outputs and the
//     log key. The signer checks the claim and that every NAR is in the store, writes one signed
//     narinfo per output (NAR first, narinfo last, so a narinfo never points at a missing file),
//     records the canonical NAR hashes and marks the job succeeded.
//
// The evaluator publishes .drv closures the same way, without a claim: a batch of store paths
// in one call. It also asks POST /api/cache-lookup which outputs the cache already holds, so
// they get no build job.
//
// A narinfo is never rewritten to a different NarHash: the first writer wins and a
// non-reproducible rebuild is logged and counted as a conflict.
package signer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
)

// MaxRequestBody bounds a request body; a larger one is answered 413.
const MaxRequestBody = 8 << 20

// DefaultURLExpiry is how long a presigned upload URL stays valid by default.
const DefaultURLExpiry = 15 * time.Minute

// Config configures a Server.
type Config struct {
	Store        blob.Store
	Key          nix.SecretKey
	ClusterToken string        // required; every request needs Authorization: Bearer <token>
	URLExpiry    time.Duration // default 15m
	Announcer    *queue.Announcer
	Logger       *slog.Logger
}

// Server serves the signer's API.
type Server struct {
	cfg       Config
	pool      *pgxpool.Pool
	logger    *slog.Logger
	tokenHash [sha256.Size]byte
}

// New returns a signer on cfg's store and key, recording into pool.
func New(cfg Config, pool *pgxpool.Pool) (*Server, error) {
	if cfg.Store == nil {
		return nil, errors.New("signer: no blob store")
	}
	if cfg.Key.Name == "" {
		return nil, errors.New("signer: no signing key")
	}
	if cfg.ClusterToken == "" {
		return nil, errors.New("signer: a cluster token is required")
	}
	if pool == nil {
		return nil, errors.New("signer: no database pool")
	}
	if cfg.URLExpiry == 0 {
		cfg.URLExpiry = DefaultURLExpiry
	}
	if cfg.URLExpiry < time.Second {
		return nil, fmt.Errorf("signer: URL expiry %v is under 1s", cfg.URLExpiry)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Server{
		cfg:       cfg,
		pool:      pool,
		logger:    cfg.Logger.With("service", "signer"),
		tokenHash: sha256.Sum256([]byte(cfg.ClusterToken)),
	}, nil
}

// RecordKey records the signer's public key in signing_keys, where builders find the keys to
// trust when they substitute from the cluster's caches.
func (s *Server) RecordKey(ctx context.Context) error {
	if _, err := s.pool.Exec(ctx, sqlRecordKey, s.cfg.Key.Public().String()); err != nil {
		return fmt.Errorf("record signing key %s: %w", s.cfg.Key.Name, err)
	}
	return nil
}

// TrustedKeys returns the cluster's signing public keys ("name:base64"), oldest first.
func TrustedKeys(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) ([]string, error) {
	rows, err := q.Query(ctx, sqlTrustedKeys)
	if err != nil {
		return nil, fmt.Errorf("read signing keys: %w", err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read signing keys: %w", err)
	}
	return keys, nil
}

// Register mounts POST /api/upload-slots and POST /api/build-complete on mux.
func (s *Server) Register(mux *http.ServeMux) {
	mux.Handle("POST /api/upload-slots", s.wrap(s.handleUploadSlots))
	mux.Handle("POST /api/build-complete", s.wrap(s.handleBuildComplete))
	mux.Handle("POST /api/cache-lookup", s.wrap(s.handleCacheLookup))
}

// ---- wire format ----

// CacheLookupRequest asks which store paths the cache holds (has a narinfo for).
type CacheLookupRequest struct {
	StorePaths []string `json:"store_paths"`
}

// CacheLookupResponse lists the store paths of the request that the cache holds.
type CacheLookupResponse struct {
	Present []string `json:"present"`
}

// MaxLookup bounds the store paths of one cache lookup.
const MaxLookup = 1000

// Output is one store path to publish.
type Output struct {
	StorePath  string   `json:"store_path"`
	NarHash    string   `json:"nar_hash"` // "sha256:<nix32>"
	NarSize    int64    `json:"nar_size"`
	FileHash   string   `json:"file_hash"` // "sha256:<nix32>" of the .nar.zst
	FileSize   int64    `json:"file_size"`
	References []string `json:"references"`        // store paths or basenames
	Deriver    string   `json:"deriver,omitempty"` // basename (a full path is accepted)
}

// LogUpload asks for a presigned upload of a build log.
type LogUpload struct {
	Key    string `json:"key"` // log/<drv basename>
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"` // hex
}

// UploadSlotsRequest is the body of POST /api/upload-slots.
type UploadSlotsRequest struct {
	Outputs []Output   `json:"outputs"`
	Log     *LogUpload `json:"log,omitempty"`
}

// Upload is a presigned upload: PUT the exact body to URL with every header in Headers
// (a Go client sets http.Request.ContentLength instead of the Content-Length header).
type Upload struct {
	URL     string      `json:"url"`
	Method  string      `json:"method"`
	Headers http.Header `json:"headers"`
	Expires time.Time   `json:"expires"`
}

// OutputSlot answers for one output: skipped (the store has the file) or where to upload it.
type OutputSlot struct {
	StorePath string  `json:"store_path"`
	Skipped   bool    `json:"skipped"`
	Upload    *Upload `json:"upload,omitempty"`
}

// UploadSlotsResponse is the answer to POST /api/upload-slots, outputs in request order.
type UploadSlotsResponse struct {
	Outputs []OutputSlot `json:"outputs"`
	Log     *Upload      `json:"log,omitempty"`
}

// BuildCompleteRequest is the body of POST /api/build-complete. Without JobID it only
// publishes the outputs (the evaluator's .drv closures).
type BuildCompleteRequest struct {
	JobID   *int64   `json:"job_id,omitempty"`
	NodeID  string   `json:"node_id,omitempty"`
	Attempt int      `json:"attempt,omitempty"`
	Outputs []Output `json:"outputs"`
	LogKey  string   `json:"log_key,omitempty"`
}

// BuildCompleteResponse counts narinfos written, already present with the same NarHash
// (skipped), and already present with a different NarHash (conflicts, left unchanged).
type BuildCompleteResponse struct {
	Written   int `json:"written"`
	Skipped   int `json:"skipped"`
	Conflicts int `json:"conflicts"`
}

// errorBody is the JSON of every error answer.
type errorBody struct {
	Error string `json:"error"`
}

// ---- handlers ----

// apiError is an error whose msg is safe to show the client; err is logged only.
type apiError struct {
	code int
	msg  string
	err  error
}

func (e *apiError) Error() string {
	if e.err != nil {
		return e.msg + ": " + e.err.Error()
	}
	return e.msg
}

func (e *apiError) Unwrap() error { return e.err }

func badRequest(format string, args ...any) error {
	return &apiError{code: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

func internal(msg string, err error) error {
	return &apiError{code: http.StatusInternalServerError, msg: msg, err: err}
}

// unavailable is a store failure: 503, so a client tries another signer or later.
func unavailable(msg string, err error) error {
	return &apiError{code: http.StatusServiceUnavailable, msg: msg, err: err}
}

type handler func(ctx context.Context, body io.Reader) (any, error)

// wrap checks the bearer token before anything else, limits the body and writes JSON.
func (s *Server) wrap(h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var res any
		var err error
		if !s.authorized(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="harmonia-ci"`)
			err = &apiError{code: http.StatusUnauthorized, msg: "missing or invalid cluster token"}
		} else {
			res, err = h(r.Context(), http.MaxBytesReader(w, r.Body, MaxRequestBody))
		}
		if err == nil {
			writeJSON(w, http.StatusOK, res)
			return
		}
		var ae *apiError
		if !errors.As(err, &ae) {
			ae = &apiError{code: http.StatusInternalServerError, msg: "internal error", err: err}
		}
		level := slog.LevelInfo
		if ae.code >= 500 {
			level = slog.LevelError
		}
		s.logger.Log(r.Context(), level, "request failed", "path", r.URL.Path, "status", ae.code, "error", ae.Error())
		writeJSON(w, ae.code, errorBody{Error: ae.msg})
	})
}

// authorized compares hashes of the tokens in constant time, so neither the content nor the
// length of the token leaks through timing.
func (s *Server) authorized(r *http.Request) bool {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(token)))
	return subtle.ConstantTimeCompare(got[:], s.tokenHash[:]) == 1
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func decode(body io.Reader, v any) error {
	dec := json.NewDecoder(body)
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return &apiError{code: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("request body over %d bytes", mbe.Limit)}
		}
		return badRequest("invalid JSON body: %v", err)
	}
	return nil
}

// output is a validated Output.
type output struct {
	path     nix.StorePath
	narHash  string
	narSize  int64
	fileSum  [sha256.Size]byte
	fileSize int64
	refs     []string // basenames
	deriver  string   // basename or ""
	narKey   string   // nar/<nix32>.nar.zst
	infoKey  string   // <hash>.narinfo
}

func basename(p string) (string, error) {
	if strings.HasPrefix(p, "/") {
		sp, err := nix.ParseStorePath(p)
		return sp.Base(), err
	}
	sp, err := nix.ParseStorePathBase(p)
	return sp.Base(), err
}

func parseOutputs(outs []Output) ([]output, error) {
	if len(outs) == 0 {
		return nil, badRequest("outputs: at least one output is required")
	}
	res := make([]output, len(outs))
	for i, o := range outs {
		p, err := parseOutput(o)
		if err != nil {
			return nil, badRequest("outputs[%d].%v", i, err)
		}
		res[i] = p
	}
	return res, nil
}

func parseOutput(o Output) (output, error) {
	var p output
	var err error
	if p.path, err = nix.ParseStorePath(o.StorePath); err != nil {
		return p, fmt.Errorf("store_path: %w", err)
	}
	narSum, err := nix.ParseSHA256(o.NarHash)
	if err != nil {
		return p, fmt.Errorf("nar_hash: %w", err)
	}
	p.narHash = nix.FormatSHA256(narSum)
	if o.NarSize <= 0 {
		return p, fmt.Errorf("nar_size: must be positive, got %d", o.NarSize)
	}
	p.narSize = o.NarSize
	if p.fileSum, err = nix.ParseSHA256(o.FileHash); err != nil {
		return p, fmt.Errorf("file_hash: %w", err)
	}
	if o.FileSize <= 0 {
		return p, fmt.Errorf("file_size: must be positive, got %d", o.FileSize)
	}
	p.fileSize = o.FileSize
	for j, r := range o.References {
		b, err := basename(r)
		if err != nil {
			return p, fmt.Errorf("references[%d]: %w", j, err)
		}
		p.refs = append(p.refs, b)
	}
	if o.Deriver != "" {
		if p.deriver, err = basename(o.Deriver); err != nil {
			return p, fmt.Errorf("deriver: %w", err)
		}
	}
	p.narKey = nix.NarURL(nix.FormatSHA256(p.fileSum))
	p.infoKey = p.path.Hash + ".narinfo"
	for _, k := range []string{p.narKey, p.infoKey} {
		if err := blob.ValidKey(k); err != nil {
			return p, fmt.Errorf("store_path: %w", err)
		}
	}
	return p, nil
}

func checkLogKey(field, key string) error {
	if !strings.HasPrefix(key, "log/") {
		return badRequest("%s: %q does not start with log/", field, key)
	}
	if err := blob.ValidKey(key); err != nil {
		return badRequest("%s: %v", field, err)
	}
	return nil
}

// head reports whether key is in the store with exactly size bytes (size < 0: any size).
func (s *Server) head(ctx context.Context, key string, size int64) (bool, error) {
	info, err := s.cfg.Store.Head(ctx, key)
	if errors.Is(err, blob.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, unavailable("blob store unavailable", err)
	}
	return size < 0 || info.Size == size, nil
}

func (s *Server) handleCacheLookup(ctx context.Context, body io.Reader) (any, error) {
	var req CacheLookupRequest
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	if len(req.StorePaths) > MaxLookup {
		return nil, badRequest("store_paths: at most %d per request, got %d", MaxLookup, len(req.StorePaths))
	}
	keys := make([]string, len(req.StorePaths))
	for i, p := range req.StorePaths {
		sp, err := nix.ParseStorePath(p)
		if err != nil {
			return nil, badRequest("store_paths[%d]: %v", i, err)
		}
		keys[i] = sp.Hash + ".narinfo"
	}
	present := make([]bool, len(keys))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i, k := range keys {
		g.Go(func() error {
			have, err := s.head(gctx, k, -1)
			present[i] = have
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	resp := CacheLookupResponse{Present: []string{}}
	for i, p := range req.StorePaths {
		if present[i] {
			resp.Present = append(resp.Present, p)
		}
	}
	return resp, nil
}

func (s *Server) handleUploadSlots(ctx context.Context, body io.Reader) (any, error) {
	var req UploadSlotsRequest
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	// A failed build uploads only its log.
	var outs []output
	var err error
	if len(req.Outputs) > 0 || req.Log == nil {
		if outs, err = parseOutputs(req.Outputs); err != nil {
			return nil, err
		}
	}
	var logSum []byte
	if req.Log != nil {
		if err := checkLogKey("log.key", req.Log.Key); err != nil {
			return nil, err
		}
		if req.Log.Size < 0 {
			return nil, badRequest("log.size: must not be negative, got %d", req.Log.Size)
		}
		logSum, err = hex.DecodeString(req.Log.SHA256)
		if err != nil || len(logSum) != sha256.Size {
			return nil, badRequest("log.sha256: want 64 hex characters")
		}
	}
	resp := UploadSlotsResponse{Outputs: make([]OutputSlot, len(outs))}
	err = eachOutput(ctx, outs, func(ctx context.Context, i int, o output) error {
		slot := OutputSlot{StorePath: o.path.String()}
		have, err := s.head(ctx, o.narKey, o.fileSize)
		if err != nil {
			return err
		}
		if have {
			slot.Skipped = true
		} else if slot.Upload, err = s.presign(ctx, o.narKey, o.fileSize, o.fileSum[:]); err != nil {
			return err
		}
		resp.Outputs[i] = slot
		return nil
	})
	if err != nil {
		return nil, err
	}
	if req.Log != nil {
		if resp.Log, err = s.presign(ctx, req.Log.Key, req.Log.Size, logSum); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

func (s *Server) presign(ctx context.Context, key string, size int64, sum []byte) (*Upload, error) {
	u, err := s.cfg.Store.PresignPut(ctx, key, size, sum, blob.ContentTypeFor(key), s.cfg.URLExpiry)
	if err != nil {
		return nil, internal("presigning failed", err)
	}
	return &Upload{URL: u.URL, Method: u.Method, Headers: u.Headers, Expires: u.Expires}, nil
}

func (s *Server) handleBuildComplete(ctx context.Context, body io.Reader) (any, error) {
	var req BuildCompleteRequest
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	outs, err := parseOutputs(req.Outputs)
	if err != nil {
		return nil, err
	}
	if req.LogKey != "" {
		if err := checkLogKey("log_key", req.LogKey); err != nil {
			return nil, err
		}
	}
	var claim queue.Claim
	if req.JobID != nil {
		claim = queue.Claim{JobID: *req.JobID, NodeID: req.NodeID, Attempt: req.Attempt}
		if req.NodeID == "" {
			return nil, badRequest("node_id: required with job_id")
		}
		if err := s.checkClaim(ctx, claim); err != nil {
			return nil, err
		}
	} else if req.NodeID != "" || req.Attempt != 0 || req.LogKey != "" {
		return nil, badRequest("job_id: required with node_id, attempt or log_key")
	}

	// Everything is checked before anything is written.
	err = eachOutput(ctx, outs, func(ctx context.Context, i int, o output) error {
		have, err := s.head(ctx, o.narKey, o.fileSize)
		if err != nil {
			return err
		}
		if !have {
			return badRequest("outputs[%d]: nar not uploaded (%s with %d bytes)", i, o.narKey, o.fileSize)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if req.LogKey != "" {
		have, err := s.head(ctx, req.LogKey, -1)
		if err != nil {
			return nil, err
		}
		if !have {
			return nil, badRequest("log_key: %s not uploaded", req.LogKey)
		}
	}

	var resp BuildCompleteResponse
	// The uploads become durable before any narinfo refers to them, and the narinfos before
	// the build is recorded (stores that buffer writes; see blob.Syncer).
	if err := s.sync(ctx); err != nil {
		return nil, err
	}
	canon := make([]canonical, len(outs))
	results := make([]publishResult, len(outs))
	err = eachOutput(ctx, outs, func(ctx context.Context, i int, o output) error {
		var err error
		canon[i], results[i], err = s.publish(ctx, o)
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, result := range results {
		switch result {
		case written:
			resp.Written++
		case skipped:
			resp.Skipped++
		case conflict:
			resp.Conflicts++
		}
	}
	if err := s.sync(ctx); err != nil {
		return nil, err
	}
	if err := s.recordHashes(ctx, canon); err != nil {
		return nil, internal("recording NAR hashes failed", err)
	}
	if req.JobID != nil {
		drvPath, err := s.succeed(ctx, claim, req.LogKey)
		if err != nil {
			return nil, err
		}
		if s.cfg.Announcer != nil {
			s.cfg.Announcer.Finished(drvPath, "succeeded")
		}
		s.logger.Info("build succeeded", "job", claim.JobID, "node", claim.NodeID, "attempt", claim.Attempt,
			"drv", drvPath, "written", resp.Written, "skipped", resp.Skipped, "conflicts", resp.Conflicts)
	}
	return resp, nil
}

func (s *Server) sync(ctx context.Context) error {
	if syncer, ok := s.cfg.Store.(blob.Syncer); ok {
		if err := syncer.Sync(ctx); err != nil {
			return unavailable("blob store sync failed", err)
		}
	}
	return nil
}

// eachOutput runs fn for every output, several at once: a batch of .drv files is hundreds of
// small objects, and each blob store round trip (an fsync, an S3 request) is latency-bound.
func eachOutput(ctx context.Context, outs []output, fn func(ctx context.Context, i int, o output) error) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i, o := range outs {
		g.Go(func() error { return fn(gctx, i, o) })
	}
	return g.Wait()
}

func staleClaim(c queue.Claim) error {
	return &apiError{code: http.StatusConflict,
		msg: fmt.Sprintf("job %d is not in building/uploading for node %s attempt %d", c.JobID, c.NodeID, c.Attempt)}
}

// checkClaim answers 409 unless the job is building or uploading under exactly this claim.
func (s *Server) checkClaim(ctx context.Context, c queue.Claim) error {
	var ok bool
	err := s.pool.QueryRow(ctx, sqlCheckClaim, c.JobID, c.NodeID, c.Attempt).Scan(&ok)
	if err != nil {
		return internal("checking the claim failed", err)
	}
	if !ok {
		return staleClaim(c)
	}
	return nil
}

// succeed marks the job succeeded and records its log, in one transaction.
func (s *Server) succeed(ctx context.Context, c queue.Claim, logKey string) (string, error) {
	var drvPath string
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		out, err := queue.Succeed(ctx, tx, c)
		if err != nil {
			return err
		}
		drvPath = out.DrvPath
		if logKey != "" {
			if _, err := tx.Exec(ctx, sqlSetLogURL, c.JobID, logKey); err != nil {
				return fmt.Errorf("set log_url of job %d: %w", c.JobID, err)
			}
		}
		return nil
	})
	if errors.Is(err, queue.ErrStale) {
		return "", staleClaim(c)
	}
	if err != nil {
		return "", internal("marking the job succeeded failed", err)
	}
	return drvPath, nil
}

type publishResult int

const (
	written publishResult = iota
	skipped
	conflict
)

// canonical is the NAR hash and size the cache serves for a path.
type canonical struct {
	path    string
	narHash string
	narSize int64
}

// publish writes o's signed narinfo unless one exists. An existing narinfo is never rewritten:
// with the same NarHash it is skipped, with another it is a conflict (a non-reproducible
// build; the cache keeps the first). It returns what the cache now serves for the path.
func (s *Server) publish(ctx context.Context, o output) (canonical, publishResult, error) {
	mine := canonical{path: o.path.String(), narHash: o.narHash, narSize: o.narSize}
	existing, err := s.readNarInfo(ctx, o.infoKey)
	if err != nil {
		return mine, 0, err
	}
	if existing != nil {
		if existing.StorePath != mine.path {
			// Another path with the same hash part: never overwrite it.
			s.logger.Error("narinfo names another store path; not rewriting it",
				"key", o.infoKey, "existing", existing.StorePath, "path", mine.path)
			return canonical{}, conflict, nil
		}
		if existing.NarHash == o.narHash {
			return mine, skipped, nil
		}
		s.logger.Warn("non-reproducible build: the cache keeps the first NAR",
			"path", mine.path, "cached_nar_hash", existing.NarHash, "new_nar_hash", o.narHash)
		return canonical{path: mine.path, narHash: existing.NarHash, narSize: existing.NarSize}, conflict, nil
	}
	ni := &nix.NarInfo{
		StorePath:   mine.path,
		URL:         o.narKey,
		Compression: "zstd",
		FileHash:    nix.FormatSHA256(o.fileSum),
		FileSize:    o.fileSize,
		NarHash:     o.narHash,
		NarSize:     o.narSize,
		References:  o.refs,
		Deriver:     o.deriver,
	}
	if err := ni.Sign(s.cfg.Key); err != nil {
		return mine, 0, badRequest("%s: %v", mine.path, err)
	}
	text, err := ni.MarshalText()
	if err != nil {
		return mine, 0, badRequest("%s: %v", mine.path, err)
	}
	sum := sha256.Sum256(text)
	err = s.cfg.Store.Put(ctx, o.infoKey, bytes.NewReader(text), int64(len(text)),
		blob.PutOptions{ContentType: blob.ContentTypeFor(o.infoKey), SHA256: sum[:]})
	if err != nil {
		return mine, 0, unavailable("writing the narinfo failed", err)
	}
	return mine, written, nil
}

// readNarInfo returns the narinfo at key, nil if there is none. One that does not parse is
// reported as an error: it is never overwritten blindly.
func (s *Server) readNarInfo(ctx context.Context, key string) (*nix.NarInfo, error) {
	r, _, err := s.cfg.Store.Get(ctx, key)
	if errors.Is(err, blob.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, unavailable("blob store unavailable", err)
	}
	defer r.Close()
	data, err := io.ReadAll(io.LimitReader(r, 1<<20))
	if err != nil {
		return nil, unavailable("blob store unavailable", err)
	}
	ni, err := nix.ParseNarInfo(data)
	if err != nil {
		return nil, internal("existing narinfo does not parse", fmt.Errorf("%s: %w", key, err))
	}
	return ni, nil
}

// recordHashes sets the canonical NAR hash of every output row still without one: the first
// writer wins.
func (s *Server) recordHashes(ctx context.Context, cs []canonical) error {
	var paths, hashes []string
	var sizes []int64
	for _, c := range cs {
		if c.path == "" {
			continue
		}
		paths, hashes, sizes = append(paths, c.path), append(hashes, c.narHash), append(sizes, c.narSize)
	}
	if len(paths) == 0 {
		return nil
	}
	_, err := s.pool.Exec(ctx, sqlRecordNarHashes, paths, hashes, sizes)
	return err
}
