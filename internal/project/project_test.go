package project

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
)

func ctx(t *testing.T) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func mustAdd(t *testing.T, pool *pgxpool.Pool, p AddParams) Project {
	t.Helper()
	pr, err := Add(ctx(t), pool, p)
	if err != nil {
		t.Fatalf("Add(%+v): %v", p, err)
	}
	return pr
}

func TestAddListGetSet(t *testing.T) {
	pool := dbtest.NewPool(t)
	before := time.Now().Add(-time.Minute)

	// Defaults: branch main, 100 shares, enabled.
	web := mustAdd(t, pool, AddParams{Name: "web", RepoURL: "https://git.example.com/web.git"})
	want := Project{ID: web.ID, Name: "web", RepoURL: "https://git.example.com/web.git", Branch: "main", Shares: 100, Enabled: true,
		RepoID: web.RepoID, Forge: ForgeGit, FullName: "https://git.example.com/web.git", PREnabled: true, PRTrust: PRTrustCollaborators,
		PromotePROutputs: true}
	if got := withoutTime(web); got != want {
		t.Fatalf("Add returned %+v, want %+v", got, want)
	}
	if web.ID <= 0 || web.CreatedAt.Before(before) {
		t.Fatalf("Add returned id %d created at %v", web.ID, web.CreatedAt)
	}
	api := mustAdd(t, pool, AddParams{Name: "api", RepoURL: "/srv/git/api.git", Branch: "release/1.x", Shares: 5})
	if api.Branch != "release/1.x" || api.Shares != 5 || api.RepoURL != "/srv/git/api.git" {
		t.Fatalf("Add with branch and shares returned %+v", api)
	}

	ps, err := List(ctx(t), pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 2 || ps[0].Name != "api" || ps[1].Name != "web" {
		t.Fatalf("List = %+v, want api then web", ps)
	}
	if ps[0] != api || ps[1] != web {
		t.Fatalf("List = %+v, want exactly what Add returned (%+v, %+v)", ps, api, web)
	}

	got, err := Get(ctx(t), pool, "web")
	if err != nil || got != web {
		t.Fatalf("Get(web) = %+v, %v; want %+v", got, err, web)
	}

	shares, disabled, branch := 7, false, "develop"
	for _, tc := range []struct {
		name string
		set  SetParams
		want func(p *Project)
	}{
		{"shares", SetParams{Shares: &shares}, func(p *Project) { p.Shares = 7 }},
		{"enabled", SetParams{Enabled: &disabled}, func(p *Project) { p.Enabled = false }},
		{"branch", SetParams{Branch: &branch}, func(p *Project) { p.Branch = "develop" }},
		{"nothing", SetParams{}, func(*Project) {}},
	} {
		tc.want(&web)
		got, err := Set(ctx(t), pool, "web", tc.set)
		if err != nil {
			t.Fatalf("Set %s: %v", tc.name, err)
		}
		if got != web {
			t.Fatalf("Set %s returned %+v, want %+v", tc.name, got, web)
		}
		if stored, err := Get(ctx(t), pool, "web"); err != nil || stored != web {
			t.Fatalf("after Set %s, Get = %+v, %v; want %+v", tc.name, stored, err, web)
		}
	}
	// The other project is untouched.
	if got, err := Get(ctx(t), pool, "api"); err != nil || got != api {
		t.Fatalf("Set of web changed api: %+v, %v", got, err)
	}
}

func withoutTime(p Project) Project {
	p.CreatedAt = time.Time{}
	return p
}

func TestAddExists(t *testing.T) {
	pool := dbtest.NewPool(t)
	mustAdd(t, pool, AddParams{Name: "one", RepoURL: "/srv/git/one.git"})
	for _, tc := range []struct {
		name string
		p    AddParams
	}{
		{"same name, other repository", AddParams{Name: "one", RepoURL: "/srv/git/other.git"}},
		{"same repository, other name", AddParams{Name: "two", RepoURL: "/srv/git/one.git"}},
		{"same repository given as a relative path", AddParams{Name: "three", RepoURL: relTo(t, "/srv/git/one.git")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Add(ctx(t), pool, tc.p)
			if !errors.Is(err, ErrExists) {
				t.Fatalf("Add(%+v) = %v, want ErrExists", tc.p, err)
			}
			if !strings.Contains(err.Error(), "already") {
				t.Fatalf("error %q does not say the project already exists", err)
			}
		})
	}
	// A failed Add leaves nothing behind: the repository row of a name clash is rolled back,
	// so the repository can still be added under a new name.
	ps, err := List(ctx(t), pool)
	if err != nil || len(ps) != 1 {
		t.Fatalf("after failed adds List = %+v, %v; want only the first project", ps, err)
	}
	mustAdd(t, pool, AddParams{Name: "four", RepoURL: "/srv/git/other.git"})
}

// relTo returns abs relative to the working directory.
func relTo(t *testing.T, abs string) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(wd, abs)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

func TestNotFound(t *testing.T) {
	pool := dbtest.NewPool(t)
	mustAdd(t, pool, AddParams{Name: "exists", RepoURL: "/srv/git/exists.git"})
	if _, err := Get(ctx(t), pool, "missing"); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), `"missing"`) {
		t.Fatalf("Get(missing) = %v, want ErrNotFound naming the project", err)
	}
	shares := 3
	if _, err := Set(ctx(t), pool, "missing", SetParams{Shares: &shares}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Set(missing) = %v, want ErrNotFound", err)
	}
	if _, err := Set(ctx(t), pool, "missing", SetParams{}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Set(missing) with no changes = %v, want ErrNotFound", err)
	}
}

