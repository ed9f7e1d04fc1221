package project

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
)

// fakeForge counts webhook registrations; the other Forge methods are not used here (calling
// one panics on the nil embedded interface).
type fakeForge struct {
	forge.Forge
	name        string
	registerErr error

	mu         sync.Mutex
	registered []string // "owner/name url"
	deleted    []string // "owner/name hookID"
}

func (f *fakeForge) Name() string { return f.name }

func (f *fakeForge) RegisterWebhook(_ context.Context, repo forge.Repo, url string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.registerErr != nil {
		return "", f.registerErr
	}
	f.registered = append(f.registered, repo.FullName()+" "+url)
	return "hook-" + repo.Name, nil
}

func (f *fakeForge) DeleteWebhook(_ context.Context, repo forge.Repo, hookID string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted = append(f.deleted, repo.FullName()+" "+hookID)
	return nil
}

func (f *fakeForge) calls() (registered, deleted []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.registered), slices.Clone(f.deleted)
}

func forgeRepo(fullName, branch string) forge.Repository {
	owner, name, _ := strings.Cut(fullName, "/")
	return forge.Repository{Repo: forge.Repo{Owner: owner, Name: name},
		CloneURL: "https://forge.example/" + fullName + ".git", DefaultBranch: branch}
}

// syncRepos records repos of forge name and returns their ids by full name.
func syncRepos(t *testing.T, pool *pgxpool.Pool, name string, repos ...forge.Repository) map[string]int64 {
	t.Helper()
	if _, err := SyncRepositories(ctx(t), pool, name, repos); err != nil {
		t.Fatal(err)
	}
	rs, err := ListRepositories(ctx(t), pool, name, "")
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]int64{}
	for _, r := range rs {
		ids[r.FullName] = r.ID
	}
	return ids
}

func TestSyncRepositories(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	hello := forgeRepo("octo/hello", "main")
	hello.InstallationID, hello.ForgeID = 7, 1234
	world := forgeRepo("octo/world", "trunk")
	world.Private = true
	bad := forgeRepo("octo/..", "main")

	before := time.Now().Add(-time.Minute)
	n, err := SyncRepositories(ctx(t), pool, "github", []forge.Repository{hello, world, bad})
	if err != nil || n != 2 {
		t.Fatalf("first SyncRepositories = %d, %v; want 2 rows (the invalid name skipped)", n, err)
	}
	rs, err := ListRepositories(ctx(t), pool, "github", "")
	if err != nil {
		t.Fatal(err)
	}
	want := []Repository{
		{Forge: "github", FullName: "octo/hello", CloneURL: hello.CloneURL, DefaultBranch: "main", InstallationID: 7, ForgeID: 1234},
		{Forge: "github", FullName: "octo/world", CloneURL: world.CloneURL, DefaultBranch: "trunk", Private: true},
	}
	if len(rs) != len(want) {
		t.Fatalf("ListRepositories = %+v; want %+v", rs, want)
	}
	firstSync := rs[0].LastSynced
	for i := range rs {
		if rs[i].ID == 0 || rs[i].LastSynced.Before(before) {
			t.Errorf("repository %+v: want an id and last_synced set", rs[i])
		}
		want[i].ID, want[i].LastSynced = rs[i].ID, rs[i].LastSynced
		if rs[i] != want[i] {
			t.Errorf("repository %d = %+v; want %+v", i, rs[i], want[i])
		}
	}

	// Listed again with a new default branch, clone URL and installation: updated in place.
	hello.DefaultBranch, hello.CloneURL, hello.InstallationID = "develop", "https://forge.example/moved.git", 8
	n, err = SyncRepositories(ctx(t), pool, "github", []forge.Repository{hello})
	if err != nil || n != 1 {
		t.Fatalf("second SyncRepositories = %d, %v; want 1", n, err)
	}
	again, err := ListRepositories(ctx(t), pool, "github", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != 2 || again[0].ID != rs[0].ID || again[1] != rs[1] {
		t.Fatalf("after the second sync: %+v; want the same two rows", again)
	}
	if g := again[0]; g.DefaultBranch != "develop" || g.CloneURL != hello.CloneURL || g.InstallationID != 8 || g.LastSynced.Before(firstSync) {
		t.Fatalf("octo/hello after the second sync: %+v; want branch develop, the new clone URL, installation 8", g)
	}
	// The same name on another forge is another repository.
	if _, err := SyncRepositories(ctx(t), pool, "gitea", []forge.Repository{forgeRepo("octo/hello", "main")}); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		forge, search string
		want          []string // forge:full name
	}{
		{"", "", []string{"gitea:octo/hello", "github:octo/hello", "github:octo/world"}},
		{"github", "", []string{"github:octo/hello", "github:octo/world"}},
		{"gitea", "", []string{"gitea:octo/hello"}},
		{"", "HEL", []string{"gitea:octo/hello", "github:octo/hello"}},
		{"github", "wor", []string{"github:octo/world"}},
		{"github", "octo/", []string{"github:octo/hello", "github:octo/world"}},
		{"", "nothing", nil},
		{"gitlab", "", nil},
	} {
		rs, err := ListRepositories(ctx(t), pool, tc.forge, tc.search)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range rs {
			got = append(got, r.Forge+":"+r.FullName)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("ListRepositories(%q, %q) = %v; want %v", tc.forge, tc.search, got, tc.want)
		}
	}
}

