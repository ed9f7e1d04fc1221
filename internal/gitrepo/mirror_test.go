package gitrepo

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// source is a plain repository standing in for a project's upstream.
type source struct {
	t   *testing.T
	dir string
}

func newSource(t *testing.T) *source {
	t.Helper()
	s := &source{t: t, dir: filepath.Join(t.TempDir(), "src")}
	s.git("init", "--quiet", "--initial-branch=main", s.dir)
	return s
}

// git runs git in the source repository with the package's environment plus an identity.
func (s *source) git(args ...string) string {
	s.t.Helper()
	if args[0] != "init" {
		args = append([]string{"-C", s.dir}, args...)
	}
	cmd := exec.Command("git", args...)
	cmd.Env = append(gitEnv(),
		"GIT_AUTHOR_NAME=Test", "GIT_AUTHOR_EMAIL=test@example.com",
		"GIT_COMMITTER_NAME=Test", "GIT_COMMITTER_EMAIL=test@example.com",
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		s.t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// commit writes files (path → contents) on the current branch, commits and returns the sha.
func (s *source) commit(msg string, files map[string]string) string {
	s.t.Helper()
	for p, data := range files {
		full := filepath.Join(s.dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			s.t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(data), 0o644); err != nil {
			s.t.Fatal(err)
		}
	}
	s.git("add", "--all")
	s.git("commit", "--quiet", "--allow-empty", "-m", msg)
	return s.git("rev-parse", "HEAD")
}

// fetched returns a mirror of src in a fresh state directory, fetched once.
func fetched(t *testing.T, src *source) *Mirror {
	t.Helper()
	m, err := New(filepath.Join(t.TempDir(), "mirrors", "project.git"), src.dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Fetch(t.Context()); err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	return m
}

func wantErrContaining(t *testing.T, what string, err error, want string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("%s: error %v, want one containing %q", what, err, want)
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		name, dir, url, wantErr string
	}{
		{"ok", "/state/p.git", "https://example.com/p.git", ""},
		{"empty dir", "", "https://example.com/p.git", "empty mirror directory"},
		{"bad url", "/state/p.git", "ext::sh -c id", "remote helper"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := New(tt.dir, tt.url)
			if tt.wantErr != "" {
				wantErrContaining(t, "New", err, tt.wantErr)
				return
			}
			if err != nil || m.Dir != tt.dir || m.URL != tt.url {
				t.Fatalf("New = %+v, %v", m, err)
			}
		})
	}
}

func TestFetchResolveBranch(t *testing.T) {
	// An inherited GIT_DIR (git hooks set it) must not redirect the mirror's git commands.
	t.Setenv("GIT_DIR", filepath.Join(t.TempDir(), "elsewhere"))
	ctx := t.Context()
	src := newSource(t)
	first := src.commit("first", map[string]string{"README.md": "hello\n"})
	src.git("checkout", "--quiet", "-b", "feature")
	feature := src.commit("feature", map[string]string{"feature.txt": "wip\n"})
	src.git("checkout", "--quiet", "main")

	m := fetched(t, src)
	second := src.commit("second", map[string]string{"README.md": "hello again\n"})

	wantBranch := func(step string, want map[string]string) {
		t.Helper()
		for branch, sha := range want {
			got, err := m.ResolveBranch(ctx, branch)
			switch {
			case sha == "":
				wantErrContaining(t, step+": ResolveBranch("+branch+")", err, `branch "`+branch+`" not found in `+m.Dir)
			case err != nil || got != sha:
				t.Fatalf("%s: ResolveBranch(%q) = %q, %v, want %q", step, branch, got, err, sha)
			}
		}
	}
	// The mirror only learns about upstream changes when fetched.
	wantBranch("first fetch", map[string]string{"main": first, "feature": feature, "nope": ""})
	if err := m.Fetch(ctx); err != nil {
		t.Fatal(err)
	}
	wantBranch("second fetch", map[string]string{"main": second, "feature": feature})

	src.git("branch", "--quiet", "-D", "feature")
	if err := m.Fetch(ctx); err != nil {
		t.Fatal(err)
	}
	wantBranch("after deleting feature", map[string]string{"main": second, "feature": ""})

	_, err := m.ResolveBranch(ctx, "main..feature")
	wantErrContaining(t, "ResolveBranch of an invalid name", err, `must not contain ".."`)
}

func TestFetchURLForms(t *testing.T) {
	src := newSource(t)
	head := src.commit("first", map[string]string{"README.md": "hello\n"})
	for _, url := range []string{src.dir, "file://" + src.dir} {
		t.Run(url, func(t *testing.T) {
			m, err := New(filepath.Join(t.TempDir(), "project.git"), url)
			if err != nil {
				t.Fatal(err)
			}
			for range 2 { // clone, then fetch
				if err := m.Fetch(t.Context()); err != nil {
					t.Fatalf("Fetch: %v", err)
				}
			}
			if got, err := m.ResolveBranch(t.Context(), "main"); err != nil || got != head {
				t.Fatalf("ResolveBranch(main) = %q, %v, want %q", got, err, head)
			}
		})
	}
}

func TestFetchFollowsURLChange(t *testing.T) {
	old, moved := newSource(t), newSource(t)
	old.commit("old", map[string]string{"README.md": "old\n"})
	head := moved.commit("moved", map[string]string{"README.md": "moved\n"})
	m := fetched(t, old)
	m.URL = moved.dir
	if err := m.Fetch(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got, err := m.ResolveBranch(t.Context(), "main"); err != nil || got != head {
		t.Fatalf("ResolveBranch(main) = %q, %v, want %q from the new URL", got, err, head)
	}
}

func TestFetchFailure(t *testing.T) {
	notRepo := t.TempDir()
	tests := []struct {
		name, url, wantErr string
	}{
		{"missing repository", "/nonexistent/repo.git", "does not exist"},
		{"not a repository", notRepo, "does not exist"},
		{"not a repository over file://", "file://" + notRepo, "does not appear to be a git repository"},
		{"invalid URL", "ext::sh -c touch% /tmp/pwned", "remote helper"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A literal Mirror, so that Fetch's own URL check is what rejects the invalid one.
			m := &Mirror{Dir: filepath.Join(t.TempDir(), "project.git"), URL: tt.url}
			wantErrContaining(t, "Fetch", m.Fetch(t.Context()), tt.wantErr)
			for _, p := range []string{m.Dir, m.Dir + ".tmp"} {
				if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s left behind (stat: %v)", p, err)
				}
			}
		})
	}
}

