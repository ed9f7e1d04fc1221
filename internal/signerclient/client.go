// Package signerclient is the client of the cluster's signers: it finds the live signers in the
// nodes table, calls their HTTP API (package signerapi) with this node's token, and fails over
// and backs off when they do not answer.
package signerclient

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/signerapi"
)

// ErrUnavailable means no signer answered within Config.GiveUpAfter: a transient failure
// the caller may retry later.
var ErrUnavailable = errors.New("no signer answered")

// StatusError is a 4xx answer from a signer: the request itself is wrong (or the claim is
// stale) and was not retried. Msg is the server's message.
type StatusError struct {
	Code int
	Msg  string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("signer: %d %s: %s", e.Code, http.StatusText(e.Code), e.Msg)
}

// Config configures a Client.
type Config struct {
	Token         string        // this node's token (package nodetoken)
	DeadThreshold time.Duration // signers silent this long are not tried; default cluster.DefaultDeadThreshold (cluster.heartbeat.dead_threshold)
	HTTP          *http.Client  // default: a client with a 2 minute timeout
	GiveUpAfter   time.Duration // default 5m
	MinBackoff    time.Duration // default 1s
	MaxBackoff    time.Duration // default 30s
}

// Client calls the cluster's signers: it finds them in the nodes table, tries them in turn
// and fails over on connection errors, timeouts and 5xx answers.
type Client struct {
	cfg    Config
	pool   *pgxpool.Pool
	logger *slog.Logger
	next   atomic.Uint64 // round-robin start
}

// New returns a client discovering signers through pool.
func New(cfg Config, pool *pgxpool.Pool, logger *slog.Logger) *Client {
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Timeout: 2 * time.Minute}
	}
	cfg.DeadThreshold = cmp.Or(cfg.DeadThreshold, cluster.DefaultDeadThreshold)
	if cfg.GiveUpAfter <= 0 {
		cfg.GiveUpAfter = 5 * time.Minute
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = time.Second
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 30 * time.Second
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = cfg.MinBackoff
	}
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Client{cfg: cfg, pool: pool, logger: logger.With("service", "signer-client")}
}

// UploadSlots asks a signer for presigned upload URLs.
func (c *Client) UploadSlots(ctx context.Context, req signerapi.UploadSlotsRequest) (signerapi.UploadSlotsResponse, error) {
	var resp signerapi.UploadSlotsResponse
	err := c.call(ctx, "/api/upload-slots", req, &resp)
	return resp, err
}

// BuildComplete asks a signer to verify, sign and publish the outputs and finish the job.
// Retrying it on another signer is safe: a completion that did land makes the retry a 409.
func (c *Client) BuildComplete(ctx context.Context, req signerapi.BuildCompleteRequest) (signerapi.BuildCompleteResponse, error) {
	var resp signerapi.BuildCompleteResponse
	err := c.call(ctx, "/api/build-complete", req, &resp)
	return resp, err
}

// Publish asks a signer to publish an evaluation's .drv files and sources. It is idempotent.
func (c *Client) Publish(ctx context.Context, req signerapi.PublishRequest) (signerapi.PublishResponse, error) {
	var resp signerapi.PublishResponse
	err := c.call(ctx, "/api/publish", req, &resp)
	return resp, err
}

// CacheLookup returns the store paths (of at most signerapi.MaxLookup) whose narinfo the cache holds.
func (c *Client) CacheLookup(ctx context.Context, paths []string) ([]string, error) {
	var resp signerapi.CacheLookupResponse
	err := c.call(ctx, "/api/cache-lookup", signerapi.CacheLookupRequest{StorePaths: paths}, &resp)
	return resp.Present, err
}

// EvalTicket asks a signer for a ticket that proves to a frontend that this node holds claim.
func (c *Client) EvalTicket(ctx context.Context, claim signerapi.EvalClaim) (signerapi.EvalTicketResponse, error) {
	var resp signerapi.EvalTicketResponse
	err := c.call(ctx, "/api/eval-ticket", signerapi.EvalTicketRequest{Eval: claim}, &resp)
	return resp, err
}

