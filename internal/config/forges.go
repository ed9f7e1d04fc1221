package config

import (
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Forge types.
const (
	ForgeGitea  = "gitea"
	ForgeGitHub = "github"
)

// ForgeConfig is one [[forges]] entry: a Gitea (or Forgejo) instance reached with an account's
// token, or a GitHub App. Secrets come from files or from HARMONIA_FORGE_<NAME>_TOKEN,
// _PRIVATE_KEY, _WEBHOOK_SECRET and _OAUTH_SECRET (NAME upper-cased, '-' as '_'), which win.
type ForgeConfig struct {
	Name string `toml:"name"` // webhooks arrive at /webhook/{name}; repositories are recorded under it
	Type string `toml:"type"` // gitea or github
	// URL is the forge's web address: the Gitea instance, or GitHub's (default
	// https://github.com; a GitHub Enterprise server's otherwise).
	URL string `toml:"url"`
	// APIURL is GitHub's REST API (default https://api.github.com; GitHub Enterprise:
	// https://HOST/api/v3). Gitea's is always URL/api/v1.
	APIURL            string `toml:"api_url"`
	TokenFile         string `toml:"token_file"`          // gitea: the CI account's access token
	AppID             int    `toml:"app_id"`              // github: the App's id
	PrivateKeyFile    string `toml:"private_key_file"`    // github: the App's private key (PEM)
	WebhookSecretFile string `toml:"webhook_secret_file"` // the secret deliveries are signed with
	// OAuthClientID is the OAuth2 application (Gitea) or the GitHub App's client id users log
	// in to the web UI with; empty: no login with this forge.
	OAuthClientID         string `toml:"oauth_client_id"`
	OAuthClientSecretFile string `toml:"oauth_client_secret_file"` // that application's client secret
	// MaxWebhookBody bounds a delivery's body (larger ones get 413); 0: the forge type's
	// default, which fits its real deliveries (gitea 5MB, github 25MB, GitHub's own cap).
	MaxWebhookBody ByteSize `toml:"max_webhook_body"`

	// Filled by Load from the files above or the environment. Never printed: see String.
	Token         string `toml:"-" json:"-"`
	PrivateKey    string `toml:"-" json:"-"`
	WebhookSecret string `toml:"-" json:"-"`
	// OAuthClientSecret is filled from OAuthClientSecretFile or HARMONIA_FORGE_<NAME>_OAUTH_SECRET.
	OAuthClientSecret string `toml:"-" json:"-"`
}

// String redacts the secrets.
func (f ForgeConfig) String() string {
	return fmt.Sprintf("{Name:%s Type:%s URL:%s APIURL:%s TokenFile:%s AppID:%d PrivateKeyFile:%s WebhookSecretFile:%s OAuthClientID:%s OAuthClientSecretFile:%s Token:%s PrivateKey:%s WebhookSecret:%s OAuthClientSecret:%s}",
		f.Name, f.Type, f.URL, f.APIURL, f.TokenFile, f.AppID, f.PrivateKeyFile, f.WebhookSecretFile, f.OAuthClientID, f.OAuthClientSecretFile,
		redact(f.Token), redact(f.PrivateKey), redact(f.WebhookSecret), redact(f.OAuthClientSecret))
}

// GoString redacts the secrets for %#v too.
func (f ForgeConfig) GoString() string { return "config.ForgeConfig" + f.String() }

// envPrefix is the prefix of the forge's secret variables.
func (f ForgeConfig) envPrefix() string {
	return "HARMONIA_FORGE_" + strings.ToUpper(strings.NewReplacer("-", "_").Replace(f.Name)) + "_"
}

// FrontendConfig configures the frontend role's forge side.
type FrontendConfig struct {
	// PublicURL is where users and forges reach the frontends (behind a load balancer: its
	// URL). Webhooks are registered to PublicURL/webhook/{forge} and commit statuses link to
	// PublicURL/ci/.... Default: this node's endpoint.
	PublicURL string `toml:"public_url"`
	// StatusDebounce collects the build notifications of an evaluation this long before its
	// commit status is computed, so a burst of finishes makes one forge call.
	StatusDebounce Duration `toml:"status_debounce"`
	// RepoSyncInterval is how often the forges' repositories are listed again.
	RepoSyncInterval Duration `toml:"repo_sync_interval"`
	// PollCheckInterval is how often projects with a poll_interval are checked for being due.
	PollCheckInterval Duration `toml:"poll_check_interval"`
	// CacheTokenRefresh is how often the maintenance leader asks the forges again which
	// projects each user's cache token may read (a permission taken back stops it within this).
	CacheTokenRefresh Duration `toml:"cache_token_refresh"`
	// MaxWebhooksInFlight bounds the webhook deliveries this frontend handles at a time;
	// past it they get 503 with Retry-After (the forge delivers again).
	MaxWebhooksInFlight int `toml:"max_webhooks_in_flight"`
	// APIRate and APIBurst limit the requests to /api/ of each API token (and logged-in user):
	// a token bucket of APIRate a second, APIBurst deep; past it 429 with Retry-After.
	// APIAnonymousRate and APIAnonymousBurst do so per anonymous client address. A rate of 0
	// turns that limit off.
	APIRate           int `toml:"api_rate"`
	APIBurst          int `toml:"api_burst"`
	APIAnonymousRate  int `toml:"api_anonymous_rate"`
	APIAnonymousBurst int `toml:"api_anonymous_burst"`
}

var forgeNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)