func TestFetchConcurrent(t *testing.T) {
	src := newSource(t)
	head := src.commit("first", map[string]string{"README.md": "hello\n"})
	dir := filepath.Join(t.TempDir(), "project.git")

	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			m, err := New(dir, src.dir)
			if err == nil {
				err = m.Fetch(t.Context())
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Fetch %d: %v", i, err)
		}
	}

	m := &Mirror{Dir: dir, URL: src.dir}
	if got, err := m.ResolveBranch(t.Context(), "main"); err != nil || got != head {
		t.Fatalf("ResolveBranch(main) = %q, %v, want %q", got, err, head)
	}
	if out, err := run(t.Context(), nil, dir, "fsck", "--no-progress"); err != nil {
		t.Fatalf("fsck: %v\n%s", err, out)
	}
	entries, err := os.ReadDir(filepath.Dir(dir))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if got, want := strings.Join(names, " "), "project.git project.git.lock"; got != want {
		t.Errorf("state directory holds %q, want %q", got, want)
	}
}

func TestFetchLockHonoursContext(t *testing.T) {
	src := newSource(t)
	src.commit("first", map[string]string{"README.md": "hello\n"})
	m, err := New(filepath.Join(t.TempDir(), "project.git"), src.dir)
	if err != nil {
		t.Fatal(err)
	}
	unlock, err := lock(t.Context(), m.Dir+".lock")
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()

	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if err := m.Fetch(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Fetch while another holds the lock = %v, want %v", err, context.DeadlineExceeded)
	}
	if _, err := os.Stat(m.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Fetch without the lock touched %s (stat: %v)", m.Dir, err)
	}
}

func TestResolveCommit(t *testing.T) {
	src := newSource(t)
	first := src.commit("first", map[string]string{"README.md": "hello\n"})
	second := src.commit("second", map[string]string{"README.md": "hello again\n"})
	src.git("tag", "--annotate", "-m", "release", "v1", first)
	tag := src.git("rev-parse", "v1")
	tree := src.git("rev-parse", second+"^{tree}")
	// A branch named like an abbreviation of second, pointing elsewhere: git prefers ref names
	// over abbreviated ids, so resolving the abbreviation must not silently yield first.
	shadow := second[:10]
	src.git("branch", shadow, first)
	m := fetched(t, src)

	tests := []struct {
		name, rev, want, wantErr string
	}{
		{"full", first, first, ""},
		{"short", first[:7], first, ""},
		{"upper case", strings.ToUpper(first[:12]), first, ""},
		{"annotated tag", tag, first, ""},
		{"full despite a ref of the same prefix", second, second, ""},
		{"abbreviation shadowed by a ref", shadow, "", "a ref has the same name"},
		{"unknown full", strings.Repeat("deadbeef", 5), "", "not found in " + m.Dir},
		{"unknown short", "0000000", "", "not found"},
		{"tree, not a commit", tree, "", "expected commit type"},
		{"too short", first[:3], "", "4 to 64 hex digits"},
		{"too long", first + first, "", "4 to 64 hex digits"},
		{"ref name", "main", "", "not a hex object id"},
		{"revision expression", "HEAD~1", "", "not a hex object id"},
		{"option", "--all", "", "not a hex object id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := m.ResolveCommit(t.Context(), tt.rev)
			if tt.wantErr != "" {
				wantErrContaining(t, "ResolveCommit("+tt.rev+")", err, tt.wantErr)
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ResolveCommit(%q) = %q, %v, want %q", tt.rev, got, err, tt.want)
			}
		})
	}
}

