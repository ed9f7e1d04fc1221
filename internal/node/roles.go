package node

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/builder"
	"github.com/harmonia-ci/harmonia-ci/internal/cache"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/eval"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nodetoken"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/signer"
	"github.com/harmonia-ci/harmonia-ci/internal/signerclient"
	"github.com/harmonia-ci/harmonia-ci/internal/startstop"
	"github.com/harmonia-ci/harmonia-ci/internal/upload"
	"github.com/harmonia-ci/harmonia-ci/internal/upstream"
)

// nodeToken is the token this node presents to the signer: its configured one, or one it
// derives from the cluster secret if it holds that. "" if it has neither.
func nodeToken(cfg *config.Config) (string, error) {
	if cfg.Auth.NodeToken != "" {
		return cfg.Auth.NodeToken, nil // checked against the node by config validation
	}
	if cfg.Auth.ClusterSecret == "" {
		return "", nil
	}
	k, err := nodetoken.NewKey(cfg.Auth.ClusterSecret)
	if err != nil {
		return "", fmt.Errorf("auth.cluster_secret_file: %w", err)
	}
	return k.Issue(nodetoken.Identity{NodeID: cfg.Node.ID, Roles: cfg.Node.Roles})
}

// openStore opens the binary cache's blob store. For the local store it also returns the
// handler that accepts presigned uploads, which the node serves at /api/blob/.
func openStore(cfg *config.Config, endpoint string, logger *slog.Logger) (blob.Store, http.Handler, error) {
	switch cfg.Cache.Store {
	case "s3":
		s3 := cfg.Cache.S3
		st, err := blob.NewS3(blob.S3Config{
			Endpoint: s3.Endpoint, Region: s3.Region, Bucket: s3.Bucket, AccessKey: s3.AccessKey,
			SecretKey: s3.SecretKey, UseTLS: s3.UseTLS, PathStyle: s3.PathStyle,
		})
		if err != nil {
			return nil, nil, fmt.Errorf("open s3 cache store: %w", err)
		}
		return st, nil, nil
	default:
		dir := cfg.Cache.Dir
		if dir == "" {
			dir = filepath.Join(cfg.StateDir, "cache")
		}
		// Upload URLs are signed with a key derived from the cluster secret, which only signers
		// hold, so that signers sharing a directory accept each other's URLs; a node without it
		// (a cache alone) presigns nothing and gets a random key.
		secret := make([]byte, 32)
		if cfg.Auth.ClusterSecret != "" {
			secret = nodetoken.Derive(cfg.Auth.ClusterSecret, "blob upload")
		} else if _, err := rand.Read(secret); err != nil {
			return nil, nil, err
		}
		st, err := blob.NewLocal(dir, endpoint, secret)
		if err != nil {
			return nil, nil, fmt.Errorf("open local cache store %s: %w", dir, err)
		}
		return st, st.UploadHandler(logger), nil
	}
}

// mountRoles mounts the HTTP surface of the cache and signer roles and returns their blob
// store (nil on a node with neither).
func mountRoles(ctx context.Context, cfg *config.Config, rt *access.Routes, pool *pgxpool.Pool, endpoint string, announcer *queue.Announcer, logger *slog.Logger, reg prometheus.Registerer) (blob.Store, error) {
	if !cfg.HasRole(config.RoleCache) && !cfg.HasRole(config.RoleSigner) {
		return nil, nil
	}
	store, uploads, err := openStore(cfg, endpoint, logger)
	if err != nil {
		return nil, err
	}
	if cfg.HasRole(config.RoleCache) {
		vis, err := cacheVisibility(cfg, pool, logger)
		if err != nil {
			return nil, err
		}
		cache.New(cache.Config{Store: store, Derivations: blob.NewDerivations(pool), Priority: cfg.Cache.Priority,
			NarinfoCacheBytes: int64(cfg.Cache.NarinfoMemory), Logger: logger, Registerer: reg,
			Visibility: vis}).Register(rt)
	}
	if !cfg.HasRole(config.RoleSigner) {
		return store, nil
	}
	if cfg.Signer.SigningKeyFile == "" {
		return nil, fmt.Errorf("the signer role needs signer.signing_key_file (create one with harmonia-ci keygen)")
	}
	if cfg.Auth.ClusterSecret == "" {
		return nil, fmt.Errorf("the signer role needs the cluster secret (auth.cluster_secret_file or HARMONIA_CLUSTER_SECRET)")
	}
	tokens, err := nodetoken.NewKey(cfg.Auth.ClusterSecret)
	if err != nil {
		return nil, fmt.Errorf("auth.cluster_secret_file: %w", err)
	}
	key, err := nix.LoadSecretKeyFile(cfg.Signer.SigningKeyFile)
	if err != nil {
		return nil, fmt.Errorf("signer.signing_key_file: %w", err)
	}
	up, err := upstream.New(cfg.Substituters.URLs, cfg.Substituters.TrustedPublicKeys)
	if err != nil {
		return nil, err
	}
	scfg := signer.Config{
		Store: store, Key: key, Tokens: tokens,
		URLExpiry: cfg.Signer.URLExpiry.Duration, Announcer: announcer, Logger: logger, Registerer: reg,
	}
	if up != nil {
		scfg.Upstream = up
	}
	s, err := signer.New(scfg, pool)
	if err != nil {
		return nil, err
	}
	if err := s.RecordKey(ctx); err != nil {
		return nil, err
	}
	s.Register(rt)
	if uploads != nil {
		rt.Handle("PUT /api/blob/{key...}", access.Signed, uploads) // presigned URLs
	}
	return store, nil
}