func frontendDefaults() FrontendConfig {
	return FrontendConfig{
		StatusDebounce:      Duration{5 * time.Second},
		RepoSyncInterval:    Duration{15 * time.Minute},
		PollCheckInterval:   Duration{time.Minute},
		CacheTokenRefresh:   Duration{5 * time.Minute},
		MaxWebhooksInFlight: 32,
		APIRate:             20,
		APIBurst:            100,
		APIAnonymousRate:    5,
		APIAnonymousBurst:   50,
	}
}

// forgeSecrets reads each forge's secrets.
func (c *Config) forgeSecrets(read func(dst *string, env, file, key string)) {
	for i := range c.Forges {
		f := &c.Forges[i]
		key := fmt.Sprintf("forges[%d]", i)
		p := f.envPrefix()
		read(&f.Token, p+"TOKEN", f.TokenFile, key+".token_file")
		read(&f.PrivateKey, p+"PRIVATE_KEY", f.PrivateKeyFile, key+".private_key_file")
		read(&f.WebhookSecret, p+"WEBHOOK_SECRET", f.WebhookSecretFile, key+".webhook_secret_file")
		read(&f.OAuthClientSecret, p+"OAUTH_SECRET", f.OAuthClientSecretFile, key+".oauth_client_secret_file")
	}
}