func TestEnableDisable(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	gh := &fakeForge{name: "github"}
	en := Enabler{Pool: pool, Forges: forge.Set{"github": gh}, PublicURL: "http://ci.example/"}
	ids := syncRepos(t, pool, "github", forgeRepo("octo/hello", "main"), forgeRepo("other/hello", "trunk"),
		forgeRepo("third/hello", "main"), forgeRepo("fourth/hello", "main"))
	gitea := syncRepos(t, pool, "gitea", forgeRepo("octo/hello", "main"))
	const hookURL = "http://ci.example/webhook/github"

	p, err := en.Enable(ctx(t), ids["octo/hello"], EnableParams{})
	if err != nil {
		t.Fatal(err)
	}
	want := Project{ID: p.ID, Name: "hello", RepoURL: "https://forge.example/octo/hello.git", Branch: "main", Shares: 100,
		Enabled: true, CreatedAt: p.CreatedAt, RepoID: ids["octo/hello"], Forge: "github", FullName: "octo/hello",
		PREnabled: true, PRTrust: PRTrustCollaborators, PromotePROutputs: true}
	if p != want {
		t.Fatalf("Enable(octo/hello) = %+v; want %+v", p, want)
	}
	repo, err := GetRepository(ctx(t), pool, ids["octo/hello"])
	if err != nil || repo.HookID != "hook-hello" || repo.Project != "hello" || !repo.Enabled {
		t.Fatalf("GetRepository = %+v, %v; want hook hook-hello, project hello, enabled", repo, err)
	}

	// The repository's name is taken: owner-name.
	other, err := en.Enable(ctx(t), ids["other/hello"], EnableParams{})
	if err != nil || other.Name != "other-hello" || other.Branch != "trunk" {
		t.Fatalf("Enable(other/hello) = %+v, %v; want project other-hello on trunk", other, err)
	}
	// Both are taken (one by a project added by URL): owner-name-repoID.
	if _, err := Add(ctx(t), pool, AddParams{Name: "third-hello", RepoURL: "https://git.example.com/third.git"}); err != nil {
		t.Fatal(err)
	}
	third, err := en.Enable(ctx(t), ids["third/hello"], EnableParams{})
	if want := fmt.Sprintf("third-hello-%d", ids["third/hello"]); err != nil || third.Name != want {
		t.Fatalf("Enable(third/hello) = %+v, %v; want project %s", third, err, want)
	}

	// Enabling again keeps the project and its name, applies the settings and registers the
	// hook again (the forge finds the one it has).
	shares, poll := 7, 5*time.Minute
	again, err := en.Enable(ctx(t), ids["octo/hello"], EnableParams{Name: "ignored", Settings: Settings{Shares: &shares, PollInterval: &poll}})
	if err != nil || again.ID != p.ID || again.Name != "hello" || again.Shares != 7 || again.PollInterval != poll {
		t.Fatalf("Enable again = %+v, %v; want project %d hello with 7 shares and 5m polling", again, err, p.ID)
	}
	registered, _ := gh.calls()
	wantRegistered := []string{"octo/hello " + hookURL, "other/hello " + hookURL, "third/hello " + hookURL, "octo/hello " + hookURL}
	if !slices.Equal(registered, wantRegistered) {
		t.Fatalf("RegisterWebhook calls %q; want %q", registered, wantRegistered)
	}

	bad := "maybe"
	for _, tc := range []struct {
		name   string
		repoID int64
		params EnableParams
		want   error // nil: any error
	}{
		{"name taken", ids["fourth/hello"], EnableParams{Name: "hello"}, ErrExists},
		{"unknown repository", 1 << 40, EnableParams{}, ErrNoRepository},
		{"forge not configured", gitea["octo/hello"], EnableParams{}, ErrForgeNotConfigured},
		{"invalid name", ids["fourth/hello"], EnableParams{Name: "no spaces"}, nil},
		{"invalid settings", ids["fourth/hello"], EnableParams{Settings: Settings{PRTrust: &bad}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := en.Enable(ctx(t), tc.repoID, tc.params)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("Enable = %v; want an error wrapping %v", err, tc.want)
			}
		})
	}
	if r, err := GetRepository(ctx(t), pool, ids["fourth/hello"]); err != nil || r.Project != "" {
		t.Fatalf("fourth/hello = %+v, %v; want no project after the failed enables", r, err)
	}

	failing := Enabler{Pool: pool, Forges: forge.Set{"github": &fakeForge{name: "github", registerErr: errors.New("forge down")}}}
	if _, err := failing.Enable(ctx(t), ids["fourth/hello"], EnableParams{}); err == nil {
		t.Fatal("Enable with a failing webhook registration succeeded")
	}
	if r, err := GetRepository(ctx(t), pool, ids["fourth/hello"]); err != nil || r.Project != "" {
		t.Fatalf("fourth/hello = %+v, %v; want no project when the hook could not be registered", r, err)
	}

	if _, err := en.Disable(ctx(t), ids["fourth/hello"]); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Disable of a repository without project = %v; want ErrNotFound", err)
	}
	if _, err := en.Disable(ctx(t), 1<<40); !errors.Is(err, ErrNoRepository) {
		t.Fatalf("Disable of an unknown repository = %v; want ErrNoRepository", err)
	}

	off, err := en.Disable(ctx(t), ids["octo/hello"])
	if err != nil || off.ID != p.ID || off.Enabled {
		t.Fatalf("Disable = %+v, %v; want project %d disabled", off, err, p.ID)
	}
	if r, _ := GetRepository(ctx(t), pool, ids["octo/hello"]); r.HookID != "" || r.Enabled || r.Project != "hello" {
		t.Fatalf("after Disable: %+v; want the hook cleared, the project kept and disabled", r)
	}
	// Disabling again has no hook left to delete.
	if off, err := en.Disable(ctx(t), ids["octo/hello"]); err != nil || off.Enabled {
		t.Fatalf("second Disable = %+v, %v", off, err)
	}
	if _, deleted := gh.calls(); !slices.Equal(deleted, []string{"octo/hello hook-hello"}) {
		t.Fatalf("DeleteWebhook calls %q; want one for octo/hello hook-hello", deleted)
	}
	on, err := en.Enable(ctx(t), ids["octo/hello"], EnableParams{})
	if err != nil || on.ID != p.ID || on.Name != "hello" || !on.Enabled || on.Shares != 7 {
		t.Fatalf("re-Enable = %+v, %v; want project %d hello enabled with its settings", on, err, p.ID)
	}
}

