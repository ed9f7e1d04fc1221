// Package config loads harmonia-ci's configuration: built-in defaults, then a TOML file,
// then environment variables, then command-line flags, validated once at start.
//
// example.toml in this directory is the annotated reference of every key.
package config

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/slots"
)

// Roles a node can run.
const (
	RoleFrontend  = "frontend"
	RoleEvaluator = "evaluator"
	RoleSigner    = "signer"
	RoleCache     = "cache"
	RoleBuilder   = "builder"
)

// AllRoles lists every role, in this order: frontend, evaluator, signer, cache, builder.
func AllRoles() []string {
	return []string{RoleFrontend, RoleEvaluator, RoleSigner, RoleCache, RoleBuilder}
}

// DefaultFile is read when --config is not given and the file exists in the working directory.
const DefaultFile = "harmonia-ci.toml"

// Config is the whole configuration of one node.
type Config struct {
	DatabaseURL string `toml:"database_url"` // empty: embedded PostgreSQL in StateDir
	StateDir    string `toml:"state_dir"`
	Listen      string `toml:"listen"`     // HTTP listen address, host:port
	LogLevel    string `toml:"log_level"`  // debug|info|warn|error
	LogFormat   string `toml:"log_format"` // text|json

	Node    NodeConfig    `toml:"node"`
	Auth    AuthConfig    `toml:"auth"`
	Build   BuildConfig   `toml:"build"`
	Cluster ClusterConfig `toml:"cluster"`
	Queue   QueueConfig   `toml:"queue"`
	Cache   CacheConfig   `toml:"cache"`
	Signer  SignerConfig  `toml:"signer"`
	Eval    EvalConfig    `toml:"eval"`

	Substituters SubstitutersConfig `toml:"substituters"`
	Frontend     FrontendConfig     `toml:"frontend"`
	Retention    RetentionConfig    `toml:"retention"`
	Forges       []ForgeConfig      `toml:"forges"`

	// Source is the path of the file that was read, "" if none. Not a TOML key.
	Source string `toml:"-"`
}

// NodeConfig describes this node: who it is and what it does.
type NodeConfig struct {
	ID       string   `toml:"id"`
	Roles    []string `toml:"roles"`
	Endpoint string   `toml:"endpoint"` // "" means derived at run time from the listen address
	Systems  []string `toml:"systems"`  // Nix system types, e.g. "x86_64-linux"
	Features []string `toml:"features"` // Nix system features
	MaxJobs  int      `toml:"max_jobs"`
	MaxEvals int      `toml:"max_evals"`
}

// AuthConfig names the files holding the secrets nodes authenticate with; Load fills them in.
type AuthConfig struct {
	AdminTokenFile    string `toml:"admin_token_file"`    // admin API bearer token
	ClusterSecretFile string `toml:"cluster_secret_file"` // signers: the secret node tokens are derived from
	NodeTokenFile     string `toml:"node_token_file"`     // this node's token (harmonia-ci node-token)
	// SecretFile holds the key web UI login cookies are signed with (HMAC-SHA256); every
	// frontend needs the same one, and changing it logs everyone out.
	SecretFile string `toml:"secret_file"`
	// Admins may do anything in the web UI, as "forge:login" ("gitea:alice"). Frontends bind
	// each to the forge user id that has the login when they first resolve it, and compare
	// ids: a renamed admin stops being one, and the login's next holder does not become one.
	Admins []string `toml:"admins"`

	// Filled by Load from the files above or from HARMONIA_ADMIN_TOKEN, HARMONIA_CLUSTER_SECRET,
	// HARMONIA_NODE_TOKEN and HARMONIA_AUTH_SECRET (env wins). Never printed: see String.
	AdminToken    string `toml:"-" json:"-"`
	ClusterSecret string `toml:"-" json:"-"`
	NodeToken     string `toml:"-" json:"-"`
	Secret        string `toml:"-" json:"-"`
}

// MinAuthSecret is the shortest [auth] secret accepted.
const MinAuthSecret = 32

