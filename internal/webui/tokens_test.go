package webui

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/cache"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

var mintedRE = regexp.MustCompile(`id="minted-token">(hcc1_[A-Za-z0-9_-]+)<`)

// html is the header of a browser's form post.
var acceptHTML = map[string]string{"Accept": "text/html"}

// mint mints a token as b through the tokens page's form and returns it.
func (b *browser) mint(note string) string {
	b.fx.t.Helper()
	resp, body := b.post("/ci/tokens", url.Values{"csrf": {b.csrf()}, "note": {note}, "days": {"30"}}, acceptHTML)
	m := mintedRE.FindStringSubmatch(body)
	if resp.StatusCode != http.StatusOK || m == nil {
		b.fx.t.Fatalf("mint a cache token: %d, no token on the page:\n%s", resp.StatusCode, body)
	}
	if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
		b.fx.t.Errorf("the page showing a token: Cache-Control %q, want no-store", cc)
	}
	return m[1]
}

// tokenReads reports whether the cache lets token (as a netrc password) read the store paths
// of hash part hash, and whether they are private.
func (fx *authFixture) tokenReads(token, hash string) (ok, private bool) {
	fx.t.Helper()
	v := &cache.Visibility{DB: fx.pool}
	req := httptest.NewRequestWithContext(fx.ctx, http.MethodGet, "/"+hash+".narinfo", nil)
	if token != "" {
		req.SetBasicAuth("nix", token)
	}
	ok, private, err := v.MayRead(fx.ctx, req, hash)
	if err != nil {
		fx.t.Fatalf("visibility of %s: %v", hash, err)
	}
	return ok, private
}

// refresh runs the maintenance leader's token refresh once (its fenced write in a plain
// transaction: the test holds no leadership).
func (fx *authFixture) refresh() {
	fx.t.Helper()
	write, err := fx.u.TokenRefreshTask(0).Prepare(fx.ctx)
	if err != nil {
		fx.t.Fatalf("refresh cache tokens: %v", err)
	}
	if write == nil {
		return
	}
	tx, err := fx.pool.Begin(fx.ctx)
	if err != nil {
		fx.t.Fatal(err)
	}
	defer tx.Rollback(fx.ctx)
	if _, err := write(fx.ctx, tx); err != nil {
		fx.t.Fatalf("refresh cache tokens: %v", err)
	}
	if err := tx.Commit(fx.ctx); err != nil {
		fx.t.Fatal(err)
	}
}

func tokenID(t *testing.T, body, note string) int64 {
	t.Helper()
	m := regexp.MustCompile(`<tr id="token-(\d+)">\s*<td>#\d+</td>(?:<td>[^<]*</td>)?\s*<td>` + regexp.QuoteMeta(note) + `</td>`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no token %q listed:\n%s", note, body)
	}
	var id int64
	fmt.Sscan(m[1], &id)
	return id
}

