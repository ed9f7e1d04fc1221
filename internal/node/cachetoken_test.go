package node_test

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/githubtest"
	"github.com/harmonia-ci/harmonia-ci/internal/node"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

// A frontend node's maintenance leader refreshes users' cache tokens from the forge every
// [frontend] cache_token_refresh: a token's projects follow its user's read access.
func TestFrontendRefreshesUserCacheTokens(t *testing.T) {
	t.Parallel()
	gh := githubtest.New(t)
	gh.AddInstallation(7, githubtest.Repo{FullName: "octo/hidden", Private: true})
	gh.SetPermission("octo/hidden", "friend", "read")

	cfg := config.Default()
	cfg.DatabaseURL, cfg.StateDir, cfg.Listen = dbtest.NewDB(t), t.TempDir(), "127.0.0.1:0"
	cfg.Node.ID = "tokens"
	cfg.Node.Roles = []string{config.RoleFrontend}
	cfg.Auth.Secret = randomHex(t)
	cfg.Frontend.CacheTokenRefresh = config.Duration{Duration: 100 * time.Millisecond}
	cfg.Forges = []config.ForgeConfig{{Name: "github", Type: config.ForgeGitHub, URL: gh.URL, APIURL: gh.URL,
		AppID: int(gh.AppID), PrivateKey: string(gh.PrivateKeyPEM), WebhookSecret: string(gh.WebhookSecret),
		OAuthClientID: gh.OAuthClientID, OAuthClientSecret: gh.OAuthClientSecret}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ready, done := make(chan struct{}), make(chan struct{})
	ctx, stop := context.WithCancel(context.Background())
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
	var runErr error
	go func() {
		defer close(done)
		runErr = node.Run(ctx, cfg, logger, node.Options{Version: "test", Ready: func() { close(ready) }})
	}()
	t.Cleanup(func() { stop(); <-done })
	select {
	case <-ready:
	case <-done:
		t.Fatalf("node stopped before it was ready: %v", runErr)
	case <-time.After(2 * time.Minute):
		t.Fatal("node not ready")
	}

	pool := dbtest.PoolAs(t, cfg.DatabaseURL, "")
	var project, token int64
	if err := pool.QueryRow(t.Context(), `
WITH r AS (
    INSERT INTO repositories (forge, owner, name, full_name, clone_url, is_private, installation_id)
    VALUES ('github', 'octo', 'hidden', 'octo/hidden', 'https://github.example/octo/hidden.git', true, 7)
    ON CONFLICT (forge, full_name) DO UPDATE SET is_private = true RETURNING id)
INSERT INTO projects (repo_id, name) SELECT id, 'hidden' FROM r RETURNING id`).Scan(&project); err != nil {
		t.Fatal(err)
	}
	// A token minted before the user could read the project: it reads nothing yet.
	if err := pool.QueryRow(t.Context(), `
INSERT INTO cache_tokens (token_hash, project_ids, expires_at, forge, user_id, login, refreshed_at)
VALUES (sha256('friend'), '{}', now() + interval '1 day', 'github', $1, 'friend', now()) RETURNING id`,
		gh.UserID("friend")).Scan(&token); err != nil {
		t.Fatal(err)
	}
	projects := func() []int64 {
		var ids []int64
		if err := pool.QueryRow(t.Context(), `SELECT project_ids FROM cache_tokens WHERE id = $1`, token).Scan(&ids); err != nil {
			t.Fatal(err)
		}
		return ids
	}
	waittest.For(t, 30*time.Second, func() bool { return slices.Equal(projects(), []int64{project}) },
		"the token's projects are not refreshed to the one friend reads: %v", projects())
	gh.SetPermission("octo/hidden", "friend", "none")
	waittest.For(t, 30*time.Second, func() bool { return len(projects()) == 0 },
		"the forge took friend's access back, but the token still reads %v", projects())
}