// CheckTicket asks a signer whether an evaluator's ticket is good and its evaluation still
// running under the claim it names (a frontend's call). A bad ticket is a *StatusError 403, a
// finished or reassigned evaluation a 409.
func (c *Client) CheckTicket(ctx context.Context, ticket string) (signerapi.CheckTicketResponse, error) {
	var resp signerapi.CheckTicketResponse
	err := c.call(ctx, "/api/eval-ticket/check", signerapi.CheckTicketRequest{Ticket: ticket}, &resp)
	return resp, err
}

// CheckNodeToken asks a signer whether a node token is good (a cache node's call). A bad
// token is a *StatusError 403.
func (c *Client) CheckNodeToken(ctx context.Context, token string) (signerapi.CheckNodeTokenResponse, error) {
	var resp signerapi.CheckNodeTokenResponse
	err := c.call(ctx, "/api/node-token/check", signerapi.CheckNodeTokenRequest{Token: token}, &resp)
	return resp, err
}

func (c *Client) signers(ctx context.Context) ([]string, error) {
	rows, err := c.pool.Query(ctx, sqlSigners, c.cfg.DeadThreshold.Seconds())
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// call posts req to path on the signers, round robin, until one answers 2xx or 4xx. After a
// round in which every signer failed it backs off (MinBackoff doubling to MaxBackoff, with
// jitter) and looks the signers up again; after GiveUpAfter it returns ErrUnavailable.
func (c *Client) call(ctx context.Context, path string, req, resp any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("signer %s: %w", path, err)
	}
	deadline := time.Now().Add(c.cfg.GiveUpAfter)
	backoff := c.cfg.MinBackoff
	var lastErr error
	for {
		endpoints, err := c.signers(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			lastErr = fmt.Errorf("look up signers: %w", err)
		} else if len(endpoints) == 0 {
			lastErr = errors.New("no live signer in the nodes table")
		}
		start := int(c.next.Add(1) - 1)
		for i := range endpoints {
			ep := endpoints[(start+i)%len(endpoints)]
			done, err := c.try(ctx, ep, path, body, resp)
			if done {
				return err
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			c.logger.Debug("signer failed; trying the next", "endpoint", ep, "error", err)
			lastErr = err
		}
		remaining := time.Until(deadline)
		if remaining <= 0 {
			return fmt.Errorf("signer %s: %w within %v: %v", path, ErrUnavailable, c.cfg.GiveUpAfter, lastErr)
		}
		// Jitter in [backoff/2, backoff): signers restarting together are not hit together.
		sleep := backoff/2 + rand.N(backoff/2+1)
		sleep = min(sleep, remaining)
		c.logger.Warn("no signer answered; backing off", "path", path, "backoff", sleep, "error", lastErr)
		t := time.NewTimer(sleep)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(backoff*2, c.cfg.MaxBackoff)
	}
}

// try posts once. done reports whether the answer is final: a 2xx (err nil, resp decoded) or a
// 4xx (a *StatusError). Otherwise err says why this signer failed.
func (c *Client) try(ctx context.Context, endpoint, path string, body []byte, resp any) (done bool, err error) {
	url := strings.TrimRight(endpoint, "/") + path
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return false, fmt.Errorf("signer %s: %w", endpoint, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.cfg.Token)
	res, err := c.cfg.HTTP.Do(req)
	if err != nil {
		return false, fmt.Errorf("signer %s: %w", endpoint, err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, signerapi.MaxRequestBody*4))
	if err != nil {
		return false, fmt.Errorf("signer %s: read answer: %w", endpoint, err)
	}
	switch {
	case res.StatusCode >= 200 && res.StatusCode < 300:
		if err := json.Unmarshal(data, resp); err != nil {
			// A signer answering garbage is broken; another one may not be.
			return false, fmt.Errorf("signer %s: decode answer: %w", endpoint, err)
		}
		return true, nil
	case res.StatusCode >= 400 && res.StatusCode < 500:
		var eb signerapi.ErrorResponse
		msg := strings.TrimSpace(string(data))
		if json.Unmarshal(data, &eb) == nil && eb.Error != "" {
			msg = eb.Error
		}
		return true, &StatusError{Code: res.StatusCode, Msg: msg}
	default:
		return false, fmt.Errorf("signer %s: %s", endpoint, res.Status)
	}
}
