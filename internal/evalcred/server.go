// Package evalcred is the frontend's side of fetching private repositories:
// POST /api/eval-credential mints a short-lived, read-only credential (forge.Forge's
// ReadCredential) for the repository of one running evaluation and hands it to the evaluator
// that holds it, which fetches with it and forgets it. Evaluators hold no forge secret; a
// frontend holds no cluster secret, so the evaluator proves its claim with a ticket a signer
// issued (signerapi.EvalTicketRequest) and the frontend asks a signer whether the ticket is
// good before it looks the claim up itself.
package evalcred

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/gitrepo"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
	"github.com/harmonia-ci/harmonia-ci/internal/signerapi"
	"github.com/harmonia-ci/harmonia-ci/internal/signerclient"
)

// Path is where the endpoint is mounted.
const Path = "/api/eval-credential"

// maxBody bounds a request: a ticket.
const maxBody = 4 << 10

// DefaultTimeout bounds a request: the signer's check and the forge's calls.
const DefaultTimeout = time.Minute

// Request is the body of POST /api/eval-credential: the ticket a signer issued to the
// evaluator for its claim. The answer is a gitrepo.Credential.
type Request struct {
	Ticket string `json:"ticket"`
}

// TicketChecker asks a signer whether an evaluation ticket is good (signerclient.Client).
type TicketChecker interface {
	CheckTicket(ctx context.Context, ticket string) (signerapi.CheckTicketResponse, error)
}

// Config configures a Server.
type Config struct {
	Forges forge.Set
	// Tickets checks tickets; nil (a frontend without a node token) answers every request 503.
	Tickets TicketChecker
	// Timeout bounds one request; default DefaultTimeout.
	Timeout time.Duration
	Logger  *slog.Logger
}

// Server serves POST /api/eval-credential.
type Server struct {
	cfg    Config
	pool   db.DBTX
	logger *slog.Logger
}

// New returns the endpoint over pool.
func New(cfg Config, pool db.DBTX) *Server {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg, pool: pool, logger: logger.With("service", "eval-credential")}
}

// Register mounts the endpoint. It answers only a caller with a ticket a signer vouches for,
// and carries nothing but that ticket's evaluation's credential.
func (s *Server) Register(rt *access.Routes) {
	rt.Handle("POST "+Path, access.Signed, httpapi.Handle(s.logger, s.handle))
}

func (s *Server) handle(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Timeout)
	defer cancel()
	if s.cfg.Tickets == nil {
		return httpapi.Errorf(http.StatusServiceUnavailable, "this frontend has no node token to check tickets with")
	}
	var req Request
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&req); err != nil || req.Ticket == "" {
		return httpapi.Errorf(http.StatusBadRequest, "want {\"ticket\": …}, a ticket from POST /api/eval-ticket")
	}
	claim, err := s.cfg.Tickets.CheckTicket(ctx, req.Ticket)
	var se *signerclient.StatusError
	switch {
	case errors.As(err, &se) && se.Code == http.StatusConflict:
		return httpapi.Errorf(http.StatusConflict, "the evaluation is not running under this ticket's claim")
	case errors.As(err, &se) && se.Code == http.StatusUnauthorized:
		// This frontend's own token, not the ticket: its operator's to fix.
		return &httpapi.Error{Code: http.StatusServiceUnavailable, Msg: "the signers refuse this frontend's node token", Err: err}
	case errors.As(err, &se) && se.Code < 500:
		return &httpapi.Error{Code: http.StatusForbidden, Msg: "invalid evaluation ticket", Err: err}
	case err != nil:
		return &httpapi.Error{Code: http.StatusServiceUnavailable, Msg: "no signer could check the ticket", Err: err}
	}
	cred, repo, err := s.mint(ctx, claim)
	if err != nil {
		return err
	}
	// Who got what, never the credential itself.
	s.logger.InfoContext(ctx, "read credential issued", "eval_id", claim.Eval.ID, "attempt", claim.Eval.Attempt,
		"node_id", claim.Node, "forge", repo.Forge, "repository", repo.FullName)
	httpapi.WriteJSON(w, http.StatusOK, cred)
	return nil
}

// mint checks, in the database, that the claim the signer vouched for still holds, and asks
// the repository's forge for a credential.
func (s *Server) mint(ctx context.Context, claim signerapi.CheckTicketResponse) (cred gitrepo.Credential, repo project.Repository, err error) {
	var repoID int64
	err = s.pool.QueryRow(ctx, sqlClaimedRepository, claim.Eval.ID, claim.Node, claim.Eval.Attempt).Scan(&repoID)
	if errors.Is(err, pgx.ErrNoRows) {
		return cred, repo, httpapi.Errorf(http.StatusConflict, "the evaluation is not running under this ticket's claim")
	}
	if err != nil {
		return cred, repo, err
	}
	if repo, err = project.GetRepository(ctx, s.pool, repoID); err != nil {
		return cred, repo, err
	}
	if c, ok, err := s.stored(ctx, repo); ok || err != nil {
		return c, repo, err
	}
	f := s.cfg.Forges[repo.Forge]
	if f == nil {
		return cred, repo, httpapi.Errorf(http.StatusNotFound, "the repository's forge is not configured on this frontend")
	}
	c, err := f.ReadCredential(ctx, forge.Repository{Repo: repo.Repo(), CloneURL: repo.CloneURL, Private: repo.Private})
	if err != nil {
		return cred, repo, &httpapi.Error{Code: http.StatusBadGateway, Msg: "the forge issued no read credential for " + repo.FullName, Err: err}
	}
	return c, repo, nil
}

// stored is the credential that was in repo's URL before credentials in URLs were refused
// (moved out of it by a migration), if it had one.
func (s *Server) stored(ctx context.Context, repo project.Repository) (gitrepo.Credential, bool, error) {
	var user, password string
	err := s.pool.QueryRow(ctx, sqlStoredCredential, repo.ID).Scan(&user, &password)
	if errors.Is(err, pgx.ErrNoRows) {
		return gitrepo.Credential{}, false, nil
	}
	if err != nil {
		return gitrepo.Credential{}, false, fmt.Errorf("stored credential of repository %d: %w", repo.ID, err)
	}
	u, uerr := url.PathUnescape(user)
	p, perr := url.PathUnescape(password)
	scheme, _, _ := strings.Cut(repo.CloneURL, "://")
	switch {
	case uerr != nil || perr != nil:
		return gitrepo.Credential{}, true, httpapi.Errorf(http.StatusConflict, "the credential stored for %s is not percent-encoded", repo.CloneURL)
	case scheme != "http" && scheme != "https":
		return gitrepo.Credential{}, true, httpapi.Errorf(http.StatusConflict,
			"the credential stored for %s is a password for %s, which git cannot be given: use a key the evaluator nodes hold", repo.CloneURL, scheme)
	}
	return gitrepo.Credential{URL: repo.CloneURL, Username: u, Token: p}, true, nil
}