// String redacts the secrets so that logging a Config (%v, %+v, slog) cannot leak them.
func (a AuthConfig) String() string {
	return fmt.Sprintf("{AdminTokenFile:%s ClusterSecretFile:%s NodeTokenFile:%s SecretFile:%s Admins:%v AdminToken:%s ClusterSecret:%s NodeToken:%s Secret:%s}",
		a.AdminTokenFile, a.ClusterSecretFile, a.NodeTokenFile, a.SecretFile, a.Admins, redact(a.AdminToken), redact(a.ClusterSecret), redact(a.NodeToken), redact(a.Secret))
}

// GoString redacts the secrets for %#v too.
func (a AuthConfig) GoString() string {
	return fmt.Sprintf("config.AuthConfig{AdminTokenFile:%q, ClusterSecretFile:%q, NodeTokenFile:%q, SecretFile:%q, Admins:%q, AdminToken:%q, ClusterSecret:%q, NodeToken:%q, Secret:%q}",
		a.AdminTokenFile, a.ClusterSecretFile, a.NodeTokenFile, a.SecretFile, a.Admins, redact(a.AdminToken), redact(a.ClusterSecret), redact(a.NodeToken), redact(a.Secret))
}

func redact(token string) string {
	if token == "" {
		return ""
	}
	return "[redacted]"
}

// BuildConfig limits individual builds.
type BuildConfig struct {
	Timeout       Duration `toml:"timeout"`
	MaxSilent     Duration `toml:"max_silent"` // without log output
	MaxOutputSize ByteSize `toml:"max_output_size"`
	MaxLogSize    ByteSize `toml:"max_log_size"`
	// NixStore is the Nix store builds run in: "" for the system store, or a chroot store
	// directory (absolute), so several builders can share a machine.
	NixStore string `toml:"nix_store"`
	// Daemon is the socket of an existing nix-daemon to build through (a NixOS host's
	// /nix/var/nix/daemon-socket/socket); "" starts the builder's own daemons. The daemon's
	// own settings then hold for sandboxing, build users and sandbox paths.
	Daemon string `toml:"daemon"`
	// ExtraSandboxPaths are host paths sandboxed builds may use, besides /bin/sh and the system
	// libraries.
	ExtraSandboxPaths []string `toml:"extra_sandbox_paths"`
	// Sandbox runs builds in Nix's sandbox as build users. Only an operator who trusts every
	// project turns it off.
	Sandbox bool `toml:"sandbox"`
	// BuildUsersGroup is the group of the Nix build users sandboxed builds in the system store
	// run as.
	BuildUsersGroup string `toml:"build_users_group"`

	// MinFree and MaxFree bound the builder's store like Nix's min-free/max-free: when the free
	// space of its file system falls below MinFree, the builder collects the garbage no
	// running job roots until MaxFree is free. MinFree 0 turns this off.
	MinFree ByteSize `toml:"min_free"`
	MaxFree ByteSize `toml:"max_free"`

	// Nice is the nice value (0–19) of the Nix daemons the builder starts, which their builds
	// inherit, so that the node's own work is not queued behind its builds.
	Nice int `toml:"nice"`
	// Cgroup is a cgroup directory (with the cpu controller) for the Nix daemons the builder
	// starts and their builds, given a low CPU weight; "" for none.
	Cgroup string `toml:"cgroup"`

	// MaxRetries and MaxRetryBackoff cap what a project's .harmonia-ci.toml [retry] may ask
	// for: build failures retried and the wait before each retry. Applied by evaluator nodes,
	// which record a job's policy when an evaluation needs it. MaxRetries 0: no retries.
	MaxRetries      int      `toml:"max_retries"`
	MaxRetryBackoff Duration `toml:"max_retry_backoff"`
}

// ClusterConfig tunes how nodes find each other and agree on a leader.
type ClusterConfig struct {
	Heartbeat      HeartbeatConfig      `toml:"heartbeat"`
	LeaderElection LeaderElectionConfig `toml:"leader_election"`
	Shutdown       ShutdownConfig       `toml:"shutdown"`
}

