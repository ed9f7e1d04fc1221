package forge

import (
	"context"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/gitrepo"
)

// GitHub App authentication: the App signs a short-lived JWT with its private key, which only
// serves /app/* (and finding a repository's installation); everything else uses an
// installation access token exchanged for the JWT, valid one hour.
const (
	// jwtBackdate covers clock drift: GitHub rejects an iat in its future.
	jwtBackdate = 60 * time.Second
	// jwtLifetime is counted from now; with the backdate exp-iat is 10 minutes, GitHub's limit.
	jwtLifetime = 9 * time.Minute
	// tokenRefresh is how long before expires_at a cached installation token is replaced, so no
	// request starts with a token that runs out on the way.
	tokenRefresh = 5 * time.Minute
)

// parseRSAKey reads a PEM private key, PKCS#1 ("RSA PRIVATE KEY", what GitHub hands out) or
// PKCS#8 ("PRIVATE KEY").
func parseRSAKey(data []byte) (*rsa.PrivateKey, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	if k, err := x509.ParsePKCS1PrivateKey(block.Bytes); err == nil {
		return k, nil
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s block is neither PKCS#1 nor PKCS#8: %w", block.Type, err)
	}
	rk, ok := k.(*rsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%T key, want RSA", k)
	}
	return rk, nil
}

// appJWT signs a JWT that authenticates as the App.
func (g *GitHub) appJWT() (string, error) {
	now := time.Now()
	claims := jwt.RegisteredClaims{
		Issuer:    strconv.FormatInt(g.appID, 10),
		IssuedAt:  jwt.NewNumericDate(now.Add(-jwtBackdate)),
		ExpiresAt: jwt.NewNumericDate(now.Add(jwtLifetime)),
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodRS256, claims).SignedString(g.key)
	if err != nil {
		return "", fmt.Errorf("sign app JWT: %w", err)
	}
	return s, nil
}

// appAPI is the client authenticated as the App. A fresh JWT per request: a rate-limit wait
// may outlast one.
func (g *GitHub) appAPI() *api {
	a := *g.api
	a.auth = func(_ context.Context, req *http.Request) error {
		tok, err := g.appJWT()
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		return nil
	}
	return &a
}

// installationToken is one installation's cached access token. sem (capacity 1) is held while
// a token is exchanged, so concurrent callers wait for that exchange instead of making their
// own; it is a channel so that waiting honours the context.
type installationToken struct {
	sem     chan struct{}
	token   string
	expires time.Time
}

