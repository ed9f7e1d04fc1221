package node

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/apiv1"
	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/commitstatus"
	"github.com/harmonia-ci/harmonia-ci/internal/evalcred"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/forgesync"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
	"github.com/harmonia-ci/harmonia-ci/internal/signerclient"
	"github.com/harmonia-ci/harmonia-ci/internal/web"
	"github.com/harmonia-ci/harmonia-ci/internal/webhook"
	"github.com/harmonia-ci/harmonia-ci/internal/webui"
)

// forgeSide builds the frontend's side of the forges: the webhook receiver and the project
// admin API on the HTTP server, the commit status reporter, and the maintenance leader's
// repository discovery and polling tasks.
func (n *node) forgeSide(httpServer *web.Server, notifier *notify.Notifier, endpoint string, store blob.Store) (*commitstatus.Reporter, []cluster.Task, error) {
	cfg := n.cfg
	forges, err := forge.FromConfig(cfg.Forges)
	if err != nil {
		return nil, nil, err
	}
	publicURL := strings.TrimRight(cmpOr(cfg.Frontend.PublicURL, endpoint), "/")
	enabler := &project.Enabler{Pool: n.pool, Forges: forges, PublicURL: publicURL, Configured: cfg.Frontend.PublicURL != ""}
	httpServer.RegisterProjects(enabler)
	oauth, err := forge.OAuthFromConfig(cfg.Forges)
	if err != nil {
		return nil, nil, err
	}
	ui, err := webui.New(webui.Config{Pool: n.pool, Forges: forges, Notifier: notifier, Logger: n.logger,
		Secret: []byte(cfg.Auth.Secret), Admins: cfg.Auth.Admins, AdminToken: cfg.Auth.AdminToken,
		PublicURL: cfg.Frontend.PublicURL, OAuth: oauth,
		CacheURL: cfg.Cache.PublicURL, DeadThreshold: cfg.Cluster.Heartbeat.DeadThreshold.Duration,
		RateLimits: webui.RateLimits{Rate: offIfZero(cfg.Frontend.APIRate), Burst: cfg.Frontend.APIBurst,
			AnonymousRate: offIfZero(cfg.Frontend.APIAnonymousRate), AnonymousBurst: cfg.Frontend.APIAnonymousBurst}})
	if err != nil {
		return nil, nil, err
	}
	ui.Register(httpServer.Routes())
	// The API reads logs from the blob store where this node holds it, else as the build
	// pages do (from a cache node).
	tail := func(ctx context.Context, id int64, max int) (string, error) {
		t, err := ui.LogTail(ctx, id, max)
		if errors.Is(err, webui.ErrNoLog) {
			return "", apiv1.ErrNoLog
		}
		return t.Text, err
	}
	if store != nil {
		tail = apiv1.StoreTail(n.pool, store)
		httpServer.ServeLogsFrom(store)
	}
	apiv1.New(apiv1.Config{Pool: n.pool, Tail: tail, Logger: n.logger}).Register(httpServer.Routes())
	if len(forges) == 0 {
		return nil, nil, nil
	}
	discover := func(name string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if _, err := forgesync.Discover(ctx, n.pool, forges[name]); err != nil {
			n.logger.Warn("repository discovery failed", "forge", name, "error", err)
		}
	}
	maxBody := map[string]int64{}
	for _, fc := range cfg.Forges {
		maxBody[fc.Name] = int64(fc.MaxWebhookBody)
	}
	receiver := webhook.New(webhook.Config{
		Forges: forges, MaxBody: maxBody, MaxInFlight: cfg.Frontend.MaxWebhooksInFlight,
		OnRepositoriesChanged: discover, Logger: n.logger, Registerer: n.reg,
	}, n.pool)
	receiver.Register(httpServer.Routes())
	// Private repositories: evaluators ask here for a read credential, with a ticket this
	// frontend has a signer check (so it needs its node token).
	credCfg := evalcred.Config{Forges: forges, Logger: n.logger}
	if token, err := nodeToken(cfg); err != nil {
		return nil, nil, err
	} else if token != "" {
		credCfg.Tickets = signerclient.New(signerclient.Config{Token: token, DeadThreshold: cfg.Cluster.Heartbeat.DeadThreshold.Duration,
			GiveUpAfter: evalcred.DefaultTimeout / 2}, n.pool, n.logger)
	} else {
		n.logger.Warn("frontend without a node token: evaluators get no read credential for private repositories (set auth.node_token_file)")
	}
	evalcred.New(credCfg, n.pool).Register(httpServer.Routes())
	// A frontend the cluster counts as dead loses its status deliveries to the others; a forge
	// call gets half that window, so a live frontend renews its lease in time.
	lease := cfg.Cluster.Heartbeat.DeadThreshold.Duration
	reporter := commitstatus.New(commitstatus.Config{
		NodeID: cfg.Node.ID, Forges: forges, Links: commitstatus.Links{Base: publicURL},
		Debounce: cfg.Frontend.StatusDebounce.Duration, Notifier: notifier, Logger: n.logger,
		Lease: lease, CallTimeout: min(commitstatus.DefaultCallTimeout, lease/2),
		RetryInterval: cfg.Cluster.Heartbeat.Interval.Duration, Registerer: n.reg,
	}, n.pool)
	tasks := forgesync.Tasks(forgesync.Config{
		Forges: forges, SyncInterval: cfg.Frontend.RepoSyncInterval.Duration,
		PollCheck: cfg.Frontend.PollCheckInterval.Duration,
		Push: func(ctx context.Context, f forge.Forge, ev forge.Event) error {
			_, err := receiver.Dispatch(ctx, f, ev)
			return err
		},
		Reregister: enabler.Reregister,
		Logger:     n.logger,
	}, n.pool)
	// Users' cache tokens follow their forge permissions (a user logs in with a forge).
	tasks = append(tasks, ui.TokenRefreshTask(cfg.Frontend.CacheTokenRefresh.Duration))
	n.logger.Info("forges connected", "forges", strings.Join(forges.Names(), ","), "public_url", publicURL)
	return reporter, tasks, nil
}

// offIfZero is a configured rate as webui.RateLimits takes it: 0 (no limit) is negative there.
func offIfZero(rate int) float64 {
	if rate == 0 {
		return -1
	}
	return float64(rate)
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