func TestTree(t *testing.T) {
	src := newSource(t)
	base := src.commit("base", map[string]string{"README.md": "hello\n", "nix/default.nix": "{ }\n"})
	// Same content under another message and date: what a rebase or cherry-pick produces.
	src.git("checkout", "--quiet", "-b", "reworded")
	src.git("commit", "--quiet", "--amend", "--date=2001-01-01T00:00:00Z", "-m", "other")
	reworded := src.git("rev-parse", "HEAD")
	src.git("checkout", "--quiet", "main")
	changed := src.commit("changed", map[string]string{"nix/default.nix": "{ x = 1; }\n"})
	m := fetched(t, src)

	tree := func(commit string) string {
		t.Helper()
		got, err := m.Tree(t.Context(), commit)
		if err != nil {
			t.Fatalf("Tree(%s): %v", commit, err)
		}
		if want := src.git("rev-parse", commit+"^{tree}"); got != want {
			t.Fatalf("Tree(%s) = %q, want %q", commit, got, want)
		}
		return got
	}
	if base == reworded {
		t.Fatal("amending produced the same commit")
	}
	tests := []struct {
		name     string
		a, b     string
		sameTree bool
	}{
		{"reworded commit", base, reworded, true},
		{"abbreviated id", base, reworded[:8], true},
		{"content change", base, changed, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if same := tree(tt.a) == tree(tt.b); same != tt.sameTree {
				t.Fatalf("trees of %s and %s equal = %v, want %v", tt.a, tt.b, same, tt.sameTree)
			}
		})
	}

	_, err := m.Tree(t.Context(), strings.Repeat("deadbeef", 5))
	wantErrContaining(t, "Tree of an unknown commit", err, "not found")
}

func TestReadFile(t *testing.T) {
	src := newSource(t)
	old := src.commit("old", map[string]string{"README.md": "old\n"})
	head := src.commit("head", map[string]string{
		"README.md":          "hello\n",
		"empty":              "",
		"with space.txt":     "spaced\n",
		"nix/ci/default.nix": "{ jobs = { }; }\n",
	})
	m := fetched(t, src)

	tests := []struct {
		name, commit, path string
		want               string
		wantOK             bool
		wantErr            string
	}{
		{"top level", head, "README.md", "hello\n", true, ""},
		{"older commit", old, "README.md", "old\n", true, ""},
		{"abbreviated commit", head[:7], "README.md", "hello\n", true, ""},
		{"nested", head, "nix/ci/default.nix", "{ jobs = { }; }\n", true, ""},
		{"empty file", head, "empty", "", true, ""},
		{"space in name", head, "with space.txt", "spaced\n", true, ""},
		{"absent", head, "flake.nix", "", false, ""},
		{"absent nested", head, "nix/ci/missing.nix", "", false, ""},
		{"absent in older commit", old, "nix/ci/default.nix", "", false, ""},
		{"below a file", head, "README.md/x", "", false, ""},
		{"directory", head, "nix/ci", "", false, "is a tree, not a file"},
		{"parent escape", head, "../README.md", "", false, `must not contain ".."`},
		{"absolute", head, "/README.md", "", false, "must be relative"},
		{"option-like", head, "-p", "", false, "must not start with '-'"},
		{"unknown commit", strings.Repeat("deadbeef", 5), "README.md", "", false, "not found"},
		{"invalid commit", "HEAD", "README.md", "", false, "not a hex object id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok, err := m.ReadFile(t.Context(), tt.commit, tt.path)
			if tt.wantErr != "" {
				wantErrContaining(t, "ReadFile("+tt.path+")", err, tt.wantErr)
				return
			}
			if err != nil || ok != tt.wantOK || string(got) != tt.want {
				t.Fatalf("ReadFile(%s, %q) = %q, %v, %v, want %q, %v, nil", tt.commit, tt.path, got, ok, err, tt.want, tt.wantOK)
			}
			if !ok && got != nil {
				t.Fatalf("ReadFile(%s, %q) returned %q for an absent file, want nil", tt.commit, tt.path, got)
			}
		})
	}
}

// A remote that wants credentials is told apart from one that fails otherwise: the evaluator
// then asks for a read credential (a repository made private since it was recorded public).
func TestIsAuthError(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasPrefix(r.URL.Path, "/private/"):
			w.Header().Set("WWW-Authenticate", `Basic realm="forge"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
		case strings.HasPrefix(r.URL.Path, "/forbidden/"):
			http.Error(w, "forbidden", http.StatusForbidden)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	for _, tt := range []struct {
		path string
		auth bool
	}{
		{"/private/repo.git", true},
		{"/forbidden/repo.git", true},
		{"/missing/repo.git", false},
	} {
		m := &Mirror{Dir: filepath.Join(t.TempDir(), "project.git"), URL: srv.URL + tt.path}
		err := m.Fetch(t.Context())
		if err == nil || IsAuthError(err) != tt.auth {
			t.Errorf("fetch of %s: %v; IsAuthError %v, want %v", tt.path, err, IsAuthError(err), tt.auth)
		}
	}
	if IsAuthError(errors.New("git fetch: could not read Username")) {
		t.Error("an error that is not git's counts as an authentication error")
	}
}