// roleWorkers builds the services that claim work: the evaluator and the builder (its claim
// checks, then its queue worker).
func (n *node) roleWorkers(notifier *notify.Notifier, announcer *queue.Announcer) ([]startstop.Service, error) {
	cfg := n.cfg
	var workers []startstop.Service
	// One signer client (discovery, failover, backoff) for the roles that upload.
	token, err := nodeToken(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Auth.ClusterSecret != "" && !cfg.HasRole(config.RoleSigner) {
		n.logger.Warn("this node holds the cluster secret but is no signer: it can act as any node; give it only its node token (harmonia-ci node-token)")
	}
	var client *signerclient.Client
	if token != "" {
		client = signerclient.New(signerclient.Config{Token: token, DeadThreshold: cfg.Cluster.Heartbeat.DeadThreshold.Duration}, n.pool, n.logger)
	}
	if cfg.HasRole(config.RoleBuilder) {
		if token == "" {
			return nil, fmt.Errorf("the builder role needs a node token to upload through the signer (auth.node_token_file or HARMONIA_NODE_TOKEN; issue one with harmonia-ci node-token)")
		}
		if !cfg.Build.Sandbox {
			n.logger.Warn("build.sandbox is false: builds run outside Nix's sandbox and can read this machine's files; only for projects you trust")
		}
		if cfg.Build.Cgroup != "" {
			if err := builder.PrepareCgroup(cfg.Build.Cgroup); err != nil {
				return nil, fmt.Errorf("build.cgroup: %w", err)
			}
		}
		b, err := builder.New(builder.Config{
			NodeID: cfg.Node.ID,
			Store: builder.Store{Root: cfg.Build.NixStore, Daemon: cfg.Build.Daemon, SandboxPaths: cfg.Build.ExtraSandboxPaths,
				Unsandboxed: !cfg.Build.Sandbox, BuildUsersGroup: cfg.Build.BuildUsersGroup, Nice: cfg.Build.Nice,
				Cgroup: cfg.Build.Cgroup},
			Upstream: cfg.Substituters.URLs, UpstreamKeys: cfg.Substituters.TrustedPublicKeys,
			CacheToken: token,
			Limits: builder.BuildLimits{
				Timeout: cfg.Build.Timeout.Duration, MaxSilent: cfg.Build.MaxSilent.Duration,
				MaxOutputSize: int64(cfg.Build.MaxOutputSize),
			},
			MaxLogSize:    int64(cfg.Build.MaxLogSize),
			MinFree:       int64(cfg.Build.MinFree),
			MaxFree:       int64(cfg.Build.MaxFree),
			CheckInterval: cfg.Cluster.Heartbeat.Interval.Duration,
			DeadThreshold: cfg.Cluster.Heartbeat.DeadThreshold.Duration,
			Signer:        client,
			Notifier:      notifier,
			Observe:       n.opts.BuildObserver,
			Registerer:    n.reg,
		}, n.pool, n.logger, n.clock)
		if err != nil {
			return nil, err
		}
		w, err := queue.NewWorker(queue.WorkerConfig{
			Claimer:      queue.Claimer{NodeID: cfg.Node.ID, Systems: cfg.Node.Systems, Features: cfg.Node.Features},
			MaxJobs:      cfg.Node.MaxJobs,
			PollInterval: cfg.Queue.PollInterval.Duration,
			Handler:      b.Handle,
			Gate:         &n.inFlight,
			Notifier:     notifier,
			Announcer:    announcer,
			ClaimFunc:    n.opts.ClaimObserver,
			Registerer:   n.reg,
		}, n.pool, n.logger, n.clock)
		if err != nil {
			return nil, err
		}
		n.buildWorker, n.builder = w, b
		workers = append(workers, b, w)
	}
	if cfg.HasRole(config.RoleEvaluator) {
		up, err := upstream.New(cfg.Substituters.URLs, cfg.Substituters.TrustedPublicKeys)
		if err != nil {
			return nil, err
		}
		ecfg := eval.Config{
			NodeID: cfg.Node.ID, StateDir: cfg.StateDir, MaxEvals: cfg.Node.MaxEvals, Workers: cfg.Eval.Workers,
			PollInterval: cfg.Eval.PollInterval.Duration, Timeout: cfg.Eval.Timeout.Duration,
			MaxAttrs: cfg.Eval.MaxAttrs, MaxDerivations: cfg.Eval.MaxDerivations,
			MaxRetention: cfg.Retention.Max.Duration,
			Gate:         &n.inFlight, Notifier: notifier, Upstream: up, Registerer: n.reg,
			HelpOthers: cfg.Eval.HelpOthers, DeadThreshold: cfg.Cluster.Heartbeat.DeadThreshold.Duration,
			Runner: &eval.NixRunner{SplitAbove: cfg.Eval.SplitAbove},
			Confinement: eval.Confinement{
				User: cfg.Eval.User, MaxMemory: cfg.Eval.TotalMemory(),
				MaxMemoryPerWorker: int64(cfg.Eval.MaxMemoryPerWorker),
				Unsandboxed:        !cfg.Build.Sandbox, BuildUsersGroup: cfg.Build.BuildUsersGroup,
				SandboxPaths: cfg.Build.ExtraSandboxPaths,
			},
			MaxRetries: cfg.Build.MaxRetries, MaxRetryBackoff: cfg.Build.MaxRetryBackoff.Duration,
		}
		if ecfg.Order, err = queue.ParseOrder(cfg.Queue.Order); err != nil {
			return nil, err
		}
		if client != nil {
			ecfg.Cache = client
			ecfg.Publisher = &upload.Publisher{Signer: client}
			ecfg.Tickets = client
		} else {
			n.logger.Warn("evaluator without a node token: .drv closures are not published to the cache and outputs are not looked up there (set auth.node_token_file)")
		}
		ev, err := eval.New(ecfg, n.pool, n.logger, n.clock)
		if err != nil {
			return nil, err
		}
		n.evaluator = ev
		workers = append(workers, ev)
	}
	return workers, nil
}

// cacheVisibility is the cache role's check of private paths: the admin token and cache tokens
// always; node tokens with the cluster secret where the node holds it (a cache beside a
// signer), else through a signer, with the cache node's own token.
func cacheVisibility(cfg *config.Config, pool *pgxpool.Pool, logger *slog.Logger) (*cache.Visibility, error) {
	vis := &cache.Visibility{DB: pool}
	if cfg.Auth.AdminToken != "" {
		h := httpapi.HashToken(cfg.Auth.AdminToken)
		vis.Admin = &h
	}
	if cfg.Auth.ClusterSecret != "" {
		key, err := nodetoken.NewKey(cfg.Auth.ClusterSecret)
		if err != nil {
			return nil, fmt.Errorf("auth.cluster_secret_file: %w", err)
		}
		vis.Nodes = key
		return vis, nil
	}
	// No cluster secret: a signer verifies node tokens for this cache, with its own token.
	token, err := nodeToken(cfg)
	if err != nil {
		return nil, err
	}
	if token == "" {
		logger.Warn("the cache role without the cluster secret or a node token verifies no node token: builders read private projects' paths from other caches only (set auth.node_token_file)")
		return vis, nil
	}
	signers := signerclient.New(signerclient.Config{Token: token, DeadThreshold: cfg.Cluster.Heartbeat.DeadThreshold.Duration,
		GiveUpAfter: nodeCheckGiveUp}, pool, logger)
	vis.CheckNode = func(ctx context.Context, t string) (bool, error) {
		_, err := signers.CheckNodeToken(ctx, t)
		var se *signerclient.StatusError
		if errors.As(err, &se) && se.Code == http.StatusForbidden {
			return false, nil
		}
		return err == nil, err
	}
	return vis, nil
}

// nodeCheckGiveUp bounds a cache request's wait for a signer to check a node token: the
// builder asking retries a transient failure on its own.
const nodeCheckGiveUp = 10 * time.Second
