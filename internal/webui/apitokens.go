package webui

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/apitoken"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/ratelimit"
)

// The HTTP API's bearer tokens (package apitoken) and its rate limits. Every route of people,
// the pages (/ci/) and the API (/api/) but for the signed ones (nodes, webhooks, presigned
// uploads), passes through front first:
//
//   - "Authorization: Bearer <token>" is the admin token, or a live API token, which front
//     resolves once and puts in the request's context: Caller and authenticate read it there. Any
//     other bearer token (wrong, revoked, expired; a cache token) is refused with a 401 at once,
//     never taken for anonymous: a script learns its token is bad.
//   - The API's routes (/api/, but for the pages' event streams) are rate-limited: a token
//     bucket per token (or logged-in user, or the admin token), and a stricter one per anonymous
//     client's address. A refusal is a 429 with Retry-After. The pages are not limited: a script
//     cannot starve the UI of its users.
//
// A user mints, lists and revokes their personal tokens on /ci/tokens, next to their cache
// tokens:
//
//	POST /ci/tokens/api              mint one (name, days); the answer shows it, once
//	POST /ci/tokens/api/{id}/revoke  revoke one of the viewer's (an admin: anyone's)
//	GET  /ci/tokens/cli              harmonia-ci login: confirm a token for the command line
//	POST /ci/tokens/cli              mint it and hand it to the command line's callback

// Default rate limits of the API, per second and burst: per token or user, per anonymous client.
const (
	DefaultAPIRate        = 20
	DefaultAPIBurst       = 100
	DefaultAnonymousRate  = 5
	DefaultAnonymousBurst = 50
)

// maxAPITokens bounds a user's live API tokens.
const maxAPITokens = 50

// RateLimits configures the API's rate limits; a zero field takes its default, a negative rate
// turns that limit off.
type RateLimits struct {
	Rate, AnonymousRate   float64
	Burst, AnonymousBurst int
	// Now is the limiters' clock; nil: time.Now.
	Now func() time.Time
}

// limiters are the API's token buckets.
type limiters struct {
	user, anon *ratelimit.Limiter
}

func newLimiters(c RateLimits) limiters {
	rate := func(v, def float64) float64 {
		if v == 0 {
			return def
		}
		return v
	}
	burst := func(v, def int) int {
		if v <= 0 {
			return def
		}
		return v
	}
	return limiters{
		user: ratelimit.New(rate(c.Rate, DefaultAPIRate), burst(c.Burst, DefaultAPIBurst), 0, c.Now),
		anon: ratelimit.New(rate(c.AnonymousRate, DefaultAnonymousRate), burst(c.AnonymousBurst, DefaultAnonymousBurst), 0, c.Now),
	}
}

type tokenKey struct{}

// tokenOf is the API token front resolved for r.
func tokenOf(r *http.Request) (apitoken.Identity, bool) {
	id, ok := r.Context().Value(tokenKey{}).(apitoken.Identity)
	return id, ok
}

// peopleRoute reports whether route is one of people's: a page or the API, not signed.
func peopleRoute(route access.Route) bool {
	p := route.Path()
	return route.Scope.Kind != access.KindSigned && (strings.HasPrefix(p, "/api/") || strings.HasPrefix(p, "/ci/"))
}

// front authenticates bearer tokens and rate-limits the API (see the top of this file).
func (u *UI) front(w http.ResponseWriter, r *http.Request, route access.Route, next http.Handler) {
	if !peopleRoute(route) {
		next.ServeHTTP(w, r)
		return
	}
	// Event streams are the pages' live views (the build page's log among them), one long
	// request each and capped per node: not limited with the API.
	api := strings.HasPrefix(route.Path(), "/api/") && !strings.HasPrefix(route.Path(), "/api/events/") && !httpapi.Accepts(r, "Accept", "text/event-stream")
	key := ""
	if tok, ok := httpapi.BearerToken(r); ok {
		switch {
		case u.auth.hasAdmin && u.auth.admin.Matches(tok):
			key = "admin"
		default:
			id, ok, err := apitoken.Lookup(r.Context(), u.cfg.Pool, tok)
			if err != nil {
				u.fail(w, r, err, "/ci/")
				return
			}
			if !ok {
				// A bad token costs its client's anonymous bucket: guessing is limited too.
				if !u.allow(w, r, u.limits.anon, "addr:"+clientAddr(r)) {
					return
				}
				httpapi.Handle(u.log, func(w http.ResponseWriter, _ *http.Request) error {
					return httpapi.Unauthorized(w, "invalid, revoked or expired token")
				}).ServeHTTP(w, r)
				return
			}
			if id.LastUsed == nil || time.Since(*id.LastUsed) >= apitoken.TouchEvery {
				if err := apitoken.Touch(r.Context(), u.cfg.Pool, id.ID); err != nil {
					u.log.Warn("api token's last use not recorded", "token_id", id.ID, "error", err)
				}
			}
			r = r.WithContext(context.WithValue(r.Context(), tokenKey{}, id))
			key = "token:" + strconv.FormatInt(id.ID, 10)
		}
	}
	if !api {
		next.ServeHTTP(w, r)
		return
	}
	lim := u.limits.user
	if key == "" {
		if s, ok := u.session(r); ok {
			key = "user:" + s.Forge + ":" + strconv.FormatInt(s.UserID, 10)
		} else {
			lim, key = u.limits.anon, "addr:"+clientAddr(r)
		}
	}
	if !u.allow(w, r, lim, key) {
		return
	}
	next.ServeHTTP(w, r)
}