// forgeProblems checks [[forges]] and [frontend].
func (c *Config) forgeProblems(add func(key, format string, args ...any)) {
	fe := c.Frontend
	if fe.PublicURL != "" {
		if u, err := url.Parse(fe.PublicURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" {
			add("frontend.public_url", "frontend.public_url: invalid URL %q (an absolute http or https URL)", fe.PublicURL)
		}
	}
	for _, k := range []struct {
		key string
		d   Duration
	}{{"frontend.status_debounce", fe.StatusDebounce}, {"frontend.repo_sync_interval", fe.RepoSyncInterval}, {"frontend.poll_check_interval", fe.PollCheckInterval},
		{"frontend.cache_token_refresh", fe.CacheTokenRefresh}} {
		if k.d.Duration < 0 || (k.key != "frontend.status_debounce" && k.d.Duration == 0) {
			add(k.key, "%s must be positive, got %s", k.key, k.d)
		}
	}
	// The cache refuses a user's token that no refresh vouched for within an hour.
	if fe.CacheTokenRefresh.Duration > 30*time.Minute {
		add("frontend.cache_token_refresh", "frontend.cache_token_refresh must be at most 30m (a user's cache token not refreshed for an hour reads nothing), got %s", fe.CacheTokenRefresh)
	}
	if fe.MaxWebhooksInFlight < 1 || fe.MaxWebhooksInFlight > 10000 {
		add("frontend.max_webhooks_in_flight", "frontend.max_webhooks_in_flight must be between 1 and 10000, got %d", fe.MaxWebhooksInFlight)
	}
	for _, k := range []struct {
		key   string
		rate  int
		burst int
	}{{"frontend.api_rate", fe.APIRate, fe.APIBurst}, {"frontend.api_anonymous_rate", fe.APIAnonymousRate, fe.APIAnonymousBurst}} {
		if k.rate < 0 || k.rate > 1e6 {
			add(k.key, "%s must be between 0 (no limit) and 1000000 requests a second, got %d", k.key, k.rate)
		}
		if burstKey := strings.Replace(k.key, "_rate", "_burst", 1); k.burst < 1 || k.burst > 1e6 {
			add(burstKey, "%s must be between 1 and 1000000, got %d", burstKey, k.burst)
		}
	}
	var names []string
	for i, f := range c.Forges {
		key := fmt.Sprintf("forges[%d]", i)
		switch {
		case !forgeNameRE.MatchString(f.Name):
			add(key+".name", "%s.name: invalid name %q (lower-case letters, digits, '_', '-'; at most 32; it appears in /webhook/{name})", key, f.Name)
		case f.Name == "git":
			add(key+".name", "%s.name: %q is reserved for projects added by URL", key, f.Name)
		case slices.Contains(names, f.Name):
			add(key+".name", "%s.name: duplicate forge name %q", key, f.Name)
		}
		names = append(names, f.Name)
		if f.MaxWebhookBody != 0 && (f.MaxWebhookBody < 1024 || f.MaxWebhookBody > 100*sizeMB) {
			add(key+".max_webhook_body", "%s.max_webhook_body must be between 1 KB and 100 MB, got %s", key, f.MaxWebhookBody)
		}
		checkURL := func(field, u string) {
			if p, err := url.Parse(u); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
				add(key+"."+field, "%s.%s: invalid URL %q (an absolute http or https URL)", key, field, u)
			}
		}
		// Only frontends talk to forges: other nodes may share the file without the secrets.
		frontend := c.HasRole(RoleFrontend)
		if frontend && f.WebhookSecret == "" {
			add(key+".webhook_secret_file", "%s: forge %s needs webhook_secret_file (or %sWEBHOOK_SECRET): deliveries are verified with it", key, f.Name, f.envPrefix())
		}
		switch {
		case f.OAuthClientID == "" && f.OAuthClientSecretFile != "":
			add(key+".oauth_client_id", "%s: forge %s has oauth_client_secret_file but no oauth_client_id", key, f.Name)
		case f.OAuthClientID != "" && frontend && f.OAuthClientSecret == "":
			add(key+".oauth_client_secret_file", "%s: forge %s needs oauth_client_secret_file (or %sOAUTH_SECRET) for its oauth_client_id", key, f.Name, f.envPrefix())
		case f.OAuthClientID != "" && frontend && len(c.Auth.Secret) < MinAuthSecret:
			add("auth.secret_file", "auth.secret_file: forge %s has oauth_client_id: web UI logins need a cookie secret of at least %d characters (auth.secret_file or HARMONIA_AUTH_SECRET)", f.Name, MinAuthSecret)
		}
		switch f.Type {
		case ForgeGitea:
			checkURL("url", f.URL)
			if frontend && f.Token == "" {
				add(key+".token_file", "%s: gitea forge %s needs token_file (or %sTOKEN)", key, f.Name, f.envPrefix())
			}
			if f.AppID != 0 || f.PrivateKeyFile != "" || f.APIURL != "" {
				add(key, "%s: app_id, private_key_file and api_url are for github forges, not gitea", key)
			}
		case ForgeGitHub:
			if f.URL != "" {
				checkURL("url", f.URL)
			}
			if f.APIURL != "" {
				checkURL("api_url", f.APIURL)
			}
			if f.AppID <= 0 {
				add(key+".app_id", "%s: github forge %s needs app_id (the GitHub App's id)", key, f.Name)
			}
			if frontend && f.PrivateKey == "" {
				add(key+".private_key_file", "%s: github forge %s needs private_key_file (or %sPRIVATE_KEY)", key, f.Name, f.envPrefix())
			}
			if f.TokenFile != "" {
				add(key+".token_file", "%s: token_file is for gitea forges; a GitHub App authenticates with its private key", key)
			}
		default:
			add(key+".type", "%s.type: unknown forge type %q (want gitea or github)", key, f.Type)
		}
	}
	c.authProblems(add, names)
}

// authProblems checks the web UI's [auth] keys: the cookie secret's length and the admins,
// "forge:login" with a configured forge.
func (c *Config) authProblems(add func(key, format string, args ...any), forges []string) {
	if c.Auth.Secret != "" && len(c.Auth.Secret) < MinAuthSecret {
		add("auth.secret_file", "auth.secret_file: the secret has %d characters, want at least %d (openssl rand -hex 32)", len(c.Auth.Secret), MinAuthSecret)
	}
	for i, a := range c.Auth.Admins {
		forge, login, ok := strings.Cut(a, ":")
		switch {
		case !ok || !forgeNameRE.MatchString(forge) || login == "" || strings.ContainsAny(login, " \t\n/:?#@"):
			add("auth.admins", "auth.admins[%d]: %q: want \"forge:login\", as \"gitea:alice\"", i, a)
		case c.HasRole(RoleFrontend) && !slices.Contains(forges, forge):
			add("auth.admins", "auth.admins[%d]: %q: no [[forges]] entry is named %s", i, a, forge)
		}
	}
}
