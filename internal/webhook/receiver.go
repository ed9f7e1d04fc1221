// Package webhook receives forge webhook deliveries at POST /webhook/{forge}/{repository id}
// (a repository's hook, signed with its own secret) and POST /webhook/{forge} (a GitHub App's
// one webhook): it verifies their signature while the body streams, before anything else,
// finds the enabled project, decides whether a pull request may be evaluated (trust.go: who is
// trusted, and which commit an approval approves), and queues the evaluation. The polling
// fallback hands new branch heads to the same Dispatch.
package webhook

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/gitrepo"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
)

// DefaultMaxBody is the body cap of a forge type's deliveries when Config.MaxBody names none:
// GitHub caps its payloads at 25 MB; Gitea's, which list at most a push's few newest commits,
// stay far below 5 MB.
func DefaultMaxBody(forgeType string) int64 {
	if forgeType == forge.TypeGitHub {
		return 25_000_000
	}
	return 5_000_000
}

// DefaultMaxInFlight bounds the deliveries one frontend handles at a time when
// Config.MaxInFlight is 0.
const DefaultMaxInFlight = 32

// Config configures a Receiver.
type Config struct {
	Forges forge.Set
	// MaxBody is the body cap of each forge's deliveries by name; absent or 0: DefaultMaxBody
	// of its type. Larger deliveries get 413.
	MaxBody map[string]int64
	// MaxInFlight bounds the deliveries handled at a time (0: DefaultMaxInFlight); past it
	// they get 503 with Retry-After.
	MaxInFlight int
	// OnRepositoriesChanged is called, without waiting for it, when a forge says the
	// repositories its credentials see changed (GitHub App installation events). Calls for
	// one forge never overlap: events during one make one more call after it.
	OnRepositoriesChanged func(forgeName string)
	Logger                *slog.Logger
	// Registerer, if set, receives harmonia_ci_webhook_deliveries_total.
	Registerer prometheus.Registerer
}

// Receiver handles webhook deliveries.
type Receiver struct {
	cfg      Config
	pool     *pgxpool.Pool
	log      *slog.Logger
	metrics  *receiverMetrics
	inFlight chan struct{}

	mu sync.Mutex
	// discovery is, per forge name, whether a discovery runs (present) and whether another
	// is due after it (true).
	discovery map[string]bool
}

// New returns a receiver for the configured forges.
func New(cfg Config, pool *pgxpool.Pool) *Receiver {
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	return &Receiver{cfg: cfg, pool: pool, log: cfg.Logger.With("service", "webhook"),
		metrics: newReceiverMetrics(cfg.Registerer, cfg.Forges), inFlight: make(chan struct{}, cfg.MaxInFlight),
		discovery: map[string]bool{}}
}

// Register mounts POST /webhook/{forge}/{repo} and POST /webhook/{forge}: signed deliveries,
// answered only to their forge.
func (r *Receiver) Register(rt *access.Routes) {
	h := httpapi.Handle(r.log, httpapi.WithDBTimeout(r.handle))
	rt.Handle("POST /webhook/{forge}", access.Signed, h)
	rt.Handle("POST /webhook/{forge}/{repo}", access.Signed, h)
}

// maxBody is forge f's body cap.
func (r *Receiver) maxBody(f forge.Forge) int64 {
	if n := r.cfg.MaxBody[f.Name()]; n > 0 {
		return n
	}
	return DefaultMaxBody(f.Type())
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
		return httpapi.Errorf(http.StatusNotFound, "no forge named %q is configured", name)
	}
	var repoID int64
	if s := req.PathValue("repo"); s != "" {
		if repoID, err = strconv.ParseInt(s, 10, 64); err != nil || repoID <= 0 {
			return httpapi.Errorf(http.StatusNotFound, "repository id %q: want the forge's positive id", s)
		}
	}
	select {
	case r.inFlight <- struct{}{}:
		r.metrics.flight(1)
		defer func() { r.metrics.flight(-1); <-r.inFlight }()
	default:
		w.Header().Set("Retry-After", "5")
		return httpapi.Errorf(http.StatusServiceUnavailable, "too many webhook deliveries in flight; deliver again later")
	}
	event, result := eventUnknown, ""
	defer func() { r.metrics.delivered(name, event, result, err) }()
	body, sum, err := r.readVerified(w, req, f, repoID)
	if err != nil {
		return err
	}
	ev, err := f.ParseWebhook(req.Header, body)
	if err != nil {
		return &httpapi.Error{Code: http.StatusBadRequest, Msg: err.Error()}
	}
	if repoID != 0 {
		if err := r.sameRepository(req.Context(), f, ev, repoID); err != nil {
			r.log.Warn("webhook delivery refused", "forge", name, "remote", req.RemoteAddr, "error", err)
			return &httpapi.Error{Code: http.StatusUnauthorized, Msg: "delivery signed for another repository", Err: err}
		}
	}
	ev.BodySHA256 = sum
	event = string(ev.Kind)
	out, err := r.Dispatch(req.Context(), f, ev)
	if err != nil {
		return err
	}
	result = out.result
	r.log.Info("webhook delivery", "forge", name, "event", ev.Type, "action", ev.Action, "delivery", ev.DeliveryID,
		"repository", ev.Repository.FullName(), "code", out.Code, "outcome", out.Message, "evaluation", out.EvalID)
	httpapi.WriteJSON(w, out.Code, out)
	return nil
}