// HeartbeatConfig controls liveness tracking of nodes.
type HeartbeatConfig struct {
	Interval      Duration `toml:"interval"`
	DeadThreshold Duration `toml:"dead_threshold"` // silence after which a node counts as dead
	DeadRetention Duration `toml:"dead_retention"` // how long dead node rows are kept
}

// LeaderElectionConfig controls the leader lease.
type LeaderElectionConfig struct {
	CheckInterval   Duration `toml:"check_interval"`
	LeaseDuration   Duration `toml:"lease_duration"`
	RefreshInterval Duration `toml:"refresh_interval"`
}

// ShutdownConfig controls graceful shutdown.
type ShutdownConfig struct {
	DrainTimeout Duration `toml:"drain_timeout"` // 0: do not wait for in-flight work
}

// QueueConfig tunes the build queue: wake-up polling and the leader's maintenance.
type QueueConfig struct {
	PollInterval           Duration `toml:"poll_interval"`            // claim at least this often without a wake-up
	ReapInterval           Duration `toml:"reap_interval"`            // dead-node reaper
	UnsupportedInterval    Duration `toml:"unsupported_interval"`     // unsupported-build check
	UnsupportedGrace       Duration `toml:"unsupported_grace"`        // wait before failing an unsupported build
	ShareDecayInterval     Duration `toml:"share_decay_interval"`     // consumed_seconds *= 0.95 this often
	ReadinessAuditInterval Duration `toml:"readiness_audit_interval"` // check the maintained readiness counts
	// Order ranks a project's ready jobs of equal priority: OrderCriticalPath or OrderFIFO.
	Order string `toml:"order"`
}

// The orders of queue.order.
const (
	// OrderCriticalPath builds first the job with the longest chain of dependents still to build.
	OrderCriticalPath = "critical-path"
	// OrderFIFO builds first the job enqueued first.
	OrderFIFO = "fifo"
)

// CacheConfig chooses the blob store that holds the binary cache.
type CacheConfig struct {
	Store    string `toml:"store"`    // local or s3
	Dir      string `toml:"dir"`      // local: "" means STATE_DIR/cache
	Priority int    `toml:"priority"` // nix-cache-info Priority
	// NarinfoMemory bounds the narinfos a cache node keeps in memory (0 keeps none).
	NarinfoMemory ByteSize `toml:"narinfo_memory"`
	// PublicURL is where Nix clients reach the binary cache (a load balancer in front of the
	// cache nodes), shown in the web UI's substituter snippets. Default: the cache nodes'
	// endpoints.
	PublicURL string   `toml:"public_url"`
	S3        S3Config `toml:"s3"`
}

// S3Config addresses an S3-compatible bucket. Credentials come from files or the environment.
type S3Config struct {
	Endpoint      string `toml:"endpoint"` // host:port
	Region        string `toml:"region"`
	Bucket        string `toml:"bucket"`
	UseTLS        bool   `toml:"use_tls"`
	PathStyle     bool   `toml:"path_style"`
	AccessKeyFile string `toml:"access_key_file"`
	SecretKeyFile string `toml:"secret_key_file"`

	// Filled by Load from the files above or HARMONIA_S3_ACCESS_KEY / HARMONIA_S3_SECRET_KEY.
	AccessKey string `toml:"-" json:"-"`
	SecretKey string `toml:"-" json:"-"`
}

// String redacts the credentials.
func (s S3Config) String() string {
	return fmt.Sprintf("{Endpoint:%s Region:%s Bucket:%s UseTLS:%v PathStyle:%v AccessKey:%s SecretKey:%s}",
		s.Endpoint, s.Region, s.Bucket, s.UseTLS, s.PathStyle, redact(s.AccessKey), redact(s.SecretKey))
}

// GoString redacts the credentials for %#v too.
func (s S3Config) GoString() string { return "config.S3Config" + s.String() }

// SignerConfig configures the signer role.
type SignerConfig struct {
	SigningKeyFile string   `toml:"signing_key_file"` // Nix secret key (harmonia-ci keygen)
	URLExpiry      Duration `toml:"url_expiry"`       // lifetime of presigned upload URLs
}

