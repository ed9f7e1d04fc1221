// Package signer is the signer role: it hands builders and evaluators presigned upload URLs,
// then checks what they uploaded, signs and writes the narinfos, records canonical NAR hashes
// and marks builds succeeded. Output NAR bytes never pass through it.
//
// Every request is authenticated by the caller's node token (package nodetoken): the node id
// and roles come from the token, never from the body. The signer signs only what the caller
// could have produced:
//
//   - A builder (role builder) publishes the outputs of the job it holds: POST /api/upload-slots
//     with its job claim, PUT each file to its URL, POST /api/build-complete. Exactly the
//     outputs of the job's derivation, with that derivation as deriver, and references drawn
//     from its own outputs and the closure of its inputs that the cache (or a trusted upstream)
//     serves. Its log goes to log/<the job's drv>, granted only to the claim.
//   - An evaluator (role evaluator) publishes what it evaluated for the evaluation it holds:
//     POST /api/publish with the .drv files as text (the signer recomputes each store path from
//     its text, signs its narinfo and stores both in the database, blob.Derivations) and sources
//     it uploaded, whose store paths the signer recomputes from their NARs. Everything it
//     publishes is content-addressed.
//
// A narinfo is written once: the first writer wins and a non-reproducible rebuild is logged
// and counted as a conflict.
//
// The wire format is package signerapi; builders and evaluators call signers through package
// signerclient, so they never import this package.
package signer

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nodetoken"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/signerapi"
)

// DefaultURLExpiry is how long a presigned upload URL stays valid by default.
const DefaultURLExpiry = 15 * time.Minute

// Upstream looks up narinfos in the trusted upstream caches ([substituters]); the signer accepts
// references to what they serve.
type Upstream interface {
	NarInfo(ctx context.Context, path string) (*nix.NarInfo, error)
}

// Config configures a Server.
type Config struct {
	Store     blob.Store
	Key       nix.SecretKey
	Tokens    *nodetoken.Key // verifies the callers' node tokens; required
	URLExpiry time.Duration  // default 15m, at most blob.MaxURLExpiry
	Upstream  Upstream       // nil: references must be in the cluster's cache
	Announcer *queue.Announcer
	Logger    *slog.Logger
	// Registerer, if set, receives the signer's series (requests, narinfos, upload bytes).
	Registerer prometheus.Registerer
}

// Server serves the signer's API.
type Server struct {
	cfg     Config
	pool    *pgxpool.Pool
	logger  *slog.Logger
	refs    *refCache
	drvs    *blob.Derivations
	metrics *signerMetrics
}

// New returns a signer on cfg's store and key, recording into pool.
func New(cfg Config, pool *pgxpool.Pool) (*Server, error) {
	if cfg.Store == nil {
		return nil, errors.New("signer: no blob store")
	}
	if cfg.Key.Name == "" {
		return nil, errors.New("signer: no signing key")
	}
	if cfg.Tokens == nil {
		return nil, errors.New("signer: no node token key (the cluster secret)")
	}
	if pool == nil {
		return nil, errors.New("signer: no database pool")
	}
	if cfg.URLExpiry == 0 {
		cfg.URLExpiry = DefaultURLExpiry
	}
	if cfg.URLExpiry < time.Second || cfg.URLExpiry > blob.MaxURLExpiry {
		return nil, fmt.Errorf("signer: URL expiry %v is not between 1s and %v", cfg.URLExpiry, blob.MaxURLExpiry)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg, pool: pool, logger: cfg.Logger.With("service", "signer"), refs: newRefCache(refCacheSize),
		drvs: blob.NewDerivations(pool), metrics: newSignerMetrics(cfg.Registerer)}, nil
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
func TrustedKeys(ctx context.Context, q db.DBTX) ([]string, error) {
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

// Register mounts the signer's endpoints; every one answers node tokens only.
func (s *Server) Register(rt *access.Routes) {
	rt.Handle("POST /api/upload-slots", access.Signed, s.handle(endpointUploadSlots, "", s.handleUploadSlots))
	rt.Handle("POST /api/build-complete", access.Signed, s.handle(endpointBuildComplete, config.RoleBuilder, s.handleBuildComplete))
	rt.Handle("POST /api/publish", access.Signed, s.handle(endpointPublish, config.RoleEvaluator, s.handlePublish))
	rt.Handle("POST /api/cache-lookup", access.Signed, s.handle(endpointCacheLookup, "", s.handleCacheLookup))
	rt.Handle("POST /api/eval-ticket", access.Signed, s.handle(endpointEvalTicket, config.RoleEvaluator, s.handleEvalTicket))
	rt.Handle("POST /api/eval-ticket/check", access.Signed, s.handle(endpointCheckTicket, config.RoleFrontend, s.handleCheckTicket))
	rt.Handle("POST /api/node-token/check", access.Signed, s.handle(endpointCheckNode, config.RoleCache, s.handleCheckNodeToken))
}

// handler serves one endpoint for an authenticated node.
type handler func(ctx context.Context, id nodetoken.Identity, body io.Reader) (any, error)

// handle checks the node token before the body is read (and role, if set), limits the body,
// answers JSON and counts the answer under endpoint.
func (s *Server) handle(endpoint, role string, h handler) http.Handler {
	inner := httpapi.Handle(s.logger, func(w http.ResponseWriter, r *http.Request) error {
		token, ok := httpapi.BearerToken(r)
		if !ok {
			return httpapi.Unauthorized(w, "missing node token (Authorization: Bearer)")
		}
		id, err := s.cfg.Tokens.Verify(token)
		if err != nil {
			return httpapi.Unauthorized(w, "invalid node token")
		}
		if role != "" && !id.Has(role) {
			return forbidden(id, role)
		}
		res, err := h(r.Context(), id, http.MaxBytesReader(w, r.Body, signerapi.MaxRequestBody))
		if err != nil {
			return err
		}
		httpapi.WriteJSON(w, http.StatusOK, res)
		return nil
	})
	if s.metrics == nil {
		return inner
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w}
		inner.ServeHTTP(rec, r)
		s.metrics.answered(endpoint, cmp.Or(rec.code, http.StatusOK))
	})
}

func forbidden(id nodetoken.Identity, role string) error {
	return httpapi.Errorf(http.StatusForbidden, "node %s may not act as %s", id.NodeID, role)
}

func decode(body io.Reader, v any) error {
	if err := json.NewDecoder(body).Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return httpapi.Errorf(http.StatusRequestEntityTooLarge, "request body over %d bytes", mbe.Limit)
		}
		return badRequest("invalid JSON body: %v", err)
	}
	return nil
}

func badRequest(format string, args ...any) error {
	return httpapi.Errorf(http.StatusBadRequest, format, args...)
}

func internal(msg string, err error) error {
	return &httpapi.Error{Code: http.StatusInternalServerError, Msg: msg, Err: err}
}

// unavailable is a store failure: 503, so a client tries another signer or later.
func unavailable(msg string, err error) error {
	return &httpapi.Error{Code: http.StatusServiceUnavailable, Msg: msg, Err: err}
}