// readVerified reads a delivery's body while computing its signature, keeping at most
// spoolMemory of it in memory until the signature is known to be good, and returns the
// genuine body and its SHA-256. Nothing of an unsigned body is looked at or recorded.
func (r *Receiver) readVerified(w http.ResponseWriter, req *http.Request, f forge.Forge, repoID int64) ([]byte, [sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	refused := func(err error) error {
		r.log.Warn("webhook delivery refused", "forge", f.Name(), "remote", req.RemoteAddr, "error", err)
		return &httpapi.Error{Code: http.StatusUnauthorized, Msg: "invalid or missing webhook signature", Err: err}
	}
	// The expected signature is known before the body is read: a delivery without one costs
	// no read at all.
	v, err := f.WebhookVerifier(req.Header, repoID)
	if err != nil {
		return nil, sum, refused(err)
	}
	limit := r.maxBody(f)
	if req.ContentLength > limit {
		return nil, sum, httpapi.Errorf(http.StatusRequestEntityTooLarge, "delivery larger than %d bytes", limit)
	}
	var sp spool
	defer sp.Close()
	_, err = io.Copy(io.MultiWriter(v, &sp), http.MaxBytesReader(w, req.Body, limit))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return nil, sum, httpapi.Errorf(http.StatusRequestEntityTooLarge, "delivery larger than %d bytes", limit)
	}
	if err != nil {
		return nil, sum, &httpapi.Error{Code: http.StatusBadRequest, Msg: "could not read the delivery", Err: err}
	}
	if err := v.Verify(); err != nil {
		return nil, sum, refused(err)
	}
	body, err := sp.bytes()
	if err != nil {
		return nil, sum, err
	}
	return body, sha256.Sum256(body), nil
}

// sameRepository checks that a delivery at the URL of the repository whose forge id is
// repoID (signed with that repository's secret) is about that repository: the body names it,
// by id, and the repository recorded under the body's name has that id. Events about no
// repository are let through (they are ignored).
func (r *Receiver) sameRepository(ctx context.Context, f forge.Forge, ev forge.Event, repoID int64) error {
	if ev.Repository.FullName() == "/" {
		if ev.Kind == forge.EventIgnored {
			return nil
		}
		return fmt.Errorf("%s delivery names no repository", ev.Type)
	}
	if ev.Repository.ForgeID != repoID {
		return fmt.Errorf("delivery for repository id %d (%s) at the URL of repository id %d",
			ev.Repository.ForgeID, ev.Repository.FullName(), repoID)
	}
	var recorded *int64
	err := r.pool.QueryRow(ctx, sqlRepositoryForgeID, f.Name(), ev.Repository.FullName()).Scan(&recorded)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // no project either: Dispatch answers that
	}
	if err != nil {
		return fmt.Errorf("forge id of %s: %w", ev.Repository.FullName(), err)
	}
	if recorded == nil {
		return fmt.Errorf("delivery names %s, whose forge id is not recorded, at the URL of repository id %d",
			ev.Repository.FullName(), repoID)
	}
	if *recorded != repoID {
		return fmt.Errorf("delivery names %s, recorded with forge id %d, at the URL of repository id %d",
			ev.Repository.FullName(), *recorded, repoID)
	}
	return nil
}