func TestConfigure(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ids := syncRepos(t, pool, "github", forgeRepo("octo/hello", "main"), forgeRepo("octo/bare", "main"))
	en := Enabler{Pool: pool, Forges: forge.Set{"github": &fakeForge{name: "github"}}}
	p, err := en.Enable(ctx(t), ids["octo/hello"], EnableParams{})
	if err != nil {
		t.Fatal(err)
	}
	ptr := func(s string) *string { return &s }
	dur := func(d time.Duration) *time.Duration { return &d }
	num := func(n int) *int { return &n }
	off := false
	for _, tc := range []struct {
		name    string
		s       Settings
		wantErr bool
		want    func(p *Project)
	}{
		{"pr_trust maybe", Settings{PRTrust: ptr("maybe")}, true, nil},
		{"poll_interval 30s", Settings{PollInterval: dur(30 * time.Second)}, true, nil},
		{"poll_interval not whole seconds", Settings{PollInterval: dur(90*time.Second + time.Millisecond)}, true, nil},
		{"poll_interval 8d", Settings{PollInterval: dur(8 * 24 * time.Hour)}, true, nil},
		{"poll_interval negative", Settings{PollInterval: dur(-time.Minute)}, true, nil},
		{"shares 0", Settings{Shares: num(0)}, true, nil},
		{"poll_interval 5m", Settings{PollInterval: dur(5 * time.Minute)}, false, func(p *Project) { p.PollInterval = 5 * time.Minute }},
		{"pr_trust all", Settings{PRTrust: ptr(PRTrustAll)}, false, func(p *Project) { p.PRTrust = PRTrustAll }},
		{"pr_enabled false, shares 3", Settings{PREnabled: &off, Shares: num(3)}, false, func(p *Project) { p.PREnabled, p.Shares = false, 3 }},
		{"poll_interval 0", Settings{PollInterval: dur(0)}, false, func(p *Project) { p.PollInterval = 0 }},
		{"nothing", Settings{}, false, func(*Project) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Configure(ctx(t), pool, ids["octo/hello"], tc.s)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("Configure(%+v) = %+v; want an error", tc.s, got)
				}
				if now, _ := Get(ctx(t), pool, "hello"); now != p {
					t.Fatalf("after a refused Configure: %+v; want unchanged %+v", now, p)
				}
				return
			}
			tc.want(&p)
			if err != nil || got != p {
				t.Fatalf("Configure(%+v) = %+v, %v; want %+v", tc.s, got, err, p)
			}
		})
	}
	if _, err := Configure(ctx(t), pool, ids["octo/bare"], Settings{Shares: num(2)}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Configure of a repository without project = %v; want ErrNotFound", err)
	}
}