// DefaultEvalWorkers is half the machine's cores, at least one: each walker's records cost
// the node's ingestion and PostgreSQL about as much CPU again as the walk (measured with
// bench eval --shape packages), and every walker re-evaluates the dependencies its part of the
// tree shares with the others.
func DefaultEvalWorkers() int { return max(1, runtime.NumCPU()/2) }

// EvalConfig configures the evaluator role.
type EvalConfig struct {
	Timeout Duration `toml:"timeout"` // one evaluation, and the ceiling of .harmonia-ci.toml's eval-timeout
	// Workers is how many walker processes one evaluation runs at once; default
	// DefaultEvalWorkers.
	Workers int `toml:"workers"`
	// MaxMemory is the resident memory of one evaluation's Nix processes together, its workers
	// and imports-from-derivation included; default (0) workers × max_memory_per_worker.
	MaxMemory ByteSize `toml:"max_memory"`
	// MaxMemoryPerWorker is the resident memory of one walker process; past it the walker is
	// restarted and the attribute it was on retried alone.
	MaxMemoryPerWorker ByteSize `toml:"max_memory_per_worker"`
	// MaxAttrs and MaxDerivations bound what one evaluation may cost: the attributes it reports
	// and the derivations it adds (each lands in PostgreSQL and the cache). A project cannot
	// raise them.
	MaxAttrs       int      `toml:"max_attrs"`
	MaxDerivations int      `toml:"max_derivations"`
	PollInterval   Duration `toml:"poll_interval"` // look for queued evaluations at least this often
	// User is the unprivileged user Nix evaluates projects as when the node runs as root.
	User string `toml:"user"`
	// HelpOthers: when no evaluation is queued, a free slot walks units of a large evaluation
	// another evaluator node runs.
	HelpOthers bool `toml:"help_others"`
	// SplitAbove: a set with more children than this is cut into units other workers and
	// nodes may walk; 0 is the built-in threshold (1000).
	SplitAbove int `toml:"split_above"`
}

// RetentionConfig says how long evaluations, their builds and cache objects, and logs are
// kept, and how often the garbage collector runs.
type RetentionConfig struct {
	Default      Duration `toml:"default"`       // evaluations; a project's .harmonia-ci.toml may say otherwise
	Max          Duration `toml:"max"`           // the most a project's .harmonia-ci.toml may ask for
	LogRetention Duration `toml:"log_retention"` // build logs, even of builds that are kept
	GCInterval   Duration `toml:"gc_interval"`   // how often the GC leader collects
	Grace        Duration `toml:"grace"`         // cache objects younger than this are never deleted
}

// SubstitutersConfig names the upstream binary caches whose contents need no build job and
// which builders substitute from.
type SubstitutersConfig struct {
	URLs              []string `toml:"urls"`                // http(s) binary cache URLs
	TrustedPublicKeys []string `toml:"trusted_public_keys"` // "name:base64" keys their narinfos must be signed with
}

// Seams for tests, which must not depend on the host.
var (
	hostname = os.Hostname
	geteuid  = os.Geteuid
	// defaultFileDir is where DefaultFile is looked up; "" is the working directory.
	defaultFileDir = ""
)

// Default returns the built-in defaults. They depend on the host (hostname,
// architecture, user), so Default is a function rather than a literal.
func Default() *Config {
	return defaults(os.Getenv)
}