// token returns a valid access token of installation id, exchanging a new one when the cached
// one is missing or about to expire.
func (g *GitHub) token(ctx context.Context, id int64) (string, error) {
	g.mu.Lock()
	t := g.tokens[id]
	if t == nil {
		t = &installationToken{sem: make(chan struct{}, 1)}
		g.tokens[id] = t
	}
	g.mu.Unlock()
	select {
	case t.sem <- struct{}{}:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	defer func() { <-t.sem }()
	if t.token != "" && time.Now().Add(tokenRefresh).Before(t.expires) {
		return t.token, nil
	}
	var out struct {
		Token     string    `json:"token"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	u := g.endpoint(nil, "app", "installations", strconv.FormatInt(id, 10), "access_tokens")
	if _, err := g.appAPI().do(ctx, http.MethodPost, u, nil, &out); err != nil {
		return "", fmt.Errorf("installation %d access token: %w", id, err)
	}
	if out.Token == "" || out.ExpiresAt.IsZero() {
		return "", fmt.Errorf("installation %d access token: answer without token or expires_at", id)
	}
	t.token, t.expires = out.Token, out.ExpiresAt
	return t.token, nil
}

// forgetToken drops tok from the cache after GitHub refused it (revoked, or the clocks
// disagree), unless another caller has replaced it already.
func (g *GitHub) forgetToken(ctx context.Context, id int64, tok string) {
	g.mu.Lock()
	t := g.tokens[id]
	g.mu.Unlock()
	if t == nil {
		return
	}
	select {
	case t.sem <- struct{}{}:
	case <-ctx.Done():
		return
	}
	if t.token == tok {
		t.token = ""
	}
	<-t.sem
}

// installationAPI is the client authenticated as installation id; used receives the token each
// request carried.
func (g *GitHub) installationAPI(id int64, used *string) *api {
	a := *g.api
	a.auth = func(ctx context.Context, req *http.Request) error {
		tok, err := g.token(ctx, id)
		if err != nil {
			return err
		}
		*used = tok
		req.Header.Set("Authorization", "Bearer "+tok)
		return nil
	}
	return &a
}

// installationFor is the installation that can act on repo: the one the caller knows, else
// one learnt from ListRepositories, else GitHub's answer to GET /repos/{o}/{r}/installation.
func (g *GitHub) installationFor(ctx context.Context, repo Repo) (int64, error) {
	if repo.InstallationID > 0 {
		return repo.InstallationID, nil
	}
	key := strings.ToLower(repo.FullName())
	g.mu.Lock()
	id := g.installs[key]
	g.mu.Unlock()
	if id > 0 {
		return id, nil
	}
	var inst struct {
		ID int64 `json:"id"`
	}
	if _, err := g.appAPI().do(ctx, http.MethodGet, g.repoURL(repo, nil, "installation"), nil, &inst); err != nil {
		return 0, fmt.Errorf("installation of %s: %w", repo.FullName(), err)
	}
	if inst.ID <= 0 {
		return 0, fmt.Errorf("installation of %s: id %d", repo.FullName(), inst.ID)
	}
	g.mu.Lock()
	g.installs[key] = inst.ID
	g.mu.Unlock()
	return inst.ID, nil
}

// repoDo makes one API call as the installation that holds repo. A 401 drops the cached token
// and tries once more with a new one.
func (g *GitHub) repoDo(ctx context.Context, repo Repo, method, rawURL string, body, out any) (http.Header, error) {
	id, err := g.installationFor(ctx, repo)
	if err != nil {
		return nil, err
	}
	return g.installationDo(ctx, id, method, rawURL, body, out)
}

func (g *GitHub) installationDo(ctx context.Context, id int64, method, rawURL string, body, out any) (http.Header, error) {
	for attempt := 0; ; attempt++ {
		var used string
		h, err := g.installationAPI(id, &used).do(ctx, method, rawURL, body, out)
		var ae *APIError
		if attempt == 0 && used != "" && errors.As(err, &ae) && ae.Code == http.StatusUnauthorized {
			g.forgetToken(ctx, id, used)
			continue
		}
		return h, err
	}
}

// endpoint is the API URL of the path made of segments, each escaped on its own (a branch's
// '/' becomes %2F), with query.
func (g *GitHub) endpoint(query url.Values, segments ...string) string {
	u := *g.api.base
	var path, raw strings.Builder
	for _, s := range segments {
		path.WriteString("/" + s)
		raw.WriteString("/" + url.PathEscape(s))
	}
	u.Path = g.api.base.Path + path.String()
	u.RawPath = g.api.base.EscapedPath() + raw.String()
	if query != nil {
		u.RawQuery = query.Encode()
	}
	return u.String()
}

// repoURL is endpoint under /repos/{owner}/{name}.
func (g *GitHub) repoURL(repo Repo, query url.Values, segments ...string) string {
	return g.endpoint(query, append([]string{"repos", repo.Owner, repo.Name}, segments...)...)
}

// ReadCredential implements Forge: a new installation token (never the cached one the CI
// acts with) that GitHub scopes to repo alone, by its id when known, with contents: read and
// nothing else, for basic authentication over https as x-access-token. It expires within the
// hour; the evaluator that fetches with it revokes it at once after (RevokeURL).
func (g *GitHub) ReadCredential(ctx context.Context, repo Repository) (gitrepo.Credential, error) {
	id, err := g.installationFor(ctx, repo.Repo)
	if err != nil {
		return gitrepo.Credential{}, err
	}
	body := map[string]any{"permissions": map[string]string{"contents": "read"}}
	if repo.ForgeID > 0 {
		body["repository_ids"] = []int64{repo.ForgeID}
	} else {
		body["repositories"] = []string{repo.Name}
	}
	var out struct {
		Token       string            `json:"token"`
		ExpiresAt   time.Time         `json:"expires_at"`
		Permissions map[string]string `json:"permissions"`
	}
	u := g.endpoint(nil, "app", "installations", strconv.FormatInt(id, 10), "access_tokens")
	if _, err := g.appAPI().do(ctx, http.MethodPost, u, body, &out); err != nil {
		return gitrepo.Credential{}, fmt.Errorf("read token for %s: %w", repo.FullName(), err)
	}
	if out.Token == "" {
		return gitrepo.Credential{}, fmt.Errorf("read token for %s: answer without a token", repo.FullName())
	}
	// GitHub grants at most what was asked; a token that could do more is not handed on.
	for p, level := range out.Permissions {
		if p != "contents" && p != "metadata" || level != "read" {
			return gitrepo.Credential{}, fmt.Errorf("read token for %s: granted %s: %s, want contents: read only", repo.FullName(), p, level)
		}
	}
	return gitrepo.Credential{URL: repo.CloneURL, Username: "x-access-token", Token: out.Token, Expires: out.ExpiresAt,
		RevokeURL: g.endpoint(nil, "installation", "token")}, nil
}
