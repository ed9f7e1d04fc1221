package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nodetoken"
)

var (
	nodeIDRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
	systemRE  = regexp.MustCompile(`^[a-z0-9_]+-[a-z0-9_]+$`)
	featureRE = regexp.MustCompile(`^[A-Za-z0-9._+-]+$`)
	userRE    = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)
)

// MaxURLExpiry is the longest a presigned upload URL may stay valid.
const MaxURLExpiry = time.Hour

// MaxRetries is the most build.max_retries may allow: a build that fails eleven times is not
// flaky, and each retry holds a builder.
const MaxRetries = 10

// nodeTokenProblems checks that the node token names this node and covers the roles that use it.
func (c *Config) nodeTokenProblems(add func(key, format string, args ...any)) {
	id, err := nodetoken.Parse(c.Auth.NodeToken)
	if err != nil {
		add("auth.node_token_file", "auth.node_token_file: %v", err)
		return
	}
	if id.NodeID != c.Node.ID {
		add("auth.node_token_file", "auth.node_token_file: the token is node %s's, but this node is %s (issue one with harmonia-ci node-token --node-id %s)", id.NodeID, c.Node.ID, c.Node.ID)
	}
	for _, r := range []string{RoleBuilder, RoleEvaluator} {
		if c.HasRole(r) && !id.Has(r) {
			add("auth.node_token_file", "auth.node_token_file: the token does not allow the %s role this node runs (its roles: %s)", r, strings.Join(id.Roles, ","))
		}
	}
}

// Validate reports every impossible value, one per line (errors.Join), so
// that a user can fix them all in one go. It returns nil if c is usable.
func (c *Config) Validate() error {
	return errors.Join(c.problems(nil)...)
}