func TestValidation(t *testing.T) {
	pool := dbtest.NewPool(t)
	long := strings.Repeat("a", 64)
	for _, tc := range []struct {
		name    string
		p       AddParams
		wantErr string // substring; "" means valid
	}{
		{"plain name", AddParams{Name: "web"}, ""},
		{"name with dot, dash, underscore, digits", AddParams{Name: "9.web_app-2"}, ""},
		{"name of 63", AddParams{Name: long[:63]}, ""},
		{"name of 64", AddParams{Name: long}, "project name"},
		{"empty name", AddParams{Name: ""}, "project name"},
		{"name with space", AddParams{Name: "bad name"}, `project name "bad name"`},
		{"name with slash", AddParams{Name: "a/b"}, "project name"},
		{"name starting with dash", AddParams{Name: "-web"}, "project name"},
		{"name starting with dot", AddParams{Name: ".web"}, "project name"},
		{"name with unicode", AddParams{Name: "wéb"}, "project name"},

		{"empty repository", AddParams{RepoURL: "-"}, "must not start with '-'"},
		{"option as repository", AddParams{RepoURL: "--upload-pack=touch /tmp/x"}, "must not start with '-'"},
		{"remote helper", AddParams{RepoURL: "ext::sh -c touch% /tmp/pwned"}, `transport "ext"`},
		{"fd remote helper", AddParams{RepoURL: "fd::3"}, `transport "fd"`},
		{"unsupported scheme", AddParams{RepoURL: "ftp://example.com/repo"}, `unsupported scheme "ftp"`},
		{"file URL with host", AddParams{RepoURL: "file://host/srv/repo"}, "file URL with host"},
		{"control character", AddParams{RepoURL: "/srv/repo\n"}, "control character"},
		{"scp-like with empty user", AddParams{RepoURL: "@host:repo"}, "empty user"},
		{"ssh URL", AddParams{RepoURL: "ssh://git@example.com:2222/r.git"}, ""},
		{"scp-like", AddParams{RepoURL: "git@example.com:owner/r.git"}, ""},

		{"nested branch", AddParams{Branch: "release/2.0"}, ""},
		{"branch with ..", AddParams{Branch: "a..b"}, `must not contain ".."`},
		{"branch starting with dash", AddParams{Branch: "-b"}, "must not start with '-'"},
		{"branch with space", AddParams{Branch: "a b"}, "must not contain"},
		{"branch ending in .lock", AddParams{Branch: "x.lock"}, ".lock"},
		{"branch @", AddParams{Branch: "@"}, "not a valid branch name"},
		{"branch with @{", AddParams{Branch: "a@{1}"}, "@{"},

		{"shares 1", AddParams{Shares: 1}, ""},
		{"shares negative", AddParams{Shares: -1}, "shares must be at least 1, got -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.p
			// Each case varies one field; the others get valid, unique values.
			key := strings.NewReplacer(" ", "_", ",", "", "@", "at", "/", "_", ".", "_", "{", "").Replace(tc.name)
			if p.Name == "" && !strings.Contains(tc.name, "empty name") {
				p.Name = key
			}
			if p.RepoURL == "" {
				p.RepoURL = "/srv/git/" + key
			}
			pr, err := Add(ctx(t), pool, p)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Add(%+v) = %v, want success", p, err)
				}
				if pr.Name != p.Name {
					t.Fatalf("Add(%+v) stored name %q", p, pr.Name)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Add(%+v) = %v, want an error containing %q", p, err, tc.wantErr)
			}
			if _, gerr := Get(ctx(t), pool, p.Name); !errors.Is(gerr, ErrNotFound) {
				t.Fatalf("a rejected Add stored project %q (Get: %v)", p.Name, gerr)
			}
		})
	}

	// Set validates the same way and changes nothing when it refuses.
	orig := mustAdd(t, pool, AddParams{Name: "settable", RepoURL: "/srv/git/settable", Shares: 10})
	zero, negative, bad, empty := 0, -5, "a..b", ""
	for _, tc := range []struct {
		name    string
		set     SetParams
		wantErr string
	}{
		{"zero shares", SetParams{Shares: &zero}, "shares must be at least 1, got 0"},
		{"negative shares", SetParams{Shares: &negative}, "shares must be at least 1, got -5"},
		{"bad branch", SetParams{Branch: &bad}, `must not contain ".."`},
		{"empty branch", SetParams{Branch: &empty}, "empty branch name"},
	} {
		t.Run("set "+tc.name, func(t *testing.T) {
			if _, err := Set(ctx(t), pool, "settable", tc.set); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Set %s = %v, want an error containing %q", tc.name, err, tc.wantErr)
			}
			if got, err := Get(ctx(t), pool, "settable"); err != nil || got != orig {
				t.Fatalf("a refused Set changed the project: %+v, %v; want %+v", got, err, orig)
			}
		})
	}
}