// discover runs OnRepositoriesChanged for forge name, coalescing: while one runs, further
// events make one more run after it, not one each.
func (r *Receiver) discover(name string) {
	r.mu.Lock()
	if _, running := r.discovery[name]; running {
		r.discovery[name] = true
		r.mu.Unlock()
		return
	}
	r.discovery[name] = false
	r.mu.Unlock()
	go func() {
		for {
			r.cfg.OnRepositoriesChanged(name)
			r.mu.Lock()
			if !r.discovery[name] {
				delete(r.discovery, name)
				r.mu.Unlock()
				return
			}
			r.discovery[name] = false
			r.mu.Unlock()
		}
	}()
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
			r.discover(f.Name())
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
		return Outcome{}, httpapi.Errorf(http.StatusBadRequest, "delivery has no delivery id header")
	}
	repo := forge.Repo{Owner: ev.Repository.Owner, Name: ev.Repository.Name, InstallationID: ev.Repository.InstallationID}
	switch ev.Kind {
	case forge.EventPush:
		if err := gitrepo.ValidateBranch(ev.Branch); err != nil {
			return Outcome{}, httpapi.Errorf(http.StatusBadRequest, "push: %v", err)
		}
		// Deliveries arrive late or again: a pushed commit is evaluated (and supersedes the
		// branch's evaluations) only while it is the branch's head on the forge.
		isHead := func(ctx context.Context) (bool, error) {
			head, err := f.BranchHead(ctx, repo, ev.Branch)
			if errors.Is(err, forge.ErrNotFound) {
				return false, nil // the branch is gone
			}
			return head == ev.After, err
		}
		return r.request(ctx, p, f, ev, evaluation.RequestParams{Commit: ev.After, Branch: ev.Branch, TreeHash: ev.Tree, IsHead: isHead})
	case forge.EventPullRequest:
		if reason := prRefused(p); reason != "" {
			return ok("%s", reason), nil
		}
		pr := ev.PullRequest
		if p.PRTrust == project.PRTrustCollaborators {
			trusted, err := r.trusted(ctx, f, repo, ev.Sender)
			if err != nil {
				return Outcome{}, forgeUnavailable("check the sender's access", err)
			}
			if !trusted {
				return ok("%s", waitsForApproval(ev)), nil
			}
		}
		return r.request(ctx, p, f, ev, prParams(pr))
	case forge.EventComment:
		arg, isRun := runCommand(ev.Body)
		if !isRun {
			return ok("comment without %q", RunCommand), nil
		}
		if reason := prRefused(p); reason != "" {
			return ok("%s", reason), nil
		}
		trusted, err := r.trusted(ctx, f, repo, ev.Commenter)
		if err != nil {
			return Outcome{}, forgeUnavailable("check the commenter", err)
		}
		if !trusted {
			return ok("%q by %s ignored: not a collaborator", RunCommand, ev.Commenter), nil
		}
		// The author and state come from the delivery if the forge sends the pull request with
		// the comment (Gitea), else from the forge now (GitHub); the head is approvedHead's.
		pr := ev.PullRequest
		if pr.HeadSHA == "" {
			if pr, err = f.PullRequest(ctx, repo, ev.PullRequest.Number); err != nil {
				return Outcome{}, forgeUnavailable("read the pull request", err)
			}
		}
		if pr.State != "" && pr.State != "open" {
			return ok("pull request #%d is %s", pr.Number, pr.State), nil
		}
		head, reason, err := approvedHead(ctx, f, repo, ev, arg)
		if err != nil {
			return Outcome{}, forgeUnavailable("list the pull request's commits", err)
		}
		if reason != "" {
			return ok("%s", reason), nil
		}
		pr.HeadSHA = head
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

func prParams(pr forge.PullRequest) evaluation.RequestParams {
	return evaluation.RequestParams{Commit: pr.HeadSHA, Branch: PRBranch(pr.Number), PRNumber: pr.Number, PRAuthor: pr.Author,
		PRAuthorID: pr.AuthorID, PRBase: pr.BaseBranch}
}

func (r *Receiver) request(ctx context.Context, p project.Project, f forge.Forge, ev forge.Event, rp evaluation.RequestParams) (Outcome, error) {
	rp.ProjectID, rp.FlakeURL = p.ID, p.RepoURL
	if ev.DeliveryID != "" {
		rp.Delivery = &evaluation.Delivery{Forge: f.Name(), ID: ev.DeliveryID}
		if ev.BodySHA256 != ([sha256.Size]byte{}) {
			rp.Delivery.BodySHA256 = ev.BodySHA256[:]
		}
	}
	e, created, err := evaluation.Request(ctx, r.pool, rp)
	if errors.Is(err, evaluation.ErrDuplicateDelivery) {
		out := ok("delivery %s was received before", ev.DeliveryID)
		out.result = resultReplayed
		return out, nil
	}
	if errors.Is(err, evaluation.ErrNotHead) {
		return ok("%s is no longer the head of %s", rp.Commit, rp.Branch), nil
	}
	if errors.Is(err, evaluation.ErrHeadUnknown) {
		return Outcome{}, forgeUnavailable("read the branch's head", err)
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

func forgeUnavailable(what string, err error) error {
	return &httpapi.Error{Code: http.StatusBadGateway, Msg: "could not " + what + " with the forge; deliver again later", Err: err}
}
