package signer

import (
	"context"
	"io"
	"net/http"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/nodetoken"
	"github.com/harmonia-ci/harmonia-ci/internal/signerapi"
)

// handleEvalTicket issues an evaluation ticket to the evaluator that holds the evaluation: the
// proof a frontend asks for before it mints the evaluation's read credential. The evaluator's
// node token stays between it and the signers.
func (s *Server) handleEvalTicket(ctx context.Context, id nodetoken.Identity, body io.Reader) (any, error) {
	var req signerapi.EvalTicketRequest
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	if err := s.checkEvalClaim(ctx, id, req.Eval); err != nil {
		return nil, err
	}
	expires := time.Now().Add(signerapi.TicketLifetime).Truncate(time.Second)
	ticket, err := s.cfg.Tokens.IssueTicket(nodetoken.Ticket{NodeID: id.NodeID, EvalID: req.Eval.ID,
		Attempt: req.Eval.Attempt, Expires: expires})
	if err != nil {
		return nil, badRequest("%v", err)
	}
	return signerapi.EvalTicketResponse{Ticket: ticket, Expires: expires}, nil
}

// handleCheckTicket tells a frontend whether a ticket is good: signed under the cluster
// secret, not expired, and its evaluation still running under the claim it names.
func (s *Server) handleCheckTicket(ctx context.Context, _ nodetoken.Identity, body io.Reader) (any, error) {
	var req signerapi.CheckTicketRequest
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	t, err := s.cfg.Tokens.VerifyTicket(req.Ticket, time.Now())
	if err != nil {
		return nil, httpapi.Errorf(http.StatusForbidden, "invalid evaluation ticket")
	}
	claim := signerapi.EvalClaim{ID: t.EvalID, Attempt: t.Attempt}
	if err := s.checkEvalClaim(ctx, nodetoken.Identity{NodeID: t.NodeID}, claim); err != nil {
		return nil, err
	}
	return signerapi.CheckTicketResponse{Node: t.NodeID, Eval: claim}, nil
}

// handleCheckNodeToken tells a cache node whether a node token is good, so that builders and
// evaluators read private paths from caches that do not hold the cluster secret. It answers
// only the identity the token carries; the cache decides what that identity may read.
func (s *Server) handleCheckNodeToken(_ context.Context, _ nodetoken.Identity, body io.Reader) (any, error) {
	var req signerapi.CheckNodeTokenRequest
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	id, err := s.cfg.Tokens.Verify(req.Token)
	if err != nil {
		return nil, httpapi.Errorf(http.StatusForbidden, "invalid node token")
	}
	return signerapi.CheckNodeTokenResponse{Node: id.NodeID, Roles: id.Roles}, nil
}