func defaults(getenv func(string) string) *Config {
	id, _ := hostname() // on failure Validate reports the empty node.id
	return &Config{
		StateDir:  defaultStateDir(getenv),
		Listen:    "127.0.0.1:7777",
		LogLevel:  "info",
		LogFormat: "text",
		Node: NodeConfig{
			ID:       id,
			Roles:    AllRoles(),
			Systems:  []string{runtimeSystem()},
			Features: []string{},
			MaxJobs:  4,
			MaxEvals: 1,
		},
		Build: BuildConfig{
			Timeout:           Duration{4 * time.Hour},
			MaxSilent:         Duration{30 * time.Minute},
			MaxOutputSize:     4 * sizeGB,
			MaxLogSize:        64 * sizeMB,
			ExtraSandboxPaths: []string{},
			Sandbox:           true,
			BuildUsersGroup:   "nixbld",
			MinFree:           2 * sizeGiB,
			MaxFree:           10 * sizeGiB,
			Nice:              10,
			MaxRetries:        3,
			MaxRetryBackoff:   Duration{time.Hour},
		},
		Cluster: ClusterConfig{
			Heartbeat: HeartbeatConfig{
				Interval:      Duration{cluster.DefaultHeartbeatInterval},
				DeadThreshold: Duration{cluster.DefaultDeadThreshold},
				DeadRetention: Duration{24 * time.Hour},
			},
			LeaderElection: LeaderElectionConfig{
				CheckInterval:   Duration{cluster.DefaultElectionCheck},
				LeaseDuration:   Duration{cluster.DefaultLease},
				RefreshInterval: Duration{cluster.DefaultLease / 3},
			},
			Shutdown: ShutdownConfig{
				DrainTimeout: Duration{5 * time.Minute},
			},
		},
		Cache: CacheConfig{Store: "local", Priority: 30, NarinfoMemory: 64 * sizeMiB,
			S3: S3Config{Region: "us-east-1", UseTLS: true}},
		Signer: SignerConfig{URLExpiry: Duration{15 * time.Minute}},
		Eval: EvalConfig{Timeout: Duration{time.Hour}, Workers: DefaultEvalWorkers(), MaxMemoryPerWorker: 4 * sizeGiB,
			HelpOthers:   true,
			PollInterval: Duration{slots.DefaultPollInterval},
			MaxAttrs:     500_000, MaxDerivations: 1_000_000, User: "harmonia-eval"},
		Substituters: SubstitutersConfig{
			URLs:              []string{},
			TrustedPublicKeys: []string{},
		},
		Frontend: frontendDefaults(),
		Retention: RetentionConfig{Default: Duration{90 * 24 * time.Hour}, Max: Duration{365 * 24 * time.Hour}, LogRetention: Duration{30 * 24 * time.Hour},
			GCInterval: Duration{24 * time.Hour}, Grace: Duration{24 * time.Hour}},
		Forges: []ForgeConfig{},
		Queue: QueueConfig{
			PollInterval:           Duration{slots.DefaultPollInterval},
			ReapInterval:           Duration{30 * time.Second},
			UnsupportedInterval:    Duration{5 * time.Minute},
			UnsupportedGrace:       Duration{30 * time.Minute},
			ShareDecayInterval:     Duration{time.Hour},
			ReadinessAuditInterval: Duration{10 * time.Minute},
			Order:                  OrderCriticalPath,
		},
	}
}

// defaultStateDir follows the XDG base directory spec for users and the FHS for root.
// It returns "" when no home is known, which Validate reports.
func defaultStateDir(getenv func(string) string) string {
	if geteuid() == 0 {
		return "/var/lib/harmonia-ci"
	}
	// The spec says relative XDG paths are invalid and must be ignored.
	if x := getenv("XDG_STATE_HOME"); filepath.IsAbs(x) {
		return filepath.Join(x, "harmonia-ci")
	}
	if home := getenv("HOME"); home != "" {
		return filepath.Join(home, ".local", "state", "harmonia-ci")
	}
	return ""
}

// runtimeSystem is the Nix system type of this binary, e.g. "x86_64-linux".
func runtimeSystem() string {
	arch := runtime.GOARCH
	switch arch {
	case "amd64":
		arch = "x86_64"
	case "arm64":
		arch = "aarch64"
	case "386":
		arch = "i686"
	}
	return arch + "-" + runtime.GOOS
}

// HasRole reports whether the node runs role r.
func (c *Config) HasRole(r string) bool {
	return slices.Contains(c.Node.Roles, r)
}

// TotalMemory is the resident memory one evaluation may use in all: max_memory, or by default
// workers × max_memory_per_worker.
func (c EvalConfig) TotalMemory() int64 {
	if c.MaxMemory > 0 {
		return int64(c.MaxMemory)
	}
	return int64(c.Workers) * int64(c.MaxMemoryPerWorker)
}
