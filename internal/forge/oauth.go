package forge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/config"
)

// OAuth is a forge's user login: the OAuth2 authorization code flow, written with net/http
// (three calls; golang.org/x/oauth2 is not a dependency). harmonia-ci uses the access token once,
// to learn who logged in, and keeps nothing but the user's id and login.
type OAuth interface {
	// AuthorizeURL is the forge page that asks the user to let harmonia-ci know who they are,
	// and then sends them to redirectURL with a code and state.
	AuthorizeURL(state, redirectURL string) string
	// Exchange trades the code the forge sent to redirectURL for an access token.
	Exchange(ctx context.Context, code, redirectURL string) (accessToken string, err error)
	// User is the token's user: its numeric id (what harmonia-ci compares) and its login.
	User(ctx context.Context, token string) (User, error)
}

// OAuthConfig configures a forge's OAuth client.
type OAuthConfig struct {
	Type string // TypeGitea or TypeGitHub
	// WebURL is where users log in: the Gitea instance, or GitHub's web address (default
	// GitHubWebURL, or the Enterprise server APIURL names).
	WebURL string
	// APIURL is GitHub's REST API (default GitHubAPIURL); Gitea's is WebURL/api/v1.
	APIURL       string
	ClientID     string
	ClientSecret string
	HTTPClient   *http.Client // nil: a default one with a 30 s timeout
}

// oauthClient implements OAuth for Gitea and GitHub, whose flows differ only in addresses,
// scope and login rules.
type oauthClient struct {
	authorize, token string
	api              *api // GET {api}/user
	clientID, secret string
	scope            string
	extra            url.Values // more authorize parameters
	validLogin       func(string) error
	http             *http.Client
}

// NewOAuth returns the OAuth client of a Gitea or GitHub forge.
func NewOAuth(cfg OAuthConfig) (OAuth, error) {
	if cfg.ClientID == "" || cfg.ClientSecret == "" {
		return nil, errors.New("oauth: client id and secret are required")
	}
	c := &oauthClient{clientID: cfg.ClientID, secret: cfg.ClientSecret, http: cfg.HTTPClient, extra: url.Values{}}
	if c.http == nil {
		c.http = &http.Client{Timeout: 30 * time.Second}
	}
	var web, apiURL string
	switch cfg.Type {
	case TypeGitea:
		web = strings.TrimRight(cfg.WebURL, "/")
		apiURL = web + "/api/v1"
		// Gitea grants its OAuth tokens everything unless additional grant scopes are
		// enabled; read:user is all harmonia-ci needs then.
		c.scope = "read:user"
		c.extra.Set("response_type", "code")
		c.validLogin = ValidateLogin
	case TypeGitHub:
		apiURL = strings.TrimRight(cmpOr(cfg.APIURL, GitHubAPIURL), "/")
		u, err := url.Parse(apiURL)
		if err != nil {
			return nil, fmt.Errorf("oauth: api url %q: %w", apiURL, err)
		}
		web = strings.TrimRight(cmpOr(cfg.WebURL, githubWebURL(u)), "/")
		// No scope: a GitHub App's user token carries the App's permissions, and an OAuth
		// App's unscoped token reads public profile information, which is all we read.
		c.extra.Set("allow_signup", "false")
		c.validLogin = validGitHubLogin
	default:
		return nil, fmt.Errorf("oauth: unknown forge type %q", cfg.Type)
	}
	if u, err := url.Parse(web); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("oauth: web URL %q: want an absolute http(s) URL", web)
	}
	a, err := newAPI(apiURL, c.http)
	if err != nil {
		return nil, fmt.Errorf("oauth: %w", err)
	}
	a.header.Set("User-Agent", "harmonia-ci")
	if cfg.Type == TypeGitHub {
		a.header.Set("Accept", "application/vnd.github+json")
		a.header.Set("X-GitHub-Api-Version", githubAPIVersion)
	}
	c.api = a
	c.authorize = web + "/login/oauth/authorize"
	c.token = web + "/login/oauth/access_token"
	return c, nil
}

