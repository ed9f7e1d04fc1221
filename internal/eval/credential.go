package eval

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/gitrepo"
	"github.com/harmonia-ci/harmonia-ci/internal/signerapi"
)

// Ticketer issues evaluation tickets: a signer's proof that this node holds an evaluation
// (signerclient.Client).
type Ticketer interface {
	EvalTicket(ctx context.Context, claim signerapi.EvalClaim) (signerapi.EvalTicketResponse, error)
}

// credentialPath is the frontends' endpoint (package evalcred, which the evaluator does not
// import: it is the frontend's, with the forges).
const credentialPath = "/api/eval-credential"

// credentials asks the live frontends for the read credential of a held evaluation's
// repository, showing a signer's ticket rather than the node's token.
type credentials struct {
	tickets       Ticketer
	pool          *pgxpool.Pool
	http          *http.Client
	deadThreshold time.Duration
}

// errNoCredential is a frontend's refusal, or no frontend at all.
var errNoCredential = errors.New("no read credential for the private repository")

// get returns the credential for claim c's repository.
func (cr *credentials) get(ctx context.Context, c claim) (gitrepo.Credential, error) {
	t, err := cr.tickets.EvalTicket(ctx, signerapi.EvalClaim{ID: c.id, Attempt: c.attempt})
	if err != nil {
		return gitrepo.Credential{}, fmt.Errorf("%w: evaluation ticket: %w", errNoCredential, err)
	}
	rows, err := cr.pool.Query(ctx, sqlFrontends, cmp.Or(cr.deadThreshold, cluster.DefaultDeadThreshold).Seconds())
	if err != nil {
		return gitrepo.Credential{}, fmt.Errorf("look up frontends: %w", err)
	}
	endpoints, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return gitrepo.Credential{}, fmt.Errorf("look up frontends: %w", err)
	}
	if len(endpoints) == 0 {
		return gitrepo.Credential{}, fmt.Errorf("%w: no live frontend in the nodes table", errNoCredential)
	}
	body, err := json.Marshal(map[string]string{"ticket": t.Ticket})
	if err != nil {
		return gitrepo.Credential{}, err
	}
	var last error
	for _, ep := range endpoints {
		cred, final, err := cr.ask(ctx, ep, body)
		if err == nil {
			return cred, nil
		}
		if final {
			return gitrepo.Credential{}, err
		}
		last = err
	}
	return gitrepo.Credential{}, fmt.Errorf("%w: %w", errNoCredential, last)
}

// ask asks one frontend; final reports an answer that another frontend would give too (4xx).
func (cr *credentials) ask(ctx context.Context, endpoint string, body []byte) (cred gitrepo.Credential, final bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(endpoint, "/")+credentialPath, bytes.NewReader(body))
	if err != nil {
		return cred, false, fmt.Errorf("frontend %s: %w", endpoint, err)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := cr.http.Do(req)
	if err != nil {
		return cred, false, fmt.Errorf("frontend %s: %w", endpoint, err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return cred, false, fmt.Errorf("frontend %s: read answer: %w", endpoint, err)
	}
	if res.StatusCode != http.StatusOK {
		var eb struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(data, &eb)
		err := fmt.Errorf("%w: frontend %s: %s: %s", errNoCredential, endpoint, res.Status, eb.Error)
		return cred, res.StatusCode >= 400 && res.StatusCode < 500, err
	}
	if err := json.Unmarshal(data, &cred); err != nil {
		return gitrepo.Credential{}, false, fmt.Errorf("frontend %s: decode answer: %w", endpoint, err)
	}
	if cred.URL == "" || (cred.Token == "" && cred.SSHKey == "") {
		return gitrepo.Credential{}, false, fmt.Errorf("frontend %s: answer without a URL or a secret", endpoint)
	}
	return cred, true, nil
}
