// Package webhook receives forge webhook deliveries at POST /webhook/{forge}: it verifies
// their signature before anything else, finds the enabled project, decides whether a pull
// request may be evaluated (asking the forge about its author), and queues the evaluation.
// The polling fallback hands new branch heads to the same Dispatch.
package webhook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/eval"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/gitrepo"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
	"github.com/harmonia-ci/harmonia-ci/internal/web"
)

// DefaultMaxBody bounds a delivery's body when Config.MaxBody is 0: GitHub's own cap (25 MB).
const DefaultMaxBody = 25 << 20

// RunCommand is the pull request comment by which a collaborator has a pull request
// evaluated, on a line of its own.
const RunCommand = "/ci run"

// Config configures a Receiver.
type Config struct {
	Forges  forge.Set
	MaxBody int64 // 0: DefaultMaxBody
	// OnRepositoriesChanged is called, without waiting for it, when a forge says the
	// repositories its credentials see changed (GitHub App installation events).
	OnRepositoriesChanged func(forgeName string)
	Logger                *slog.Logger
	// Registerer, if set, receives harmonia_ci_webhook_deliveries_total.
	Registerer prometheus.Registerer
}

// Receiver handles webhook deliveries.
type Receiver struct {
	cfg     Config
	pool    *pgxpool.Pool
	log     *slog.Logger
	metrics *receiverMetrics
}

// New returns a receiver for the configured forges.
func New(cfg Config, pool *pgxpool.Pool) *Receiver {
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	return &Receiver{cfg: cfg, pool: pool, log: cfg.Logger.With("service", "webhook"),
		metrics: newReceiverMetrics(cfg.Registerer, cfg.Forges)}
}

// Register mounts POST /webhook/{forge}.
func (r *Receiver) Register(mux *http.ServeMux) {
	mux.Handle("POST /webhook/{forge}", web.Handle(r.log, web.WithDBTimeout(r.handle)))
}

// Outcome is what a delivery led to.
type Outcome struct {
	Code    int    `json:"-"`
	Message string `json:"message"`
	// EvalID is the evaluation requested (new, or the existing one of the same commit).
	EvalID int64 `json:"evaluation,omitempty"`
	// result is the delivery's harmonia_ci_webhook_deliveries_total label.
	result string
}

func (r *Receiver) handle(w http.ResponseWriter, req *http.Request) (err error) {
	name := req.PathValue("forge")
	f, ok := r.cfg.Forges[name]
	if !ok {
		return web.Errorf(http.StatusNotFound, "no forge named %q is configured", name)
	}
	event, result := eventUnknown, ""
	defer func() { r.metrics.delivered(name, event, result, err) }()
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, r.cfg.MaxBody))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return web.Errorf(http.StatusRequestEntityTooLarge, "delivery larger than %d bytes", r.cfg.MaxBody)
	}
	if err != nil {
		return web.Errorf(http.StatusBadRequest, "read delivery: %v", err)
	}
	// The signature comes first: nothing of an unsigned body is looked at or recorded.
	if err := f.VerifyWebhook(req.Header, body); err != nil {
		r.log.Warn("webhook delivery refused", "forge", name, "remote", req.RemoteAddr, "error", err)
		return &web.HTTPError{Code: http.StatusUnauthorized, Msg: "invalid or missing webhook signature", Err: err}
	}
	ev, err := f.ParseWebhook(req.Header, body)
	if err != nil {
		return &web.HTTPError{Code: http.StatusBadRequest, Msg: err.Error()}
	}
	event = string(ev.Kind)
	out, err := r.Dispatch(req.Context(), f, ev)
	if err != nil {
		return err
	}
	result = out.result
	r.log.Info("webhook delivery", "forge", name, "event", ev.Type, "action", ev.Action, "delivery", ev.DeliveryID,
		"repository", ev.Repository.FullName(), "code", out.Code, "outcome", out.Message, "evaluation", out.EvalID)
	web.WriteJSON(w, out.Code, out)
	return nil
}

func ok(format string, args ...any) Outcome {
	return Outcome{Code: http.StatusOK, Message: fmt.Sprintf(format, args...), result: resultIgnored}
}

