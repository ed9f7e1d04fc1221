package forge

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/giteatest"
)

// A real Gitea: a user's id follows the account through a rename, and the old login, taken
// by someone else, names another id.
func TestGiteaUserIDForReal(t *testing.T) {
	giteatest.Need(t)
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, err := giteatest.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	g, err := NewGitea(GiteaConfig{Name: "gitea", URL: srv.URL, Token: srv.AdminToken, WebhookSecret: []byte("s")})
	if err != nil {
		t.Fatal(err)
	}
	alice, err := srv.CreateUser(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if id, err := g.UserID(ctx, "Alice"); err != nil || id != alice.ID {
		t.Fatalf("UserID(Alice) = %d, %v; want %d", id, err, alice.ID)
	}
	if _, err := srv.RenameUser(ctx, alice, "alice2"); err != nil {
		t.Fatal(err)
	}
	if id, err := g.UserID(ctx, "alice2"); err != nil || id != alice.ID {
		t.Errorf("UserID(alice2) after the rename = %d, %v; want %d", id, err, alice.ID)
	}
	if id, err := g.UserID(ctx, "alice"); !errors.Is(err, ErrNotFound) {
		t.Errorf("UserID(alice) after the rename = %d, %v; want ErrNotFound", id, err)
	}
	squatter, err := srv.CreateUser(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if id, err := g.UserID(ctx, "alice"); err != nil || id != squatter.ID || id == alice.ID {
		t.Errorf("UserID(alice) taken over = %d, %v; want the new account's %d", id, err, squatter.ID)
	}
	if _, err := g.UserID(ctx, "../admin"); err == nil {
		t.Error("UserID accepted a login that is not one")
	}
}

// The GitHub stand-in: the same through GET /users/{login} as an installation.
func TestGitHubUserID(t *testing.T) {
	t.Parallel()
	b := setupGitHub(t)
	ctx := t.Context()
	want := b.srv.UserID("octocat")
	if id, err := b.gh.UserID(ctx, "octocat"); err != nil || id != want {
		t.Fatalf("UserID(octocat) = %d, %v; want %d", id, err, want)
	}
	b.srv.RenameUser("octocat", "octodog")
	if id, err := b.gh.UserID(ctx, "octodog"); err != nil || id != want {
		t.Errorf("UserID(octodog) after the rename = %d, %v; want %d", id, err, want)
	}
	if id, err := b.gh.UserID(ctx, "octocat"); !errors.Is(err, ErrNotFound) {
		t.Errorf("UserID(octocat) after the rename = %d, %v; want ErrNotFound", id, err)
	}
	squatter := b.srv.CreateUser("octocat")
	if id, err := b.gh.UserID(ctx, "octocat"); err != nil || id != squatter || id == want {
		t.Errorf("UserID(octocat) taken over = %d, %v; want %d", id, err, squatter)
	}
}