func TestNormalizeURL(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		in, want string // want "" means an error containing wantErr
		wantErr  string
	}{
		{in: "repo", want: filepath.Join(wd, "repo")},
		{in: "./repo", want: filepath.Join(wd, "repo")},
		{in: "../x/repo.git", want: filepath.Join(filepath.Dir(wd), "x/repo.git")},
		{in: "dir/with:colon", want: filepath.Join(wd, "dir/with:colon")},
		{in: "/srv/git/repo.git", want: "/srv/git/repo.git"},
		{in: "/srv/git/../git/repo", want: "/srv/git/repo"},
		{in: "file:///srv/git/repo.git", want: "file:///srv/git/repo.git"},
		{in: "https://github.com/owner/repo.git", want: "https://github.com/owner/repo.git"},
		{in: "ssh://git@example.com:2222/owner/repo.git", want: "ssh://git@example.com:2222/owner/repo.git"},
		{in: "git://example.com/repo.git", want: "git://example.com/repo.git"},
		{in: "git@host:x/y", want: "git@host:x/y"},
		{in: "git@github.com:owner/repo.git", want: "git@github.com:owner/repo.git"},
		// scp-like without a user is ssh to git too (a colon before any slash), not a local path.
		{in: "myhost:repo.git", want: "myhost:repo.git"},

		{in: "", wantErr: "empty repository URL"},
		{in: "-x", wantErr: "must not start with '-'"},
		{in: "--upload-pack=x", wantErr: "must not start with '-'"},
		{in: "ext::sh", wantErr: `remote helper transport "ext"`},
		{in: "ext::sh -c touch% /tmp/pwned", wantErr: `remote helper transport "ext"`},
		{in: "fd::3", wantErr: `transport "fd"`},
		{in: "ftp://example.com/repo", wantErr: `unsupported scheme "ftp"`},
		{in: "file://host/srv/repo", wantErr: "file URL with host"},
		{in: "@host:repo", wantErr: "empty user"},
		{in: ":repo", wantErr: "empty host"},
		{in: "git@-oProxyCommand=x:repo", wantErr: "host must not start with '-'"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := NormalizeURL(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("NormalizeURL(%q) = %q, %v; want an error containing %q", tc.in, got, err, tc.wantErr)
				}
				if !strings.HasPrefix(err.Error(), "repository") {
					t.Fatalf("NormalizeURL(%q): error %q does not say it is about the repository", tc.in, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("NormalizeURL(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
}