// allow takes a token of key's bucket, or answers 429 with Retry-After.
func (u *UI) allow(w http.ResponseWriter, r *http.Request, lim *ratelimit.Limiter, key string) bool {
	ok, retry := lim.Allow(key)
	if ok {
		return true
	}
	httpapi.Handle(u.log, func(http.ResponseWriter, *http.Request) error {
		return &httpapi.Error{Code: http.StatusTooManyRequests, Msg: fmt.Sprintf("rate limited: retry in %d s", retry),
			Header: http.Header{"Retry-After": {strconv.Itoa(retry)}}}
	}).ServeHTTP(w, r)
	return false
}

// clientAddr is the address the request came from (the TCP peer: no proxy header is trusted).
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// tokenCaller is the caller an API token is.
func (u *UI) tokenCaller(ctx context.Context, id apitoken.Identity) access.Caller {
	c := access.Caller{TokenID: id.ID, TokenName: id.Name}
	switch {
	case !id.Machine():
		c.Kind, c.Admin, c.Forge, c.Login, c.UserID = access.User, u.isAdmin(ctx, id.Forge, id.UserID), id.Forge, id.Login, id.UserID
	case id.Admin:
		c.Kind, c.Admin = access.AdminToken, true
	default:
		c.Kind, c.Repos = access.MachineToken, id.Repos
	}
	return c
}

// tokenActor is the actor an API token is.
func (u *UI) tokenActor(ctx context.Context, id apitoken.Identity) actor {
	c := u.tokenCaller(ctx, id)
	return actor{token: c.Kind == access.AdminToken, admin: c.Admin, forge: c.Forge, login: c.Login, userID: c.UserID,
		tokenID: id.ID, tokenName: id.Name}
}

// APITokenRow is an API token as the tokens page lists it.
type APITokenRow = apitoken.Info

// MintedAPIToken is an API token just minted, shown once.
type MintedAPIToken struct {
	ID        int64
	Name      string
	Token     string
	ExpiresAt time.Time
}

// sessionActor is the actor of r's session, or a 401.
func (u *UI) sessionActor(r *http.Request) (actor, error) {
	s, in := u.session(r)
	if !in {
		return actor{}, httpapi.Errorf(http.StatusUnauthorized, "log in first")
	}
	return actor{admin: u.isAdmin(r.Context(), s.Forge, s.UserID), forge: s.Forge, login: s.Login, userID: s.UserID}, nil
}

// userPost authenticates a tokens POST that only a logged-in user makes (not a token: a token
// does not mint tokens).
func (u *UI) userPost(w http.ResponseWriter, r *http.Request) (*http.Request, actor, context.CancelFunc, error) {
	r, who, cancel, err := u.tokenPost(w, r)
	if err == nil && (who.token || who.tokenID != 0) {
		err = httpapi.Errorf(http.StatusBadRequest, "tokens are minted by logged-in users in the browser, or by an admin with harmonia-ci api-token")
	}
	return r, who, cancel, err
}

// mintAPIToken is POST /ci/tokens/api (name, days): a personal API token, shown once.
func (u *UI) mintAPIToken(w http.ResponseWriter, r *http.Request) {
	r, who, cancel, err := u.userPost(w, r)
	defer cancel()
	if err != nil {
		u.fail(w, r, err, "/ci/tokens")
		return
	}
	name := strings.TrimSpace(r.PostFormValue("name"))
	days, err := formDays(r)
	if err == nil {
		err = checkName(name)
	}
	if err != nil {
		u.fail(w, r, err, "/ci/tokens")
		return
	}
	m, err := u.mintFor(r.Context(), who, name, days)
	if err != nil {
		u.fail(w, r, err, "/ci/tokens")
		return
	}
	if !browserForm(r) {
		httpapi.WriteJSON(w, http.StatusOK, map[string]any{"id": m.ID, "token": m.Token, "name": name, "expires_at": m.ExpiresAt})
		return
	}
	u.mintedPage(w, r, who, func(d *TokensPage) { d.MintedAPI = &m })
}

// checkName is apitoken.CheckName as a 400.
func checkName(name string) error {
	if err := apitoken.CheckName(name); err != nil {
		return badRequest("%s", err.Error())
	}
	return nil
}

// mintFor mints a personal API token of who.
func (u *UI) mintFor(ctx context.Context, who actor, name string, days int) (MintedAPIToken, error) {
	m, err := apitoken.MintUser(ctx, u.cfg.Pool, who.forge, who.userID, who.login, name, days, maxAPITokens)
	if errors.Is(err, apitoken.ErrTooMany) {
		return MintedAPIToken{}, httpapi.Errorf(http.StatusConflict, "you have %d live API tokens: revoke one first", maxAPITokens)
	}
	if err != nil {
		return MintedAPIToken{}, err
	}
	u.log.Info("api token minted", "id", m.ID, "by", who.String(), "days", days)
	return MintedAPIToken{ID: m.ID, Name: name, Token: m.Token, ExpiresAt: m.ExpiresAt}, nil
}

// revokeAPIToken is POST /ci/tokens/api/{id}/revoke: one of the user's API tokens (an admin:
// anyone's) revoked; it is refused from its next request.
func (u *UI) revokeAPIToken(w http.ResponseWriter, r *http.Request) {
	u.revoke(w, r, "API token", "api-revoked", func(ctx context.Context, id int64, forgeName string, userID int64) (bool, error) {
		err := apitoken.Revoke(ctx, u.cfg.Pool, id, forgeName, userID)
		if errors.Is(err, apitoken.ErrNoToken) {
			return false, nil
		}
		return err == nil, err
	})
}
