package evalcred_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/evalcred"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/gitrepo"
	"github.com/harmonia-ci/harmonia-ci/internal/nodetoken"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/signerapi"
	"github.com/harmonia-ci/harmonia-ci/internal/signerclient"
	"github.com/harmonia-ci/harmonia-ci/internal/signertest"
)

// fakeForge mints a fixed credential and records for which repositories.
type fakeForge struct {
	forge.Forge // every other method panics: the endpoint must not call them

	mu    sync.Mutex
	asked []string
}

const secretToken = "ghs_EVALCREDTESTSECRET0123456789abcdef"

func (f *fakeForge) ReadCredential(_ context.Context, r forge.Repository) (gitrepo.Credential, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, r.FullName())
	return gitrepo.Credential{URL: r.CloneURL, Username: "x-access-token", Token: secretToken}, nil
}

// TestCredentialOnlyForTheHolder: only the evaluator that holds a running evaluation, at its
// attempt, or walks a unit of it, gets its repository's credential; everything else is refused before the forge is
// asked.
func TestCredentialOnlyForTheHolder(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	cl := signertest.Start(t, pool, signertest.Options{KeyName: "evalcred-test-1"})
	project := queuetest.NewProject(t, pool, "private", 100)
	newEval := func(t *testing.T) int64 {
		return queuetest.QueryInt(t, pool, `
INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, status, claimed_by, claimed_at, started_at, attempt)
VALUES ($1, 'git+file:///p', md5($2), 'main', 'running', 'eval-1', now(), now(), 2) RETURNING id`, project, t.Name())
	}
	ff := &fakeForge{}
	srv := func(checker evalcred.TicketChecker) string {
		mux := http.NewServeMux()
		evalcred.New(evalcred.Config{Forges: forge.Set{"github": ff}, Tickets: checker, Logger: queuetest.TestLogger(t)}, pool).Register(access.NewRoutes(mux, nil))
		ts := httptest.NewServer(mux)
		t.Cleanup(ts.Close)
		return ts.URL
	}
	frontend := srv(cl.Client(t, "front-1", config.RoleFrontend))
	notFrontend := srv(cl.Client(t, "eval-1", config.RoleEvaluator))
	noToken := srv(nil)

	ctx := t.Context()
	ticket := func(node string, roles []string, id int64, attempt int) (string, error) {
		res, err := cl.Client(t, node, roles...).EvalTicket(ctx, signerapi.EvalClaim{ID: id, Attempt: attempt})
		return res.Ticket, err
	}
	evaluator := []string{config.RoleEvaluator}
	otherCluster, err := nodetoken.NewKey("another-cluster-secret-0123456789")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		// setup returns the ticket to show, or the error the signer gave instead of one.
		setup     func(id int64) (string, error)
		endpoint  string
		ticketErr int // the signer's refusal of the ticket, 0 if it issues one
		code      int
	}{
		{name: "holder", setup: func(id int64) (string, error) { return ticket("eval-1", evaluator, id, 2) },
			endpoint: frontend, code: http.StatusOK},
		{name: "builder role", setup: func(id int64) (string, error) {
			return ticket("eval-1", []string{config.RoleBuilder}, id, 2)
		}, ticketErr: http.StatusForbidden},
		{name: "another node", setup: func(id int64) (string, error) { return ticket("eval-2", evaluator, id, 2) },
			ticketErr: http.StatusConflict},
		{name: "a node walking a unit of it", setup: func(id int64) (string, error) {
			queuetest.Exec(t, pool, `INSERT INTO eval_units (eval_id, eval_attempt, handed, path, force, status, claimed_by, attempt)
VALUES ($1, 2, 'big', '{big}', 1, 'running', 'eval-2', 1)`, id)
			return ticket("eval-2", evaluator, id, 2)
		}, endpoint: frontend, code: http.StatusOK},
		{name: "a node whose unit is done", setup: func(id int64) (string, error) {
			queuetest.Exec(t, pool, `INSERT INTO eval_units (eval_id, eval_attempt, handed, path, force, status, claimed_by, attempt)
VALUES ($1, 2, 'big', '{big}', 1, 'done', 'eval-2', 1)`, id)
			return ticket("eval-2", evaluator, id, 2)
		}, ticketErr: http.StatusConflict},
		{name: "stale attempt", setup: func(id int64) (string, error) { return ticket("eval-1", evaluator, id, 1) },
			ticketErr: http.StatusConflict},
		{name: "finished after the ticket", setup: func(id int64) (string, error) {
			tk, err := ticket("eval-1", evaluator, id, 2)
			queuetest.Exec(t, pool, `UPDATE evaluations SET status = 'succeeded', finished_at = now() WHERE id = $1`, id)
			return tk, err
		}, endpoint: frontend, code: http.StatusConflict},
		{name: "reclaimed after the ticket", setup: func(id int64) (string, error) {
			tk, err := ticket("eval-1", evaluator, id, 2)
			queuetest.Exec(t, pool, `UPDATE evaluations SET attempt = 3 WHERE id = $1`, id)
			return tk, err
		}, endpoint: frontend, code: http.StatusConflict},
		{name: "forged ticket", setup: func(id int64) (string, error) {
			return otherCluster.IssueTicket(nodetoken.Ticket{NodeID: "eval-1", EvalID: id, Attempt: 2, Expires: time.Now().Add(time.Minute)})
		}, endpoint: frontend, code: http.StatusForbidden},
		{name: "expired ticket", setup: func(id int64) (string, error) {
			return cl.Tokens.IssueTicket(nodetoken.Ticket{NodeID: "eval-1", EvalID: id, Attempt: 2, Expires: time.Now().Add(-time.Second)})
		}, endpoint: frontend, code: http.StatusForbidden},
		{name: "node token for a ticket", setup: func(int64) (string, error) {
			return cl.Token(t, "eval-1", config.RoleEvaluator), nil
		}, endpoint: frontend, code: http.StatusForbidden},
		{name: "checked by a non-frontend", setup: func(id int64) (string, error) { return ticket("eval-1", evaluator, id, 2) },
			endpoint: notFrontend, code: http.StatusForbidden},
		{name: "frontend without a node token", setup: func(id int64) (string, error) { return ticket("eval-1", evaluator, id, 2) },
			endpoint: noToken, code: http.StatusServiceUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := newEval(t)
			tk, err := tt.setup(id)
			var se *signerclient.StatusError
			if tt.ticketErr != 0 {
				if !errors.As(err, &se) || se.Code != tt.ticketErr {
					t.Fatalf("ticket: got %v, want a %d", err, tt.ticketErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ticket: %v", err)
			}
			code, body := post(t, tt.endpoint, evalcred.Request{Ticket: tk})
			if code != tt.code {
				t.Fatalf("POST %s: %d %s, want %d", evalcred.Path, code, body, tt.code)
			}
			if tt.code != http.StatusOK {
				if strings.Contains(body, secretToken) {
					t.Errorf("refusal %q holds the credential", body)
				}
				return
			}
			var cred gitrepo.Credential
			if err := json.Unmarshal([]byte(body), &cred); err != nil {
				t.Fatal(err)
			}
			if cred.Token != secretToken || cred.URL != "https://example.invalid/private" {
				t.Errorf("credential %+v (token %q), want the forge's for https://example.invalid/private", cred, cred.Token)
			}
		})
	}
	ff.mu.Lock()
	defer ff.mu.Unlock()
	if !slices.Equal(ff.asked, []string{"owner/private", "owner/private"}) {
		t.Errorf("the forge was asked for %q, want owner/private twice (for the holder, and the node walking a unit)", ff.asked)
	}
	if code, _ := post(t, frontend, map[string]string{}); code != http.StatusBadRequest {
		t.Errorf("no ticket: %d, want 400", code)
	}
}

func post(t *testing.T, base string, body any) (int, string) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.Post(base+evalcred.Path, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	out, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(out)
}