// Dispatch acts on a verified event: it requests an evaluation, or says why not.
func (r *Receiver) Dispatch(ctx context.Context, f forge.Forge, ev forge.Event) (Outcome, error) {
	switch ev.Kind {
	case forge.EventIgnored:
		return ok("ignored %s event", strings.TrimSpace(ev.Type+" "+ev.Action)), nil
	case forge.EventInstallation:
		if r.cfg.OnRepositoriesChanged != nil {
			go r.cfg.OnRepositoriesChanged(f.Name())
		}
		return Outcome{Code: http.StatusAccepted, Message: "repository discovery started", result: resultAccepted}, nil
	}
	p, err := project.ByRepository(ctx, r.pool, f.Name(), ev.Repository.FullName())
	if errors.Is(err, project.ErrNotFound) {
		return ok("no project for %s", ev.Repository.FullName()), nil
	}
	if err != nil {
		return Outcome{}, err
	}
	if !p.Enabled {
		return ok("project %s is disabled", p.Name), nil
	}
	if ev.DeliveryID == "" {
		return Outcome{}, web.Errorf(http.StatusBadRequest, "delivery has no delivery id header")
	}
	repo := forge.Repo{Owner: ev.Repository.Owner, Name: ev.Repository.Name, InstallationID: ev.Repository.InstallationID}
	switch ev.Kind {
	case forge.EventPush:
		if err := gitrepo.ValidateBranch(ev.Branch); err != nil {
			return Outcome{}, web.Errorf(http.StatusBadRequest, "push: %v", err)
		}
		return r.request(ctx, p, f, ev, eval.RequestParams{Commit: ev.After, Branch: ev.Branch, TreeHash: ev.Tree})
	case forge.EventPullRequest:
		if reason := prRefused(p); reason != "" {
			return ok("%s", reason), nil
		}
		pr := ev.PullRequest
		if p.PRTrust == project.PRTrustCollaborators {
			trusted, err := f.IsCollaborator(ctx, repo, pr.Author)
			if err != nil {
				return Outcome{}, forgeUnavailable("check the pull request's author", err)
			}
			if !trusted {
				return ok("pull request #%d by %s waits for a collaborator's %q", pr.Number, pr.Author, RunCommand), nil
			}
		}
		return r.request(ctx, p, f, ev, prParams(pr))
	case forge.EventComment:
		if !hasRunCommand(ev.Body) {
			return ok("comment without %q", RunCommand), nil
		}
		if reason := prRefused(p); reason != "" {
			return ok("%s", reason), nil
		}
		trusted, err := f.IsCollaborator(ctx, repo, ev.Commenter)
		if err != nil {
			return Outcome{}, forgeUnavailable("check the commenter", err)
		}
		if !trusted {
			return ok("%q by %s ignored: not a collaborator", RunCommand, ev.Commenter), nil
		}
		// The head as of the approval: a push after it needs another approval. A forge that
		// sends the pull request with the comment says what it was then; otherwise it is asked
		// now, as close to the comment as this frontend gets.
		pr := ev.PullRequest
		if pr.HeadSHA == "" {
			if pr, err = f.PullRequest(ctx, repo, ev.PullRequest.Number); err != nil {
				return Outcome{}, forgeUnavailable("read the pull request", err)
			}
		}
		if pr.State != "" && pr.State != "open" {
			return ok("pull request #%d is %s", pr.Number, pr.State), nil
		}
		return r.request(ctx, p, f, ev, prParams(pr))
	}
	return ok("ignored %s event", ev.Type), nil
}

func prRefused(p project.Project) string {
	if !p.PREnabled || p.PRTrust == project.PRTrustNone {
		return "project " + p.Name + " does not evaluate pull requests"
	}
	return ""
}

// PRBranch is the branch name evaluations of pull request n are recorded under: a new head
// supersedes the previous one's evaluation.
func PRBranch(n int) string { return fmt.Sprintf("pull/%d", n) }

func prParams(pr forge.PullRequest) eval.RequestParams {
	return eval.RequestParams{Commit: pr.HeadSHA, Branch: PRBranch(pr.Number), PRNumber: pr.Number, PRAuthor: pr.Author, PRAuthorID: pr.AuthorID}
}

func (r *Receiver) request(ctx context.Context, p project.Project, f forge.Forge, ev forge.Event, rp eval.RequestParams) (Outcome, error) {
	rp.ProjectID, rp.FlakeURL = p.ID, p.RepoURL
	if ev.DeliveryID != "" {
		rp.Delivery = &eval.Delivery{Forge: f.Name(), ID: ev.DeliveryID}
	}
	e, created, err := eval.Request(ctx, r.pool, rp)
	if errors.Is(err, eval.ErrDuplicateDelivery) {
		out := ok("delivery %s was received before", ev.DeliveryID)
		out.result = resultReplayed
		return out, nil
	}
	if err != nil {
		return Outcome{}, err
	}
	msg := "evaluation queued"
	if !created {
		msg = "evaluation exists"
	}
	return Outcome{Code: http.StatusAccepted, Message: msg, EvalID: e.ID, result: resultAccepted}, nil
}

func hasRunCommand(body string) bool {
	for line := range strings.Lines(body) {
		if strings.TrimSpace(line) == RunCommand {
			return true
		}
	}
	return false
}

func forgeUnavailable(what string, err error) error {
	return &web.HTTPError{Code: http.StatusBadGateway, Msg: "could not " + what + " with the forge; deliver again later", Err: err}
}