// AuthorizeURL implements OAuth.
func (c *oauthClient) AuthorizeURL(state, redirectURL string) string {
	q := url.Values{"client_id": {c.clientID}, "redirect_uri": {redirectURL}, "state": {state}}
	if c.scope != "" {
		q.Set("scope", c.scope)
	}
	for k, v := range c.extra {
		q[k] = v
	}
	return c.authorize + "?" + q.Encode()
}

// Exchange implements OAuth: POST {web}/login/oauth/access_token, a form, answered in JSON.
// GitHub reports a bad code with 200 and an "error" field, Gitea with 400: both are errors.
func (c *oauthClient) Exchange(ctx context.Context, code, redirectURL string) (string, error) {
	form := url.Values{
		"client_id": {c.clientID}, "client_secret": {c.secret}, "code": {code},
		"grant_type": {"authorization_code"}, "redirect_uri": {redirectURL},
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.token, strings.NewReader(form.Encode()))
	if err != nil {
		return "", fmt.Errorf("oauth token: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "harmonia-ci")
	resp, err := c.http.Do(req)
	if err != nil {
		return "", fmt.Errorf("oauth token: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", fmt.Errorf("oauth token: read answer: %w", err)
	}
	var t struct {
		AccessToken string `json:"access_token"`
		Error       string `json:"error"`
		Description string `json:"error_description"`
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "application/x-www-form-urlencoded" {
		q, _ := url.ParseQuery(string(data))
		t.AccessToken, t.Error, t.Description = q.Get("access_token"), q.Get("error"), q.Get("error_description")
	} else if err := json.Unmarshal(data, &t); err != nil && resp.StatusCode/100 == 2 {
		return "", fmt.Errorf("oauth token: %d answer is not JSON", resp.StatusCode)
	}
	switch {
	case t.Error != "":
		return "", fmt.Errorf("oauth token: %s: %s", t.Error, t.Description)
	case resp.StatusCode/100 != 2:
		return "", fmt.Errorf("oauth token: %d %s", resp.StatusCode, errorMessage(data))
	case t.AccessToken == "":
		return "", errors.New("oauth token: no access_token in the answer")
	}
	return t.AccessToken, nil
}

// User implements OAuth: GET {api}/user with the user's token.
func (c *oauthClient) User(ctx context.Context, token string) (User, error) {
	a := *c.api
	a.auth = func(_ context.Context, req *http.Request) error {
		req.Header.Set("Authorization", "Bearer "+token)
		return nil
	}
	a.sleep = func(context.Context, time.Duration) error { return errors.New("rate limited") } // a login does not wait
	var u struct {
		ID    int64  `json:"id"`
		Login string `json:"login"`
	}
	if _, err := a.do(ctx, http.MethodGet, a.url("/user", nil), nil, &u); err != nil {
		return User{}, fmt.Errorf("oauth user: %w", err)
	}
	if err := c.validLogin(u.Login); err != nil {
		return User{}, fmt.Errorf("oauth user: %w", err)
	}
	if u.ID <= 0 {
		return User{}, fmt.Errorf("oauth user %s: id %d", u.Login, u.ID)
	}
	return User{ID: u.ID, Login: u.Login}, nil
}

// OAuthFromConfig builds the OAuth clients of the [[forges]] that have oauth_client_id, by
// forge name.
func OAuthFromConfig(cfgs []config.ForgeConfig) (map[string]OAuth, error) {
	out := map[string]OAuth{}
	for _, c := range cfgs {
		if c.OAuthClientID == "" {
			continue
		}
		o, err := NewOAuth(OAuthConfig{Type: c.Type, WebURL: c.URL, APIURL: c.APIURL,
			ClientID: c.OAuthClientID, ClientSecret: c.OAuthClientSecret})
		if err != nil {
			return nil, fmt.Errorf("forge %s: %w", c.Name, err)
		}
		out[c.Name] = o
	}
	return out, nil
}
