package config

import (
	"github.com/harmonia-ci/harmonia-ci/internal/nodetoken"

	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

// setup pins the host-dependent seams, so tests never see the real host,
// user or working directory. It returns the directory standing in for the
// working directory. Tests using it must not run in parallel.
func setup(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	oldHost, oldEUID, oldDir := hostname, geteuid, defaultFileDir
	hostname = func() (string, error) { return "testhost", nil }
	geteuid = func() int { return 1000 }
	defaultFileDir = dir
	t.Cleanup(func() { hostname, geteuid, defaultFileDir = oldHost, oldEUID, oldDir })
	return dir
}

// fakeEnv is a getenv over m, with a HOME so that state_dir has a default.
func fakeEnv(m map[string]string) func(string) string {
	return func(k string) string {
		if v, ok := m[k]; ok {
			return v
		}
		if k == "HOME" {
			return "/home/test"
		}
		return ""
	}
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// loadText loads content as an explicit --config file on top of o.
func loadText(t *testing.T, content string, env map[string]string, o Overrides) (*Config, error) {
	t.Helper()
	o.ConfigFile = writeFile(t, t.TempDir(), "config.toml", content)
	return Load(o, fakeEnv(env))
}

func ptr(s string) *string { return &s }

func wantErr(t *testing.T, err error, substrs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one containing %q", substrs)
	}
	for _, s := range substrs {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not contain %q", err, s)
		}
	}
}

func d(s string) Duration {
	v, err := parseDuration(s)
	if err != nil {
		panic(err)
	}
	return v
}

func TestDefaults(t *testing.T) {
	setup(t)
	c := defaults(fakeEnv(nil))
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	if c.Node.ID != "testhost" || c.StateDir != "/home/test/.local/state/harmonia-ci" {
		t.Errorf("node.id %q, state_dir %q", c.Node.ID, c.StateDir)
	}
	if !reflect.DeepEqual(c.Node.Roles, AllRoles()) || !reflect.DeepEqual(c.Node.Systems, []string{runtimeSystem()}) {
		t.Errorf("roles %v, systems %v", c.Node.Roles, c.Node.Systems)
	}
	if c.Build.MaxOutputSize != 4_000_000_000 || c.Build.MaxLogSize != 64_000_000 {
		t.Errorf("sizes %d, %d", c.Build.MaxOutputSize, c.Build.MaxLogSize)
	}
}

func TestRuntimeSystem(t *testing.T) {
	if s := runtimeSystem(); !systemRE.MatchString(s) || strings.Contains(s, "amd64") {
		t.Errorf("runtimeSystem() = %q", s)
	}
}

