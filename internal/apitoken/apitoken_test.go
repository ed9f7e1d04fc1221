package apitoken_test

import (
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/apitoken"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// A token's last use is written at most once a minute; a user's tokens are bounded; a token
// looks up only while live, and only as itself.
func TestLifecycle(t *testing.T) {
	pool := dbtest.NewPool(t)
	ctx := t.Context()
	m, err := apitoken.MintUser(ctx, pool, "gitea", 7, "alice", "laptop", 30, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := apitoken.MintUser(ctx, pool, "gitea", 7, "alice", "bad\nname", 30, 2); err == nil {
		t.Error("a two-line name was accepted")
	}
	if _, err := apitoken.MintUser(ctx, pool, "gitea", 7, "alice", "desktop", 30, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := apitoken.MintUser(ctx, pool, "gitea", 7, "alice", "third", 30, 2); err != apitoken.ErrTooMany {
		t.Errorf("a third live token past the bound of 2: %v, want ErrTooMany", err)
	}
	id, ok, err := apitoken.Lookup(ctx, pool, m.Token)
	if err != nil || !ok || id.Login != "alice" || id.UserID != 7 || id.Machine() || id.LastUsed != nil {
		t.Fatalf("Lookup: %+v %v %v", id, ok, err)
	}
	for _, other := range []string{m.Token + "x", "hcc1_" + m.Token[4:], ""} {
		if _, ok, _ := apitoken.Lookup(ctx, pool, other); ok {
			t.Errorf("Lookup(%q) found a token", other)
		}
	}
	lastUsed := func() time.Time {
		var at time.Time
		if err := pool.QueryRow(ctx, `SELECT last_used_at FROM api_tokens WHERE id = $1`, m.ID).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	if err := apitoken.Touch(ctx, pool, m.ID); err != nil {
		t.Fatal(err)
	}
	first := lastUsed()
	if err := apitoken.Touch(ctx, pool, m.ID); err != nil {
		t.Fatal(err)
	}
	if again := lastUsed(); !again.Equal(first) {
		t.Errorf("a second use within the minute rewrote last_used_at: %v → %v", first, again)
	}
	if _, err := pool.Exec(ctx, `UPDATE api_tokens SET last_used_at = last_used_at - interval '61 seconds' WHERE id = $1`, m.ID); err != nil {
		t.Fatal(err)
	}
	old := lastUsed()
	if err := apitoken.Touch(ctx, pool, m.ID); err != nil {
		t.Fatal(err)
	}
	if now := lastUsed(); !now.After(old) {
		t.Errorf("a use a minute later did not write last_used_at")
	}
	if err := apitoken.Revoke(ctx, pool, m.ID, "gitea", 8); err == nil {
		t.Error("another user revoked the token")
	}
	if err := apitoken.Revoke(ctx, pool, m.ID, "gitea", 7); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := apitoken.Lookup(ctx, pool, m.Token); ok {
		t.Error("a revoked token looks up")
	}
	list, err := apitoken.List(ctx, pool, "gitea", 7, 10)
	if err != nil || len(list) != 2 || list[1].Live || list[1].RevokedAt == nil || list[1].LastUsedAt == nil {
		t.Errorf("List: %+v %v", list, err)
	}
}