func TestDuePolls(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	ids := syncRepos(t, pool, "github", forgeRepo("octo/polled", "main"), forgeRepo("octo/hooks", "main"),
		forgeRepo("octo/off", "main"))
	en := Enabler{Pool: pool, Forges: forge.Set{"github": &fakeForge{name: "github"}}}
	minute := time.Minute
	enable := func(name string, s Settings) Project {
		t.Helper()
		p, err := en.Enable(ctx(t), ids[name], EnableParams{Settings: s})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	polled := enable("octo/polled", Settings{PollInterval: &minute})
	enable("octo/hooks", Settings{})
	enable("octo/off", Settings{PollInterval: &minute})
	if _, err := en.Disable(ctx(t), ids["octo/off"]); err != nil {
		t.Fatal(err)
	}
	// A project added by URL is never polled through a forge, whatever its poll_interval.
	byURL, err := Add(ctx(t), pool, AddParams{Name: "byurl", RepoURL: "https://git.example.com/byurl.git"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx(t), `UPDATE projects SET poll_interval = 60 WHERE id = $1`, byURL.ID); err != nil {
		t.Fatal(err)
	}

	due := func() []string {
		t.Helper()
		ps, err := DuePolls(ctx(t), pool)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, p := range ps {
			names = append(names, p.Name)
		}
		return names
	}
	if got := due(); !slices.Equal(got, []string{"polled"}) {
		t.Fatalf("DuePolls before any poll = %v; want [polled]", got)
	}
	if n, err := MarkPolled(ctx(t), pool, []int64{polled.ID}); err != nil || n != 1 {
		t.Fatalf("MarkPolled = %d, %v; want 1", n, err)
	}
	if got := due(); len(got) != 0 {
		t.Fatalf("DuePolls right after MarkPolled = %v; want none", got)
	}
	if _, err := pool.Exec(ctx(t), `UPDATE projects SET last_polled = now() - interval '61 seconds' WHERE id = $1`, polled.ID); err != nil {
		t.Fatal(err)
	}
	if got := due(); !slices.Equal(got, []string{"polled"}) {
		t.Fatalf("DuePolls a poll interval later = %v; want [polled]", got)
	}
	if n, err := MarkPolled(ctx(t), pool, nil); err != nil || n != 0 {
		t.Fatalf("MarkPolled(nil) = %d, %v; want 0", n, err)
	}
}

// Hooks registered before hooks had a secret each, or for another public URL, are registered
// again; the others, and those of disabled projects, are left alone.
func TestReregister(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	g := &fakeForge{name: "gitea"}
	en := Enabler{Pool: pool, Forges: forge.Set{"gitea": g}, PublicURL: "http://ci.example/", Configured: true}
	hello, off := forgeRepo("octo/hello", "main"), forgeRepo("octo/off", "main")
	hello.ForgeID, off.ForgeID = 11, 12
	ids := syncRepos(t, pool, "gitea", hello, off)
	for _, name := range []string{"octo/hello", "octo/off"} {
		if _, err := en.Enable(ctx(t), ids[name], EnableParams{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := en.Disable(ctx(t), ids["octo/off"]); err != nil {
		t.Fatal(err)
	}
	reregister := func(want ...string) {
		t.Helper()
		before, _ := g.calls()
		n, err := en.Reregister(ctx(t))
		after, _ := g.calls()
		if got := after[len(before):]; err != nil || n != len(want) || !slices.Equal(got, want) {
			t.Fatalf("Reregister = %d, %v, registering %v; want %v", n, err, got, want)
		}
	}
	reregister()
	// As an upgrade finds hooks registered at the forge-wide URL.
	if _, err := pool.Exec(ctx(t), `UPDATE repositories SET hook_url = NULL`); err != nil {
		t.Fatal(err)
	}
	reregister("octo/hello http://ci.example/webhook/gitea")
	reregister()
	en.PublicURL = "https://ci.example.org"
	reregister("octo/hello https://ci.example.org/webhook/gitea")
	reregister()
	// A node's own endpoint (no public_url) does not move hooks another node registered.
	en.PublicURL, en.Configured = "http://10.0.0.2:8080", false
	reregister()
}