// A user mints, lists and revokes their own cache tokens on /ci/tokens; the token reads the
// private paths of the projects the forge lets them read, and stops when revoked, when the
// forge takes their access back (at the next refresh), and when no refresh has vouched for
// it for an hour. Nobody else sees or revokes it; a post without the CSRF token is refused.
func TestUserCacheTokens(t *testing.T) {
	fx := newAuthFixture(t)
	secret := fx.project("secret", "github", "octo/secret", true)
	fx.project("app", "github", "octo/app", false)
	_, drv := fx.job(secret, 0, status.JobSucceeded)
	hash := strings.TrimPrefix(drv, "/nix/store/")[:32]

	if ok, private := fx.tokenReads("", hash); ok || !private {
		t.Fatalf("the private project's path anonymously: readable %v, private %v; want a private path refused", ok, private)
	}

	friend := fx.browser().login("friend") // reads octo/secret on the forge
	if resp, body := friend.get("/ci/tokens"); resp.StatusCode != http.StatusOK || !strings.Contains(body, "No token yet") {
		t.Fatalf("GET /ci/tokens: %d\n%s", resp.StatusCode, body)
	}
	token := friend.mint("laptop-zq7")
	if ok, _ := fx.tokenReads(token, hash); !ok {
		t.Fatalf("the friend's token does not read the private path")
	}
	if ok, _ := fx.tokenReads("hcc1_"+strings.Repeat("A", 43), hash); ok {
		t.Fatalf("a made-up token reads the private path")
	}
	_, body := friend.get("/ci/tokens")
	id := tokenID(t, body, "laptop-zq7")
	if strings.Contains(body, token) {
		t.Errorf("the list shows the token itself")
	}
	if !strings.Contains(body, "secret") {
		t.Errorf("the list does not say the token reads secret:\n%s", body)
	}

	// CSRF: a post without the token, or with another's, is refused and changes nothing.
	for _, csrf := range []string{"", "forged"} {
		if resp, _ := friend.post("/ci/tokens", url.Values{"csrf": {csrf}, "note": {"csrf"}}, acceptHTML); resp.StatusCode != http.StatusForbidden {
			t.Errorf("mint with csrf %q: %d, want 403", csrf, resp.StatusCode)
		}
		if resp, _ := friend.post(fmt.Sprintf("/ci/tokens/%d/revoke", id), url.Values{"csrf": {csrf}}, acceptHTML); resp.StatusCode != http.StatusForbidden {
			t.Errorf("revoke with csrf %q: %d, want 403", csrf, resp.StatusCode)
		}
	}
	if ok, _ := fx.tokenReads(token, hash); !ok {
		t.Fatalf("a refused revocation revoked the token")
	}

	// Another user sees none of it and cannot revoke it: the same 404 as no token.
	reader := fx.browser().login("reader")
	if _, body := reader.get("/ci/tokens"); strings.Contains(body, "laptop-zq7") || strings.Contains(body, fmt.Sprintf(`id="token-%d"`, id)) {
		t.Errorf("another user's tokens page lists the friend's token %d:\n%s", id, body)
	}
	resp, _ := reader.post(fmt.Sprintf("/ci/tokens/%d/revoke", id), url.Values{"csrf": {reader.csrf()}}, nil)
	resp2, _ := reader.post("/ci/tokens/999999/revoke", url.Values{"csrf": {reader.csrf()}}, nil)
	if resp.StatusCode != http.StatusNotFound || resp2.StatusCode != http.StatusNotFound {
		t.Errorf("another user's revocation: %d (no such token: %d), want 404 for both", resp.StatusCode, resp2.StatusCode)
	}
	readerToken := reader.mint("reader's")
	if ok, _ := fx.tokenReads(readerToken, hash); ok {
		t.Errorf("the token of a user who may not read the project reads its private path")
	}
	// Logged out: the page sends the browser to the login; a post is refused.
	anon := fx.browser()
	if resp, _ := anon.get("/ci/tokens"); resp.StatusCode != http.StatusFound || !strings.HasPrefix(resp.Header.Get("Location"), "/ci/login") {
		t.Errorf("GET /ci/tokens logged out: %d to %q, want the login", resp.StatusCode, resp.Header.Get("Location"))
	}
	if resp, _ := anon.post("/ci/tokens", url.Values{"note": {"x"}}, nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("mint logged out: %d, want 401", resp.StatusCode)
	}

	// The admin sees everyone's tokens, with whose they are.
	boss := fx.browser().login("boss")
	if _, body := boss.get("/ci/tokens"); !strings.Contains(body, "github:friend") || !strings.Contains(body, "github:reader") {
		t.Errorf("the admin's tokens page does not list everyone's tokens with their owners:\n%s", body)
	}
	tokens, err := cache.ListTokens(fx.ctx, fx.pool)
	if err != nil || len(tokens) != 2 || tokens[1].Owner != "github:friend" {
		t.Errorf("cache.ListTokens: %+v, %v; want two, the friend's owned by github:friend", tokens, err)
	}

	// The owner revokes it: the cache refuses it from then on.
	resp, _ = friend.post(fmt.Sprintf("/ci/tokens/%d/revoke", id), url.Values{"csrf": {friend.csrf()}}, acceptHTML)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ci/tokens?notice=revoked" {
		t.Errorf("revoke: %d to %q, want 303 to the tokens page", resp.StatusCode, resp.Header.Get("Location"))
	}
	if ok, _ := fx.tokenReads(token, hash); ok {
		t.Fatalf("a revoked token still reads the private path")
	}

	// The forge takes the friend's access back: the next refresh stops the token. While the
	// access holds, a refresh keeps it.
	token = friend.mint("desktop")
	fx.refresh()
	if ok, _ := fx.tokenReads(token, hash); !ok {
		t.Fatalf("a refresh with the access unchanged stopped the token")
	}
	fx.gh.SetPermission("octo/secret", "friend", "none")
	if ok, _ := fx.tokenReads(token, hash); !ok {
		t.Fatalf("the token stopped before the refresh") // the refresh is what changes it
	}
	fx.refresh()
	if ok, _ := fx.tokenReads(token, hash); ok {
		t.Fatalf("after the forge took the access back and the refresh ran, the token still reads the private path")
	}
	fx.gh.SetPermission("octo/secret", "friend", "read")
	fx.refresh()
	if ok, _ := fx.tokenReads(token, hash); !ok {
		t.Fatalf("the access given back: the refresh did not restore the token's projects")
	}

	// A token no refresh vouched for within the hour reads nothing (fails closed).
	if _, err := fx.pool.Exec(fx.ctx, `UPDATE cache_tokens SET refreshed_at = now() - interval '61 minutes' WHERE user_id IS NOT NULL`); err != nil {
		t.Fatal(err)
	}
	if ok, _ := fx.tokenReads(token, hash); ok {
		t.Fatalf("a token not refreshed for an hour still reads the private path")
	}
}

// A user has at most maxLiveTokens live tokens: one more is refused until one is revoked.
func TestUserCacheTokensBounded(t *testing.T) {
	fx := newAuthFixture(t)
	friend := fx.browser().login("friend")
	fx.id(`INSERT INTO cache_tokens (token_hash, project_ids, expires_at, forge, user_id, login, refreshed_at)
SELECT sha256(i::text::bytea), '{}', now() + interval '1 day', 'github', $1, 'friend', now()
FROM generate_series(1, $2) i RETURNING 1`, fx.gh.UserID("friend"), maxLiveTokens)
	resp, body := friend.post("/ci/tokens", url.Values{"csrf": {friend.csrf()}, "note": {"one more"}}, nil)
	if resp.StatusCode != http.StatusConflict || !strings.Contains(body, "revoke one first") {
		t.Fatalf("mint past the bound: %d %s, want 409", resp.StatusCode, body)
	}
	if _, err := fx.pool.Exec(fx.ctx, `UPDATE cache_tokens SET revoked_at = now() WHERE id = (SELECT min(id) FROM cache_tokens)`); err != nil {
		t.Fatal(err)
	}
	friend.mint("one more")
}