// problems lists what is wrong with c. Messages use dotted TOML keys; from
// adds where a value came from when it was not the file.
func (c *Config) problems(from origins) []error {
	var errs []error
	add := func(key, format string, args ...any) {
		msg := fmt.Sprintf("config: "+format, args...)
		if src := from[key]; src != "" {
			msg += " (from " + src + ")"
		}
		errs = append(errs, errors.New(msg))
	}
	positive := func(key string, d Duration) {
		if d.Duration <= 0 {
			add(key, "%s must be positive, got %s", key, d)
		}
	}

	// database_url is not checked: it may be a URL or a key=value DSN, and
	// echoing it back could leak its password.
	if c.StateDir == "" {
		add("state_dir", "state_dir must not be empty (it has no default when HOME is unset)")
	}
	if err := checkListen(c.Listen); err != nil {
		add("listen", "listen: invalid address %q: %v", c.Listen, err)
	}
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, c.LogLevel) {
		add("log_level", "log_level: invalid level %q (want debug, info, warn or error)", c.LogLevel)
	}
	if !slices.Contains([]string{"text", "json"}, c.LogFormat) {
		add("log_format", "log_format: invalid format %q (want text or json)", c.LogFormat)
	}

	n := &c.Node
	if !nodeIDRE.MatchString(n.ID) {
		add("node.id", "node.id: invalid node id %q (letters, digits, '.', '_', '-'; at most 63 characters)", n.ID)
	}
	if len(n.Roles) == 0 {
		add("node.roles", "node.roles must not be empty (known: %s)", strings.Join(AllRoles(), ", "))
	}
	for i, r := range n.Roles {
		switch {
		case !slices.Contains(AllRoles(), r):
			add("node.roles", "node.roles: unknown role %q (known: %s)", r, strings.Join(AllRoles(), ", "))
		case slices.Index(n.Roles, r) < i:
			add("node.roles", "node.roles: duplicate role %q", r)
		}
	}
	if n.Endpoint != "" {
		u, err := url.Parse(n.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			add("node.endpoint", "node.endpoint: invalid URL %q (must be an absolute http or https URL with a host)", n.Endpoint)
		}
	}
	for _, s := range n.Systems {
		if !systemRE.MatchString(s) {
			add("node.systems", "node.systems: invalid system %q (want ARCH-OS, e.g. %q)", s, runtimeSystem())
		}
	}
	for _, f := range n.Features {
		if !featureRE.MatchString(f) {
			add("node.features", "node.features: invalid feature %q (letters, digits, '.', '_', '+', '-')", f)
		}
	}
	if n.MaxJobs < 1 || n.MaxJobs > 1024 {
		add("node.max_jobs", "node.max_jobs must be between 1 and 1024, got %d", n.MaxJobs)
	}
	if n.MaxEvals < 1 || n.MaxEvals > 64 {
		add("node.max_evals", "node.max_evals must be between 1 and 64, got %d", n.MaxEvals)
	}

	b := &c.Build
	positive("build.timeout", b.Timeout)
	positive("build.max_silent", b.MaxSilent)
	if b.Timeout.Duration > 0 && b.MaxSilent.Duration > b.Timeout.Duration {
		add("build.max_silent", "build.max_silent (%s) must be at most build.timeout (%s)", b.MaxSilent, b.Timeout)
	}
	if b.MaxOutputSize <= 0 {
		add("build.max_output_size", "build.max_output_size must be positive, got %s", b.MaxOutputSize)
	}
	if b.MaxLogSize <= 0 {
		add("build.max_log_size", "build.max_log_size must be positive, got %s", b.MaxLogSize)
	}

	if b.MinFree < 0 {
		add("build.min_free", "build.min_free must not be negative, got %s", b.MinFree)
	}
	if b.MinFree > 0 && b.MaxFree < b.MinFree {
		add("build.max_free", "build.max_free (%s) must be at least build.min_free (%s)", b.MaxFree, b.MinFree)
	}
	if b.Nice < 0 || b.Nice > 19 {
		add("build.nice", "build.nice must be between 0 and 19, got %d", b.Nice)
	}
	if b.Cgroup != "" && !filepath.IsAbs(b.Cgroup) {
		add("build.cgroup", "build.cgroup must be an absolute path, got %q", b.Cgroup)
	}

	r := &c.Retention
	positive("retention.default", r.Default)
	if r.Max.Duration < r.Default.Duration {
		add("retention.max", "retention.max (%s) must be at least retention.default (%s)", r.Max, r.Default)
	}
	positive("retention.log_retention", r.LogRetention)
	positive("retention.gc_interval", r.GCInterval)
	positive("retention.grace", r.Grace)

	h := &c.Cluster.Heartbeat
	positive("cluster.heartbeat.interval", h.Interval)
	if h.Interval.Duration > 0 && h.DeadThreshold.Duration < 2*h.Interval.Duration {
		add("cluster.heartbeat.dead_threshold", "cluster.heartbeat.dead_threshold (%s) must be at least twice heartbeat.interval (%s)", h.DeadThreshold, h.Interval)
	} else {
		positive("cluster.heartbeat.dead_threshold", h.DeadThreshold)
	}
	positive("cluster.heartbeat.dead_retention", h.DeadRetention)

	le := &c.Cluster.LeaderElection
	positive("cluster.leader_election.check_interval", le.CheckInterval)
	positive("cluster.leader_election.lease_duration", le.LeaseDuration)
	positive("cluster.leader_election.refresh_interval", le.RefreshInterval)
	// A holder refreshing at most every lease/3 survives two lost refreshes.
	if limit := le.LeaseDuration.Duration / 3; le.LeaseDuration.Duration > 0 && le.RefreshInterval.Duration > limit {
		add("cluster.leader_election.refresh_interval", "cluster.leader_election.refresh_interval (%s) must be at most lease_duration/3 (%s)", le.RefreshInterval, Duration{limit})
	}

	q := &c.Queue
	positive("queue.poll_interval", q.PollInterval)
	positive("queue.reap_interval", q.ReapInterval)
	positive("queue.unsupported_interval", q.UnsupportedInterval)
	if q.UnsupportedGrace.Duration < 0 {
		add("queue.unsupported_grace", "queue.unsupported_grace must not be negative, got %s", q.UnsupportedGrace)
	}
	positive("queue.share_decay_interval", q.ShareDecayInterval)
	positive("queue.readiness_audit_interval", q.ReadinessAuditInterval)
	if q.Order != OrderCriticalPath && q.Order != OrderFIFO {
		add("queue.order", "queue.order must be %q or %q, got %q", OrderCriticalPath, OrderFIFO, q.Order)
	}
	switch c.Cache.Store {
	case "local":
	case "s3":
		s3 := &c.Cache.S3
		if s3.Endpoint == "" {
			add("cache.s3.endpoint", "cache.s3.endpoint is required with cache.store = \"s3\"")
		} else if _, _, err := net.SplitHostPort(s3.Endpoint); err != nil {
			add("cache.s3.endpoint", "cache.s3.endpoint: want host:port, got %q", s3.Endpoint)
		}
		if s3.Bucket == "" {
			add("cache.s3.bucket", "cache.s3.bucket is required with cache.store = \"s3\"")
		}
		if s3.AccessKey == "" || s3.SecretKey == "" {
			add("cache.s3.access_key_file", "cache.s3: credentials are required with cache.store = \"s3\" (cache.s3.access_key_file and secret_key_file, or HARMONIA_S3_ACCESS_KEY and HARMONIA_S3_SECRET_KEY)")
		}
	default:
		add("cache.store", "cache.store: want local or s3, got %q", c.Cache.Store)
	}
	if c.Cache.NarinfoMemory < 0 {
		add("cache.narinfo_memory", "cache.narinfo_memory must not be negative, got %d", c.Cache.NarinfoMemory)
	}
	if pu := c.Cache.PublicURL; pu != "" {
		if u, err := url.Parse(pu); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" {
			add("cache.public_url", "cache.public_url: invalid URL %q (an absolute http or https URL)", pu)
		}
	}
	if c.Cache.Priority < 0 {
		add("cache.priority", "cache.priority must not be negative, got %d", c.Cache.Priority)
	}
	positive("signer.url_expiry", c.Signer.URLExpiry)
	if c.Signer.URLExpiry.Duration > MaxURLExpiry {
		add("signer.url_expiry", "signer.url_expiry (%s) must be at most %s: a leaked upload URL is good until it expires", c.Signer.URLExpiry, Duration{MaxURLExpiry})
	}
	if c.Build.MaxRetries < 0 || c.Build.MaxRetries > MaxRetries {
		add("build.max_retries", "build.max_retries must be between 0 and %d, got %d", MaxRetries, c.Build.MaxRetries)
	}
	if c.Build.MaxRetryBackoff.Duration < 0 {
		add("build.max_retry_backoff", "build.max_retry_backoff must not be negative, got %s", c.Build.MaxRetryBackoff)
	}
	if c.Build.NixStore != "" && !filepath.IsAbs(c.Build.NixStore) {
		add("build.nix_store", "build.nix_store: want an absolute directory, got %q", c.Build.NixStore)
	}
	if d := c.Build.Daemon; d != "" {
		// What the builder would set on daemons of its own is the daemon's nix.conf's to say.
		switch {
		case !filepath.IsAbs(d):
			add("build.daemon", "build.daemon: want the absolute path of a nix-daemon socket, got %q", d)
		case c.Build.NixStore != "":
			add("build.daemon", "build.daemon and build.nix_store exclude each other: a daemon serves its own store")
		case !c.Build.Sandbox:
			add("build.sandbox", "build.sandbox = false has no effect with build.daemon: set sandbox in the daemon's nix.conf")
		case len(c.Build.ExtraSandboxPaths) > 0:
			add("build.extra_sandbox_paths", "build.extra_sandbox_paths has no effect with build.daemon: set extra-sandbox-paths in the daemon's nix.conf")
		case c.Build.Cgroup != "":
			add("build.cgroup", "build.cgroup has no effect with build.daemon: the daemon's builds run where the daemon runs")
		}
	}
	for i, p := range c.Build.ExtraSandboxPaths {
		if !filepath.IsAbs(p) || strings.ContainsAny(p, " \t\n=") {
			add("build.extra_sandbox_paths", "build.extra_sandbox_paths[%d]: want an absolute path without spaces or '=', got %q", i, p)
		}
	}
	positive("eval.timeout", c.Eval.Timeout)
	if c.Eval.Workers < 1 {
		add("eval.workers", "eval.workers must be at least 1, got %d", c.Eval.Workers)
	}
	if c.Eval.MaxMemory < 0 {
		add("eval.max_memory", "eval.max_memory must be positive (or 0: eval.workers × eval.max_memory_per_worker), got %s", c.Eval.MaxMemory)
	}
	if c.Eval.SplitAbove < 0 {
		add("eval.split_above", "eval.split_above must not be negative, got %d", c.Eval.SplitAbove)
	}
	if c.Eval.MaxMemoryPerWorker <= 0 {
		add("eval.max_memory_per_worker", "eval.max_memory_per_worker must be positive, got %s", c.Eval.MaxMemoryPerWorker)
	}
	if c.Eval.MaxAttrs <= 0 {
		add("eval.max_attrs", "eval.max_attrs must be positive, got %d", c.Eval.MaxAttrs)
	}
	if c.Eval.MaxDerivations <= 0 {
		add("eval.max_derivations", "eval.max_derivations must be positive, got %d", c.Eval.MaxDerivations)
	}
	if !userRE.MatchString(c.Eval.User) {
		add("eval.user", "eval.user: invalid user name %q", c.Eval.User)
	}
	if c.Build.Sandbox && !userRE.MatchString(c.Build.BuildUsersGroup) {
		add("build.build_users_group", "build.build_users_group: invalid group name %q", c.Build.BuildUsersGroup)
	}
	if c.Auth.NodeToken != "" {
		c.nodeTokenProblems(add)
	}
	positive("eval.poll_interval", c.Eval.PollInterval)
	for i, u := range c.Substituters.URLs {
		if pu, err := url.Parse(u); err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			add("substituters.urls", "substituters.urls[%d]: want an http or https URL, got %q", i, u)
		}
	}
	for i, k := range c.Substituters.TrustedPublicKeys {
		if _, err := nix.ParsePublicKey(k); err != nil {
			add("substituters.trusted_public_keys", "substituters.trusted_public_keys[%d]: %v", i, err)
		}
	}
	if len(c.Substituters.URLs) > 0 && len(c.Substituters.TrustedPublicKeys) == 0 {
		add("substituters.trusted_public_keys", "substituters.trusted_public_keys: required with substituters.urls (their narinfos must be signed by a trusted key)")
	}
	if d := c.Cluster.Shutdown.DrainTimeout; d.Duration < 0 {
		add("cluster.shutdown.drain_timeout", "cluster.shutdown.drain_timeout must not be negative, got %s", d)
	}
	c.forgeProblems(add)
	return errs
}

func checkListen(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		// The bare reason: net's message repeats the address.
		var ae *net.AddrError
		if errors.As(err, &ae) {
			return errors.New(ae.Err)
		}
		return err
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("port %q must be a number between 0 and 65535", port)
	}
	return nil
}