func TestDefaultStateDir(t *testing.T) {
	setup(t)
	tests := []struct {
		name string
		root bool
		env  map[string]string
		want string
	}{
		{"root", true, map[string]string{"XDG_STATE_HOME": "/x"}, "/var/lib/harmonia-ci"},
		{"xdg", false, map[string]string{"XDG_STATE_HOME": "/x/state"}, "/x/state/harmonia-ci"},
		{"relative xdg ignored", false, map[string]string{"XDG_STATE_HOME": "state", "HOME": "/h"}, "/h/.local/state/harmonia-ci"},
		{"home", false, map[string]string{"HOME": "/h"}, "/h/.local/state/harmonia-ci"},
		{"nothing", false, map[string]string{"HOME": ""}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			geteuid = func() int {
				if tt.root {
					return 0
				}
				return 1000
			}
			if got := defaultStateDir(fakeEnv(tt.env)); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestLoadFullFile(t *testing.T) {
	setup(t)
	dir := t.TempDir()
	writeFile(t, dir, "admin.token", "admin-secret\n")
	writeFile(t, dir, "cluster.token", "cluster-secret\n")
	writeFile(t, dir, "gitea.token", "gitea-token\n")
	writeFile(t, dir, "gitea.secret", "hook-secret\n")
	path := writeFile(t, dir, "full.toml", `
database_url = "postgres://db/ci"
state_dir = "/srv/ci"
listen = "[::]:8080"
log_level = "debug"
log_format = "json"

[node]
id = "node-7.example"
roles = ["builder", "cache"]
endpoint = "https://node-7.example:8080"
systems = ["x86_64-linux", "aarch64-linux"]
features = ["kvm", "big-parallel"]
max_jobs = 16
max_evals = 2

[auth]
admin_token_file = "admin.token"
cluster_secret_file = "`+filepath.Join(dir, "cluster.token")+`"

[build]
timeout = "2h"
max_silent = "10m"
max_output_size = "10 GiB"
max_log_size = 1048576
nix_store = "/srv/ci/store"
extra_sandbox_paths = ["/bin/sleep"]
nice = 5
max_retries = 5
max_retry_backoff = "10m"

[cluster.heartbeat]
interval = "10s"
dead_threshold = "1m"
dead_retention = "7d"

[cluster.leader_election]
check_interval = "2s"
lease_duration = "30s"
refresh_interval = "10s"

[cluster.shutdown]
drain_timeout = "0s"

[queue]
poll_interval = "1s"
reap_interval = "10s"
unsupported_interval = "1m"
unsupported_grace = "0s"
share_decay_interval = "30m"
readiness_audit_interval = "1h"
order = "fifo"

[eval]
timeout = "20m"
workers = 3
max_memory = "4GiB"
max_memory_per_worker = "1GiB"
poll_interval = "2s"
max_attrs = 1000
max_derivations = 5000

[substituters]
urls = ["https://cache.example.org"]
trusted_public_keys = ["cache.example.org-1:6NCHdD59X431o0gWypbMrAURkbJ16ZPMQFGspcDShjY="]

[frontend]
public_url = "https://ci.example.org"
status_debounce = "1s"

[[forges]]
name = "gitea"
type = "gitea"
url = "https://gitea.example.org"
token_file = "gitea.token"
webhook_secret_file = "gitea.secret"

[[forges]]
name = "gh-enterprise"
type = "github"
url = "https://github.example.org"
api_url = "https://github.example.org/api/v3"
app_id = 42
private_key_file = "app.pem"
`)
	got, err := Load(Overrides{ConfigFile: path}, fakeEnv(map[string]string{
		"HARMONIA_FORGE_GH_ENTERPRISE_PRIVATE_KEY":    "pem",
		"HARMONIA_FORGE_GH_ENTERPRISE_WEBHOOK_SECRET": "gh-secret",
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		DatabaseURL: "postgres://db/ci",
		StateDir:    "/srv/ci",
		Listen:      "[::]:8080",
		LogLevel:    "debug",
		LogFormat:   "json",
		Node: NodeConfig{
			ID:       "node-7.example",
			Roles:    []string{"builder", "cache"},
			Endpoint: "https://node-7.example:8080",
			Systems:  []string{"x86_64-linux", "aarch64-linux"},
			Features: []string{"kvm", "big-parallel"},
			MaxJobs:  16,
			MaxEvals: 2,
		},
		Auth: AuthConfig{
			AdminTokenFile:    "admin.token",
			ClusterSecretFile: filepath.Join(dir, "cluster.token"),
			AdminToken:        "admin-secret",
			ClusterSecret:     "cluster-secret",
		},
		Build: BuildConfig{
			Timeout:           d("2h"),
			MaxSilent:         d("10m"),
			MaxOutputSize:     10 << 30,
			MaxLogSize:        1 << 20,
			NixStore:          "/srv/ci/store",
			ExtraSandboxPaths: []string{"/bin/sleep"},
			Sandbox:           true,
			BuildUsersGroup:   "nixbld",
			MinFree:           2 << 30,
			MaxFree:           10 << 30,
			Nice:              5,
			MaxRetries:        5,
			MaxRetryBackoff:   d("10m"),
		},
		Cluster: ClusterConfig{
			Heartbeat:      HeartbeatConfig{d("10s"), d("1m"), d("168h")},
			LeaderElection: LeaderElectionConfig{d("2s"), d("30s"), d("10s")},
			Shutdown:       ShutdownConfig{d("0s")},
		},
		Queue:  QueueConfig{d("1s"), d("10s"), d("1m"), d("0s"), d("30m"), d("1h"), OrderFIFO},
		Cache:  CacheConfig{Store: "local", Priority: 30, NarinfoMemory: 64 << 20, S3: S3Config{Region: "us-east-1", UseTLS: true}},
		Signer: SignerConfig{URLExpiry: d("15m")},
		Eval: EvalConfig{Timeout: d("20m"), Workers: 3, MaxMemory: 4 << 30, MaxMemoryPerWorker: 1 << 30, PollInterval: d("2s"), MaxAttrs: 1000, MaxDerivations: 5000,
			User: "harmonia-eval", HelpOthers: true},
		Substituters: SubstitutersConfig{
			URLs:              []string{"https://cache.example.org"},
			TrustedPublicKeys: []string{"cache.example.org-1:6NCHdD59X431o0gWypbMrAURkbJ16ZPMQFGspcDShjY="},
		},
		Frontend: FrontendConfig{PublicURL: "https://ci.example.org", StatusDebounce: d("1s"),
			RepoSyncInterval: d("15m"), PollCheckInterval: d("1m"), CacheTokenRefresh: d("5m"), MaxWebhooksInFlight: 32,
			APIRate: 20, APIBurst: 100, APIAnonymousRate: 5, APIAnonymousBurst: 50},
		Retention: RetentionConfig{Default: d("90d"), Max: d("365d"), LogRetention: d("30d"), GCInterval: d("24h"), Grace: d("24h")},
		Forges: []ForgeConfig{
			{Name: "gitea", Type: "gitea", URL: "https://gitea.example.org", TokenFile: "gitea.token",
				WebhookSecretFile: "gitea.secret", Token: "gitea-token", WebhookSecret: "hook-secret"},
			{Name: "gh-enterprise", Type: "github", URL: "https://github.example.org",
				APIURL: "https://github.example.org/api/v3", AppID: 42, PrivateKeyFile: "app.pem",
				PrivateKey: "pem", WebhookSecret: "gh-secret"},
		},
		Source: path,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got\n%#v\nwant\n%#v", got, want)
	}
	if !got.HasRole(RoleBuilder) || got.HasRole(RoleFrontend) {
		t.Errorf("HasRole wrong for %v", got.Node.Roles)
	}
}

// The example sets every key that has a static default to that default, so
// loading it must give exactly the defaults.
func TestExampleIsDefault(t *testing.T) {
	setup(t)
	got, err := Load(Overrides{ConfigFile: "example.toml"}, fakeEnv(nil))
	if err != nil {
		t.Fatal(err)
	}
	got.Source = ""
	if want := defaults(fakeEnv(nil)); !reflect.DeepEqual(got, want) {
		t.Errorf("example.toml differs from defaults:\n%+v\n%+v", got, want)
	}
}

// Uncommenting the example's commented-out keys must give a valid file that
// sets every key, so the reference cannot silently miss one.
func TestExampleDocumentsEveryKey(t *testing.T) {
	setup(t)
	data, err := os.ReadFile("example.toml")
	if err != nil {
		t.Fatal(err)
	}
	text := regexp.MustCompile(`(?m)^# (\[\[[a-z_]+\]\]|[a-z_]+ = .*)$`).ReplaceAllString(string(data), "$1")
	var c Config
	md, err := toml.Decode(text, &c)
	if err != nil {
		t.Fatal(err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		t.Errorf("unknown keys in example.toml: %v", und)
	}
	for _, key := range leafKeys(reflect.TypeFor[Config](), nil) {
		if !md.IsDefined(key...) {
			t.Errorf("example.toml does not document %s", key)
		}
	}
	path := writeFile(t, t.TempDir(), "uncommented.toml", text)
	if _, err := Load(Overrides{ConfigFile: path}, fakeEnv(map[string]string{
		"HARMONIA_ADMIN_TOKEN": "a", "HARMONIA_CLUSTER_SECRET": "c", "HARMONIA_NODE_TOKEN": testNodeToken(t),
		"HARMONIA_S3_ACCESS_KEY": "ak", "HARMONIA_S3_SECRET_KEY": "sk",
		"HARMONIA_FORGE_GITEA_TOKEN": "t", "HARMONIA_FORGE_GITEA_WEBHOOK_SECRET": "s",
		"HARMONIA_FORGE_GITHUB_PRIVATE_KEY": "k", "HARMONIA_FORGE_GITHUB_WEBHOOK_SECRET": "s",
		"HARMONIA_AUTH_SECRET": strings.Repeat("a", MinAuthSecret), "HARMONIA_FORGE_GITEA_OAUTH_SECRET": "o",
		"HARMONIA_FORGE_GITHUB_OAUTH_SECRET": "o",
	})); err != nil {
		t.Errorf("uncommented example.toml does not load: %v", err)
	}
}

func leafKeys(t reflect.Type, path toml.Key) []toml.Key {
	var keys []toml.Key
	for _, f := range reflect.VisibleFields(t) {
		name := f.Tag.Get("toml")
		if name == "" || name == "-" {
			continue
		}
		key := append(slices.Clone(path), name)
		if f.Type.Kind() == reflect.Struct && f.Type != durationType {
			keys = append(keys, leafKeys(f.Type, key)...)
		} else {
			keys = append(keys, key)
		}
	}
	return keys
}

func TestPrecedence(t *testing.T) {
	setup(t)
	const file = `
database_url = "postgres://file"
state_dir = "/file"
listen = "127.0.0.1:1"
log_level = "warn"
[node]
id = "file"
roles = ["cache"]
`
	type view struct{ DB, State, Listen, Level, ID, Roles string }
	get := func(c *Config) view {
		return view{c.DatabaseURL, c.StateDir, c.Listen, c.LogLevel, c.Node.ID, strings.Join(c.Node.Roles, ",")}
	}
	allEnv := map[string]string{
		"HARMONIA_DATABASE_URL": "postgres://env",
		"HARMONIA_STATE_DIR":    "/env",
		"HARMONIA_LOG_LEVEL":    "error",
		"HARMONIA_NODE_ID":      "env",
	}
	allFlags := Overrides{
		DatabaseURL: ptr("postgres://flag"),
		StateDir:    ptr("/flag"),
		Listen:      ptr("127.0.0.1:3"),
		NodeID:      ptr("flag"),
		Roles:       ptr("builder, signer,"),
	}
	tests := []struct {
		name  string
		file  string
		env   map[string]string
		flags Overrides
		want  view
	}{
		{"defaults", "", nil, Overrides{},
			view{"", "/home/test/.local/state/harmonia-ci", "127.0.0.1:7777", "info", "testhost", "frontend,evaluator,signer,cache,builder"}},
		{"file over default", file, nil, Overrides{},
			view{"postgres://file", "/file", "127.0.0.1:1", "warn", "file", "cache"}},
		{"env over file", file, allEnv, Overrides{},
			view{"postgres://env", "/env", "127.0.0.1:1", "error", "env", "cache"}},
		{"flag over env", file, allEnv, allFlags,
			view{"postgres://flag", "/flag", "127.0.0.1:3", "error", "flag", "builder,signer"}},
		{"flag without env", "", nil, allFlags,
			view{"postgres://flag", "/flag", "127.0.0.1:3", "info", "flag", "builder,signer"}},
		{"empty env is unset", file, map[string]string{"HARMONIA_NODE_ID": ""}, Overrides{},
			view{"postgres://file", "/file", "127.0.0.1:1", "warn", "file", "cache"}},
		{"empty flag is set", file, allEnv, Overrides{DatabaseURL: ptr("")},
			view{"", "/env", "127.0.0.1:1", "error", "env", "cache"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := loadText(t, tt.file, tt.env, tt.flags)
			if err != nil {
				t.Fatal(err)
			}
			if got := get(c); got != tt.want {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestFileErrors(t *testing.T) {
	setup(t)
	tests := []struct {
		name string
		file string
		want []string
	}{
		{"unknown top-level key", `lissten = "x"`, []string{`: unknown key "lissten"`}},
		{"unknown nested key", "[cluster.heartbeat]\nintervall = \"5s\"", []string{`: unknown key "cluster.heartbeat.intervall"`}},
		{"unknown table", "[nodes]\nid = \"x\"", []string{`: unknown key "nodes"`}},
		{"token is not a key", "[auth]\nadmin_token = \"s3cret\"", []string{`unknown key "auth.admin_token"`}},
		{"source is not a key", `Source = "x"`, []string{`unknown key "Source"`}},
		{"several unknown keys", "a = 1\n[node]\nb = 2\n[build]\nc = 3", []string{`: unknown keys "a", "node.b", "build.c"`}},
		{"syntax", "listen = \"x\"\nlog_level = \n", []string{": line 2", "expected value"}},
		{"bad duration", "[cluster.heartbeat]\ninterval = \"5x\"", []string{`: cluster.heartbeat.interval: invalid duration "5x"`}},
		{"fractional days", "[cluster.heartbeat]\ndead_retention = \"1.5d\"", []string{`cluster.heartbeat.dead_retention: invalid duration "1.5d"`}},
		{"duration as integer", "[build]\ntimeout = 30", []string{`build.timeout: expected a duration string such as "30s", got integer 30`}},
		{"bad size", "[build]\nmax_log_size = \"64 MB2\"", []string{`: build.max_log_size: invalid size "64 MB2"`}},
		{"unknown size unit", "[build]\nmax_log_size = \"64XB\"", []string{`build.max_log_size: invalid size "64XB": unknown unit "XB"`}},
		{"negative size string", "[build]\nmax_output_size = \"-1MB\"", []string{`build.max_output_size: invalid size "-1MB": must not be negative`}},
		{"negative size integer", "[build]\nmax_output_size = -1", []string{`build.max_output_size: invalid size -1: must not be negative`}},
		{"size as float", "[build]\nmax_output_size = 1.5", []string{`build.max_output_size: expected an integer or a size string such as "4GB", got float 1.5`}},
		{"int as string", "[node]\nmax_jobs = \"four\"", []string{`: node.max_jobs: expected integer, got string "four"`}},
		{"string as int", "listen = 7777", []string{`: listen: expected string, got integer 7777`}},
		{"array element", "[node]\nroles = [\"cache\", 5]", []string{`: node.roles[1]: expected string, got integer 5`}},
		{"scalar for array", "[node]\nsystems = \"x86_64-linux\"", []string{`: node.systems: expected array of strings, got string "x86_64-linux"`}},
		{"scalar for table", "node = 5", []string{`: node: expected table, got integer 5`}},
		{"table for scalar", "[node.id]\nx = 1", []string{`: node.id: expected string, got table`}},
		{"all problems at once", "max_jobs = 1\n[node]\nmax_jobs = \"x\"\n[build]\ntimeout = \"x\"",
			[]string{`unknown key "max_jobs"`, "node.max_jobs: expected integer", `build.timeout: invalid duration "x"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, t.TempDir(), "c.toml", tt.file)
			_, err := Load(Overrides{ConfigFile: path}, fakeEnv(nil))
			wantErr(t, err, tt.want...)
			for line := range strings.Lines(err.Error()) {
				if !strings.HasPrefix(line, "config "+path+": ") {
					t.Errorf("line %q does not start with %q", line, "config "+path+": ")
				}
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error leaks a value: %v", err)
			}
		})
	}
}

func TestConfigFile(t *testing.T) {
	cwd := setup(t)
	missing := filepath.Join(t.TempDir(), "nope.toml")
	_, err := Load(Overrides{ConfigFile: missing}, fakeEnv(nil))
	wantErr(t, err, "config "+missing+": open "+missing+": no such file or directory")
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("error %v does not wrap fs.ErrNotExist", err)
	}

	c, err := Load(Overrides{}, fakeEnv(nil))
	if err != nil {
		t.Fatalf("missing default file: %v", err)
	}
	if c.Source != "" {
		t.Errorf("Source = %q without a file", c.Source)
	}

	path := writeFile(t, cwd, DefaultFile, "log_level = \"debug\"\n")
	c, err = Load(Overrides{}, fakeEnv(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.Source != path || c.LogLevel != "debug" {
		t.Errorf("default file not read: Source %q, log_level %q", c.Source, c.LogLevel)
	}

	writeFile(t, cwd, DefaultFile, "log_level = 1\n")
	_, err = Load(Overrides{}, fakeEnv(nil))
	wantErr(t, err, "config "+path+": log_level: expected string")
}

func TestValidate(t *testing.T) {
	setup(t)
	tests := []struct {
		name   string
		change func(c *Config)
		want   []string
	}{
		{"refresh vs lease", func(c *Config) { c.Cluster.LeaderElection.RefreshInterval = d("30s") },
			[]string{"config: cluster.leader_election.refresh_interval (30s) must be at most lease_duration/3 (20s)"}},
		{"max_jobs zero", func(c *Config) { c.Node.MaxJobs = 0 },
			[]string{"config: node.max_jobs must be between 1 and 1024, got 0"}},
		{"max_jobs too big", func(c *Config) { c.Node.MaxJobs = 1025 },
			[]string{"config: node.max_jobs must be between 1 and 1024, got 1025"}},
		{"max_evals", func(c *Config) { c.Node.MaxEvals = 65 },
			[]string{"config: node.max_evals must be between 1 and 64, got 65"}},
		{"unknown role", func(c *Config) { c.Node.Roles = []string{"buildr"} },
			[]string{`config: node.roles: unknown role "buildr" (known: frontend, evaluator, signer, cache, builder)`}},
		{"duplicate role", func(c *Config) { c.Node.Roles = []string{"cache", "builder", "cache"} },
			[]string{`config: node.roles: duplicate role "cache"`}},
		{"no roles", func(c *Config) { c.Node.Roles = nil },
			[]string{"config: node.roles must not be empty"}},
		{"relative nix store", func(c *Config) { c.Build.NixStore = "store" },
			[]string{`config: build.nix_store: want an absolute directory, got "store"`}},
		{"relative daemon socket", func(c *Config) { c.Build.Daemon = "socket" },
			[]string{`config: build.daemon: want the absolute path of a nix-daemon socket, got "socket"`}},
		{"daemon and chroot store", func(c *Config) { c.Build.Daemon, c.Build.NixStore = "/nix/var/nix/daemon-socket/socket", "/store" },
			[]string{"config: build.daemon and build.nix_store exclude each other: a daemon serves its own store"}},
		{"daemon without sandbox", func(c *Config) { c.Build.Daemon, c.Build.Sandbox = "/nix/var/nix/daemon-socket/socket", false },
			[]string{"config: build.sandbox = false has no effect with build.daemon: set sandbox in the daemon's nix.conf"}},
		{"daemon with sandbox paths", func(c *Config) {
			c.Build.Daemon, c.Build.ExtraSandboxPaths = "/nix/var/nix/daemon-socket/socket", []string{"/bin/sleep"}
		}, []string{"config: build.extra_sandbox_paths has no effect with build.daemon: set extra-sandbox-paths in the daemon's nix.conf"}},
		{"daemon with cgroup", func(c *Config) {
			c.Build.Daemon, c.Build.Cgroup = "/nix/var/nix/daemon-socket/socket", "/sys/fs/cgroup/x"
		},
			[]string{"config: build.cgroup has no effect with build.daemon: the daemon's builds run where the daemon runs"}},
		{"sandbox path with a space", func(c *Config) { c.Build.ExtraSandboxPaths = []string{"/bin/a b"} },
			[]string{`config: build.extra_sandbox_paths[0]: want an absolute path without spaces or '=', got "/bin/a b"`}},
		{"queue order", func(c *Config) { c.Queue.Order = "lifo" },
			[]string{`config: queue.order must be "critical-path" or "fifo", got "lifo"`}},
		{"eval timeout", func(c *Config) { c.Eval.Timeout = d("0s") },
			[]string{"config: eval.timeout must be positive, got 0s"}},
		{"substituter url", func(c *Config) {
			c.Substituters.URLs = []string{"s3://bucket"}
			c.Substituters.TrustedPublicKeys = []string{"k-1:6NCHdD59X431o0gWypbMrAURkbJ16ZPMQFGspcDShjY="}
		}, []string{`config: substituters.urls[0]: want an http or https URL, got "s3://bucket"`}},
		{"substituters without keys", func(c *Config) { c.Substituters.URLs = []string{"https://cache.example.org"} },
			[]string{"config: substituters.trusted_public_keys: required with substituters.urls (their narinfos must be signed by a trusted key)"}},
		{"forge without secrets", func(c *Config) {
			c.Forges = []ForgeConfig{{Name: "gitea", Type: "gitea", URL: "https://g.example"}}
		}, []string{
			"config: forges[0]: forge gitea needs webhook_secret_file (or HARMONIA_FORGE_GITEA_WEBHOOK_SECRET): deliveries are verified with it",
			"config: forges[0]: gitea forge gitea needs token_file (or HARMONIA_FORGE_GITEA_TOKEN)",
		}},
		{"forge name and type", func(c *Config) {
			c.Forges = []ForgeConfig{
				{Name: "Git Hub", Type: "gitlab", WebhookSecret: "s"},
				{Name: "git", Type: "github", AppID: 1, PrivateKey: "k", WebhookSecret: "s"},
			}
		}, []string{
			`config: forges[0].name: invalid name "Git Hub" (lower-case letters, digits, '_', '-'; at most 32; it appears in /webhook/{name})`,
			`config: forges[0].type: unknown forge type "gitlab" (want gitea or github)`,
			`config: forges[1].name: "git" is reserved for projects added by URL`,
		}},
		{"duplicate forge", func(c *Config) {
			g := ForgeConfig{Name: "gh", Type: "github", AppID: 1, PrivateKey: "k", WebhookSecret: "s"}
			c.Forges = []ForgeConfig{g, g}
		}, []string{`config: forges[1].name: duplicate forge name "gh"`}},
		{"github app", func(c *Config) {
			c.Forges = []ForgeConfig{{Name: "gh", Type: "github", APIURL: "ftp://x", TokenFile: "t", WebhookSecret: "s"}}
		}, []string{
			`config: forges[0].api_url: invalid URL "ftp://x" (an absolute http or https URL)`,
			"config: forges[0]: github forge gh needs app_id (the GitHub App's id)",
			"config: forges[0]: github forge gh needs private_key_file (or HARMONIA_FORGE_GH_PRIVATE_KEY)",
			"config: forges[0]: token_file is for gitea forges; a GitHub App authenticates with its private key",
		}},
		{"oauth without secrets", func(c *Config) {
			c.Forges = []ForgeConfig{
				{Name: "g", Type: "gitea", URL: "https://g.example", Token: "t", WebhookSecret: "s", OAuthClientID: "id"},
				{Name: "h", Type: "gitea", URL: "https://h.example", Token: "t", WebhookSecret: "s", OAuthClientSecretFile: "f"},
			}
		}, []string{
			"config: forges[0]: forge g needs oauth_client_secret_file (or HARMONIA_FORGE_G_OAUTH_SECRET) for its oauth_client_id",
			"config: forges[1]: forge h has oauth_client_secret_file but no oauth_client_id",
		}},
		{"oauth without cookie secret", func(c *Config) {
			c.Forges = []ForgeConfig{{Name: "g", Type: "gitea", URL: "https://g.example", Token: "t", WebhookSecret: "s",
				OAuthClientID: "id", OAuthClientSecret: "o"}}
			c.Auth.Secret = ""
		}, []string{"config: auth.secret_file: forge g has oauth_client_id: web UI logins need a cookie secret of at least 32 characters"}},
		{"short cookie secret", func(c *Config) { c.Auth.Secret = "short" },
			[]string{"config: auth.secret_file: the secret has 5 characters, want at least 32"}},
		{"admins", func(c *Config) {
			c.Forges = []ForgeConfig{{Name: "g", Type: "gitea", URL: "https://g.example", Token: "t", WebhookSecret: "s"}}
			c.Auth.Admins = []string{"g:alice", "alice", "g:", "gh:bob", "g:a/b"}
		}, []string{
			`config: auth.admins[1]: "alice": want "forge:login", as "gitea:alice"`,
			`config: auth.admins[2]: "g:": want "forge:login"`,
			`config: auth.admins[3]: "gh:bob": no [[forges]] entry is named gh`,
			`config: auth.admins[4]: "g:a/b": want "forge:login"`,
		}},
		{"gitea url", func(c *Config) {
			c.Forges = []ForgeConfig{{Name: "g", Type: "gitea", URL: "gitea.example", Token: "t", WebhookSecret: "s"}}
		}, []string{`config: forges[0].url: invalid URL "gitea.example" (an absolute http or https URL)`}},
		{"public url", func(c *Config) { c.Frontend.PublicURL = "ci.example.com" },
			[]string{`config: frontend.public_url: invalid URL "ci.example.com" (an absolute http or https URL)`}},
		{"webhook body", func(c *Config) {
			c.Forges = []ForgeConfig{{Name: "g", Type: "gitea", URL: "https://gitea.example", Token: "t", WebhookSecret: "s", MaxWebhookBody: 10}}
		}, []string{"config: forges[0].max_webhook_body must be between 1 KB and 100 MB, got 10B"}},
		{"api rate", func(c *Config) { c.Frontend.APIRate, c.Frontend.APIAnonymousBurst = -1, 0 },
			[]string{"config: frontend.api_rate must be between 0 (no limit) and 1000000 requests a second, got -1",
				"config: frontend.api_anonymous_burst must be between 1 and 1000000, got 0"}},
		{"cache token refresh", func(c *Config) { c.Frontend.CacheTokenRefresh = Duration{time.Hour} },
			[]string{"config: frontend.cache_token_refresh must be at most 30m (a user's cache token not refreshed for an hour reads nothing), got 1h"}},
		{"webhooks in flight", func(c *Config) { c.Frontend.MaxWebhooksInFlight = 0 },
			[]string{"config: frontend.max_webhooks_in_flight must be between 1 and 10000, got 0"}},
		{"bad trusted key", func(c *Config) { c.Substituters.TrustedPublicKeys = []string{"nokey"} },
			[]string{"config: substituters.trusted_public_keys[0]: "}},
		{"dead threshold", func(c *Config) { c.Cluster.Heartbeat.DeadThreshold = d("45s") },
			[]string{"config: cluster.heartbeat.dead_threshold (45s) must be at least twice heartbeat.interval (30s)"}},
		{"max free below min free", func(c *Config) { c.Build.MinFree, c.Build.MaxFree = 2<<30, 1<<30 },
			[]string{"config: build.max_free (1GiB) must be at least build.min_free (2GiB)"}},
		{"negative nice", func(c *Config) { c.Build.Nice = -5 },
			[]string{"config: build.nice must be between 0 and 19, got -5"}},
		{"nice past 19", func(c *Config) { c.Build.Nice = 20 },
			[]string{"config: build.nice must be between 0 and 19, got 20"}},
		{"relative cgroup", func(c *Config) { c.Build.Cgroup = "builds" },
			[]string{`config: build.cgroup must be an absolute path, got "builds"`}},
		{"retention zero", func(c *Config) { c.Retention.Default = d("0s") },
			[]string{"config: retention.default must be positive"}},
		{"retention max below default", func(c *Config) { c.Retention.Max = d("30d") },
			[]string{"config: retention.max (720h) must be at least retention.default (2160h)"}},
		{"no workers", func(c *Config) { c.Eval.Workers = 0 },
			[]string{"config: eval.workers must be at least 1, got 0"}},
		{"no memory per worker", func(c *Config) { c.Eval.MaxMemoryPerWorker = 0 },
			[]string{"config: eval.max_memory_per_worker must be positive, got 0"}},
		{"no attributes", func(c *Config) { c.Eval.MaxAttrs = 0 },
			[]string{"config: eval.max_attrs must be positive, got 0"}},
		{"negative derivations", func(c *Config) { c.Eval.MaxDerivations = -1 },
			[]string{"config: eval.max_derivations must be positive, got -1"}},
		{"listen no port", func(c *Config) { c.Listen = "nope" },
			[]string{`config: listen: invalid address "nope": missing port in address`}},
		{"listen bad port", func(c *Config) { c.Listen = "localhost:99999" },
			[]string{`config: listen: invalid address "localhost:99999": port "99999" must be a number between 0 and 65535`}},
		{"listen named port", func(c *Config) { c.Listen = "localhost:http" },
			[]string{`config: listen: invalid address "localhost:http"`}},
		{"node id", func(c *Config) { c.Node.ID = "bad id!" },
			[]string{`config: node.id: invalid node id "bad id!" (letters, digits, '.', '_', '-'; at most 63 characters)`}},
		{"node id too long", func(c *Config) { c.Node.ID = strings.Repeat("a", 64) },
			[]string{"config: node.id: invalid node id"}},
		{"node id leading dash", func(c *Config) { c.Node.ID = "-a" },
			[]string{`config: node.id: invalid node id "-a"`}},
		{"endpoint relative", func(c *Config) { c.Node.Endpoint = "node1:7777" },
			[]string{`config: node.endpoint: invalid URL "node1:7777"`}},
		{"endpoint scheme", func(c *Config) { c.Node.Endpoint = "ftp://node1" },
			[]string{`config: node.endpoint: invalid URL "ftp://node1"`}},
		{"endpoint no host", func(c *Config) { c.Node.Endpoint = "http:///x" },
			[]string{`config: node.endpoint: invalid URL "http:///x"`}},
		{"system", func(c *Config) { c.Node.Systems = []string{"x86_64-linux", "x86_64"} },
			[]string{`config: node.systems: invalid system "x86_64"`}},
		{"feature", func(c *Config) { c.Node.Features = []string{"kvm", "big parallel"} },
			[]string{`config: node.features: invalid feature "big parallel"`}},
		{"log level", func(c *Config) { c.LogLevel = "verbose" },
			[]string{`config: log_level: invalid level "verbose"`}},
		{"log format", func(c *Config) { c.LogFormat = "xml" },
			[]string{`config: log_format: invalid format "xml"`}},
		{"state dir", func(c *Config) { c.StateDir = "" },
			[]string{"config: state_dir must not be empty"}},
		{"timeout", func(c *Config) { c.Build.Timeout = d("0s") },
			[]string{"config: build.timeout must be positive, got 0s"}},
		{"max silent negative", func(c *Config) { c.Build.MaxSilent = d("-1m") },
			[]string{"config: build.max_silent must be positive, got -1m"}},
		{"max silent over timeout", func(c *Config) { c.Build.MaxSilent = d("5h") },
			[]string{"config: build.max_silent (5h) must be at most build.timeout (4h)"}},
		{"output size", func(c *Config) { c.Build.MaxOutputSize = 0 },
			[]string{"config: build.max_output_size must be positive, got 0B"}},
		{"log size", func(c *Config) { c.Build.MaxLogSize = -5 },
			[]string{"config: build.max_log_size must be positive, got -5B"}},
		{"negative retries", func(c *Config) { c.Build.MaxRetries = -1 },
			[]string{"config: build.max_retries must be between 0 and 10, got -1"}},
		{"too many retries", func(c *Config) { c.Build.MaxRetries = 11 },
			[]string{"config: build.max_retries must be between 0 and 10, got 11"}},
		{"negative retry backoff", func(c *Config) { c.Build.MaxRetryBackoff = Duration{-time.Second} },
			[]string{"config: build.max_retry_backoff must not be negative, got -1s"}},
		{"heartbeat interval", func(c *Config) { c.Cluster.Heartbeat.Interval = d("0s") },
			[]string{"config: cluster.heartbeat.interval must be positive, got 0s"}},
		{"dead retention", func(c *Config) { c.Cluster.Heartbeat.DeadRetention = d("-1d") },
			[]string{"config: cluster.heartbeat.dead_retention must be positive, got -24h"}},
		{"check interval", func(c *Config) { c.Cluster.LeaderElection.CheckInterval = d("0s") },
			[]string{"config: cluster.leader_election.check_interval must be positive, got 0s"}},
		{"lease", func(c *Config) { c.Cluster.LeaderElection.LeaseDuration = d("0s") },
			[]string{"config: cluster.leader_election.lease_duration must be positive, got 0s"}},
		{"drain", func(c *Config) { c.Cluster.Shutdown.DrainTimeout = d("-1s") },
			[]string{"config: cluster.shutdown.drain_timeout must not be negative, got -1s"}},
		{"everything at once", func(c *Config) {
			c.Node.MaxJobs = 0
			c.Node.ID = ""
			c.Listen = "nope"
		}, []string{"node.max_jobs", `node.id: invalid node id ""`, "listen: invalid address"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := defaults(fakeEnv(nil))
			tt.change(c)
			err := c.Validate()
			wantErr(t, err, tt.want...)
			if n := strings.Count(err.Error(), "\n") + 1; n != len(tt.want) {
				t.Errorf("got %d problems, want %d:\n%v", n, len(tt.want), err)
			}
		})
	}

	c := defaults(fakeEnv(nil))
	c.Build.MaxSilent = c.Build.Timeout
	c.Cluster.Heartbeat.DeadThreshold = d("1m")
	c.Cluster.LeaderElection.RefreshInterval = d("20s")
	c.Cluster.Shutdown.DrainTimeout = d("0s")
	c.Listen = ":0"
	if err := c.Validate(); err != nil {
		t.Errorf("boundary values rejected: %v", err)
	}
}

func TestOverrideAndEnvErrors(t *testing.T) {
	setup(t)
	tests := []struct {
		name  string
		env   map[string]string
		flags Overrides
		want  []string
	}{
		{"unknown role via flag", nil, Overrides{Roles: ptr("frontend,buildr")},
			[]string{`config: node.roles: unknown role "buildr" (known: frontend, evaluator, signer, cache, builder) (from --roles)`}},
		{"empty roles via flag", nil, Overrides{Roles: ptr(" , ")},
			[]string{"config: node.roles must not be empty", "(from --roles)"}},
		{"bad node id via flag", nil, Overrides{NodeID: ptr("bad id!")},
			[]string{`config: node.id: invalid node id "bad id!"`, "(from --node-id)"}},
		{"bad node id via env", map[string]string{"HARMONIA_NODE_ID": "a/b"}, Overrides{},
			[]string{`config: node.id: invalid node id "a/b"`, "(from HARMONIA_NODE_ID)"}},
		{"bad listen via flag", nil, Overrides{Listen: ptr("nope")},
			[]string{`config: listen: invalid address "nope"`, "(from --listen)"}},
		{"bad log level via env", map[string]string{"HARMONIA_LOG_LEVEL": "loud"}, Overrides{},
			[]string{`config: log_level: invalid level "loud"`, "(from HARMONIA_LOG_LEVEL)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(tt.flags, fakeEnv(tt.env))
			wantErr(t, err, tt.want...)
		})
	}
}

func TestTokens(t *testing.T) {
	setup(t)
	const secret = "s3cret-token"
	tests := []struct {
		name         string
		files        map[string]string // token files in the config's directory
		file         string            // config file body
		env          map[string]string
		admin, clstr string
		wantErr      []string
	}{
		{"none", nil, "", nil, "", "", nil},
		{"file trailing newline trimmed", map[string]string{"admin": secret + " \n\n", "cluster": "c\r\n"},
			"[auth]\nadmin_token_file = \"admin\"\ncluster_secret_file = \"cluster\"", nil, secret, "c", nil},
		{"env overrides file", map[string]string{"admin": "from-file\n"},
			"[auth]\nadmin_token_file = \"admin\"", map[string]string{"HARMONIA_ADMIN_TOKEN": secret + "\n"}, secret, "", nil},
		{"env without file", nil, "", map[string]string{"HARMONIA_CLUSTER_SECRET": secret}, "", secret, nil},
		{"auth secret file", map[string]string{"auth": strings.Repeat("x", 40) + "\n"}, "[auth]\nsecret_file = \"auth\"", nil, "", "", nil},
		{"empty auth secret file", map[string]string{"auth": "\n"}, "[auth]\nsecret_file = \"auth\"", nil, "", "",
			[]string{"config: auth.secret_file: ", "auth is empty"}},
		{"env makes missing file irrelevant", nil, "[auth]\nadmin_token_file = \"missing\"",
			map[string]string{"HARMONIA_ADMIN_TOKEN": secret}, secret, "", nil},
		{"empty file", map[string]string{"admin": " \n"}, "[auth]\nadmin_token_file = \"admin\"", nil, "", "",
			[]string{"config: auth.admin_token_file: ", "admin is empty"}},
		{"missing file", nil, "[auth]\ncluster_secret_file = \"missing\"", nil, "", "",
			[]string{"config: auth.cluster_secret_file: read ", "missing: no such file or directory"}},
		{"the old cluster token key", nil, "[auth]\ncluster_token_file = \"x\"", nil, "", "",
			[]string{`unknown key "auth.cluster_token_file" (auth.cluster_token_file was replaced: signer nodes hold auth.cluster_secret_file`}},
		{"token and validation errors together", map[string]string{"admin": ""},
			"[auth]\nadmin_token_file = \"admin\"\n[node]\nmax_jobs = 0", nil, "", "",
			[]string{"admin is empty", "node.max_jobs must be between 1 and 1024, got 0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, content := range tt.files {
				writeFile(t, dir, name, content)
			}
			path := writeFile(t, dir, "c.toml", tt.file)
			c, err := Load(Overrides{ConfigFile: path}, fakeEnv(tt.env))
			if tt.wantErr != nil {
				wantErr(t, err, tt.wantErr...)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Auth.AdminToken != tt.admin || c.Auth.ClusterSecret != tt.clstr {
				t.Errorf("tokens %q, %q; want %q, %q", c.Auth.AdminToken, c.Auth.ClusterSecret, tt.admin, tt.clstr)
			}
		})
	}
}

func TestTokensNotPrinted(t *testing.T) {
	setup(t)
	c := defaults(fakeEnv(nil))
	c.Auth = AuthConfig{AdminTokenFile: "/a", AdminToken: "s3cret-admin", ClusterSecret: "s3cret-cluster", NodeToken: "s3cret-node",
		Secret: "s3cret-auth"}
	c.Forges = []ForgeConfig{{Name: "gitea", Type: "gitea", URL: "bad", Token: "s3cret-forge", WebhookSecret: "s3cret-hook",
		OAuthClientID: "id", OAuthClientSecret: "s3cret-oauth"},
		{Name: "gh", Type: "github", AppID: 0, PrivateKey: "s3cret-key", WebhookSecret: "s3cret-hook2"}}
	c.Node.MaxJobs = 0
	for _, s := range []string{
		fmt.Sprint(c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c), fmt.Sprintf("%v", *c),
		fmt.Sprint(c.Auth), c.Validate().Error(), fmt.Sprint(c.Forges), fmt.Sprintf("%+v %#v", c.Forges[0], c.Forges[1]),
	} {
		if strings.Contains(s, "s3cret") {
			t.Errorf("token printed: %s", s)
		}
	}
	if s := fmt.Sprint(c.Auth); !strings.Contains(s, "/a") || !strings.Contains(s, "[redacted]") {
		t.Errorf("AuthConfig.String() = %q", s)
	}
}

func TestParseByteSize(t *testing.T) {
	tests := []struct {
		in      string
		want    ByteSize
		wantErr string
	}{
		{"512", 512, ""},
		{"0", 0, ""},
		{"512B", 512, ""},
		{"4GB", 4_000_000_000, ""},
		{"4gb", 4_000_000_000, ""},
		{"64MiB", 64 << 20, ""},
		{"64 MiB", 64 << 20, ""},
		{"64 mib", 64 << 20, ""},
		{"1KB", 1000, ""},
		{"1kib", 1024, ""},
		{"2TB", 2e12, ""},
		{"1TiB", 1 << 40, ""},
		{" 7 GB ", 7e9, ""},
		// Decimals are accepted when they come to whole bytes.
		{"1.5GB", 1_500_000_000, ""},
		{"0.5KiB", 512, ""},
		{"0.5B", 0, "not a whole number of bytes"},
		{"1.0001KB", 0, "not a whole number of bytes"},
		{"-1MB", 0, `invalid size "-1MB": must not be negative`},
		{"-1", 0, "must not be negative"},
		{"", 0, `invalid size ""`},
		{"MB", 0, `invalid size "MB"`},
		{"4 G", 0, `unknown unit "G"`},
		{"4PB", 0, `unknown unit "PB"`},
		{"1e3", 0, `invalid size "1e3"`},
		{"1,000", 0, `invalid size "1,000"`},
		{"+5", 0, `invalid size "+5"`},
		{"9223372036854775807", 1<<63 - 1, ""},
		{"9223372036854775808", 0, "too large"},
		{"10000000TB", 0, "too large"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			var got ByteSize
			err := got.UnmarshalText([]byte(tt.in))
			if tt.wantErr != "" {
				wantErr(t, err, tt.wantErr)
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("got %d, %v; want %d", got, err, tt.want)
			}
		})
	}
}

func TestByteSizeString(t *testing.T) {
	tests := []struct {
		in   ByteSize
		want string
	}{
		{0, "0B"},
		{1, "1B"},
		{1234, "1234B"},
		{1000, "1KB"},
		{1024, "1KiB"},
		{4e9, "4GB"},
		{64e6, "64MB"},
		{64 << 20, "64MiB"},
		{1536, "1536B"}, // 1.5KiB: whole only in B
		{1_024_000, "1000KiB"},
		{-5, "-5B"},
	}
	for _, tt := range tests {
		if got := tt.in.String(); got != tt.want {
			t.Errorf("ByteSize(%d).String() = %q, want %q", int64(tt.in), got, tt.want)
		}
		if tt.in < 0 {
			continue
		}
		text, _ := tt.in.MarshalText()
		var back ByteSize
		if err := back.UnmarshalText(text); err != nil || back != tt.in {
			t.Errorf("round trip of %d via %q gave %d, %v", int64(tt.in), text, back, err)
		}
	}
}

func TestParseDuration(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Duration
		wantErr string
	}{
		{"30s", 30 * time.Second, ""},
		{"1h30m", 90 * time.Minute, ""},
		{"1d", 24 * time.Hour, ""},
		{"7d", 7 * 24 * time.Hour, ""},
		{"0d", 0, ""},
		{"0", 0, ""},
		{"-1d", -24 * time.Hour, ""},
		{"-5s", -5 * time.Second, ""},
		{"1.5d", 0, `invalid duration "1.5d"`},
		{"1d12h", 0, `invalid duration "1d12h"`},
		{"d", 0, `invalid duration "d"`},
		{"5x", 0, `invalid duration "5x"`},
		{"30", 0, `invalid duration "30"`},
		{"", 0, `invalid duration ""`},
		{"999999999d", 0, `invalid duration "999999999d"`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			var got Duration
			err := got.UnmarshalText([]byte(tt.in))
			if tt.wantErr != "" {
				wantErr(t, err, tt.wantErr)
				return
			}
			if err != nil || got.Duration != tt.want {
				t.Errorf("got %v, %v; want %v", got.Duration, err, tt.want)
			}
		})
	}
}

func TestDurationString(t *testing.T) {
	tests := []struct {
		in   time.Duration
		want string
	}{
		{0, "0s"},
		{4 * time.Hour, "4h"},
		{30 * time.Minute, "30m"},
		{90 * time.Minute, "1h30m"},
		{time.Hour + 30*time.Second, "1h0m30s"},
		{20 * time.Second, "20s"},
		{1500 * time.Millisecond, "1.5s"},
		{-24 * time.Hour, "-24h"},
	}
	for _, tt := range tests {
		got := Duration{tt.in}
		if got.String() != tt.want {
			t.Errorf("Duration(%v).String() = %q, want %q", tt.in, got.String(), tt.want)
		}
		text, _ := got.MarshalText()
		var back Duration
		if err := back.UnmarshalText(text); err != nil || back != got {
			t.Errorf("round trip of %v via %q gave %v, %v", tt.in, text, back, err)
		}
	}
}

// Encoding a Config must give TOML that loads back to the same Config.
func TestEncodeRoundTrip(t *testing.T) {
	setup(t)
	want := defaults(fakeEnv(nil))
	var b strings.Builder
	if err := toml.NewEncoder(&b).Encode(want); err != nil {
		t.Fatal(err)
	}
	got, err := loadText(t, b.String(), nil, Overrides{})
	if err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	got.Source = ""
	if !reflect.DeepEqual(got, want) {
		t.Errorf("round trip differs:\n%s", b.String())
	}
}

func TestAllRoles(t *testing.T) {
	want := []string{"frontend", "evaluator", "signer", "cache", "builder"}
	if got := AllRoles(); !reflect.DeepEqual(got, want) {
		t.Errorf("AllRoles() = %v", got)
	}
	AllRoles()[0] = "x"
	if AllRoles()[0] != "frontend" {
		t.Error("AllRoles shares its slice")
	}
}

// testNodeToken is a valid token of the example configuration's node, builder-1.
func testNodeToken(t *testing.T) string {
	t.Helper()
	k, err := nodetoken.NewKey("example-cluster-secret")
	if err != nil {
		t.Fatal(err)
	}
	tok, err := k.Issue(nodetoken.Identity{NodeID: "builder-1", Roles: []string{RoleBuilder, RoleEvaluator}})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestNodeTokenMustFitTheNode(t *testing.T) {
	setup(t)
	k, err := nodetoken.NewKey("example-cluster-secret")
	if err != nil {
		t.Fatal(err)
	}
	issue := func(node string, roles ...string) string {
		tok, err := k.Issue(nodetoken.Identity{NodeID: node, Roles: roles})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	for _, tt := range []struct {
		name, token, roles string
		wantErr            []string
	}{
		{"fits", issue("n1", "builder"), "builder,cache", nil},
		{"another node's", issue("n2", "builder"), "builder",
			[]string{"auth.node_token_file: the token is node n2's, but this node is n1"}},
		{"missing a role", issue("n1", "builder"), "builder,evaluator",
			[]string{"auth.node_token_file: the token does not allow the evaluator role this node runs"}},
		{"malformed", "not-a-token", "builder", []string{"auth.node_token_file: invalid node token"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			roles := tt.roles
			_, err := Load(Overrides{NodeID: &[]string{"n1"}[0], Roles: &roles}, fakeEnv(map[string]string{"HARMONIA_NODE_TOKEN": tt.token}))
			if tt.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantErr(t, err, tt.wantErr...)
		})
	}
}

func TestRelativeStateDirIsMadeAbsolute(t *testing.T) {
	setup(t)
	dir := "relative-state"
	c, err := Load(Overrides{StateDir: &dir}, fakeEnv(nil))
	if err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	if want := filepath.Join(wd, dir); c.StateDir != want {
		t.Fatalf("state_dir %q, want %q", c.StateDir, want)
	}
}

func TestAuthSecretAndOAuthSecret(t *testing.T) {
	setup(t)
	dir := t.TempDir()
	fromFile := strings.Repeat("f", MinAuthSecret)
	writeFile(t, dir, "auth", fromFile+"\n")
	writeFile(t, dir, "oauth", "client-secret\n")
	path := writeFile(t, dir, "c.toml", `[auth]
secret_file = "auth"
admins = ["gitea:alice"]
[[forges]]
name = "gitea"
type = "gitea"
url = "https://gitea.example"
oauth_client_id = "id"
oauth_client_secret_file = "oauth"
`)
	env := map[string]string{"HARMONIA_FORGE_GITEA_TOKEN": "t", "HARMONIA_FORGE_GITEA_WEBHOOK_SECRET": "s"}
	c, err := Load(Overrides{ConfigFile: path}, fakeEnv(env))
	if err != nil {
		t.Fatal(err)
	}
	if c.Auth.Secret != fromFile || c.Forges[0].OAuthClientSecret != "client-secret" || !slices.Equal(c.Auth.Admins, []string{"gitea:alice"}) {
		t.Errorf("secret %q, oauth secret %q, admins %v", c.Auth.Secret, c.Forges[0].OAuthClientSecret, c.Auth.Admins)
	}
	fromEnv := strings.Repeat("e", MinAuthSecret)
	env["HARMONIA_AUTH_SECRET"], env["HARMONIA_FORGE_GITEA_OAUTH_SECRET"] = fromEnv, "env-secret"
	if c, err = Load(Overrides{ConfigFile: path}, fakeEnv(env)); err != nil {
		t.Fatal(err)
	}
	if c.Auth.Secret != fromEnv || c.Forges[0].OAuthClientSecret != "env-secret" {
		t.Errorf("with the environment: secret %q, oauth secret %q", c.Auth.Secret, c.Forges[0].OAuthClientSecret)
	}
}
