package project

import (
	"errors"
	"strings"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
)

// A URL with a credential is refused, and the error does not repeat the credential; user
// names that are no secret (ssh, scp-like) pass.
func TestCredentialsInURLRefused(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		url  string
		want bool // refused
	}{
		{"https://bob:tok3n@git.example/x.git", true},
		{"https://tok3n@github.com/o/r.git", true},
		{"http://bob:pw@git.example/x.git", true},
		{"ssh://git:pw@git.example/x.git", true},
		{"ssh://git@git.example/x.git", false},
		{"git@git.example:x.git", false},
		{"https://git.example/x.git", false},
		{"/srv/git/x.git", false},
	} {
		_, err := NormalizeURL(tt.url)
		if refused := errors.Is(err, ErrCredentialsInURL); refused != tt.want {
			t.Errorf("NormalizeURL(%q): %v, want refused %v", tt.url, err, tt.want)
		}
		if err != nil && (strings.Contains(err.Error(), "tok3n") || strings.Contains(err.Error(), ":pw@")) {
			t.Errorf("NormalizeURL(%q)'s error repeats the credential: %v", tt.url, err)
		}
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ in, want string }{
		{"https://bob:tok3n@git.example/x.git", "https://REDACTED@git.example/x.git"},
		{"https://tok3n@github.com/o/r.git", "https://REDACTED@github.com/o/r.git"},
		{"ssh://git@git.example/x.git", "ssh://git@git.example/x.git"},
		{"git@git.example:x.git", "git@git.example:x.git"},
		{"https://git.example/x.git", "https://git.example/x.git"},
		{"octo/app", "octo/app"},
		{"https://a:b@host/%zz", "REDACTED"}, // unparsable with a user part
	} {
		if got := RedactURL(tt.in); got != tt.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// A project added by URL can be added private and marked private or public afterwards; a
// forge's repository cannot (its forge says).
func TestPrivateByURL(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	p := mustAdd(t, pool, AddParams{Name: "quiet", RepoURL: "https://git.example/quiet.git", Private: true})
	if !p.Private {
		t.Fatalf("added private: %+v", p)
	}
	yes, no := true, false
	if p, err := Set(ctx(t), pool, "quiet", SetParams{Private: &no}); err != nil || p.Private {
		t.Fatalf("set public: %+v, %v", p, err)
	}
	if p, err := Set(ctx(t), pool, "quiet", SetParams{Private: &yes}); err != nil || !p.Private {
		t.Fatalf("set private: %+v, %v", p, err)
	}
	if _, err := pool.Exec(ctx(t), `WITH r AS (INSERT INTO repositories (forge, owner, name, full_name, clone_url)
VALUES ('gitea', 'o', 'r', 'o/r', 'https://g/o/r.git') RETURNING id)
INSERT INTO projects (repo_id, name) SELECT id, 'forged' FROM r`); err != nil {
		t.Fatal(err)
	}
	if _, err := Set(ctx(t), pool, "forged", SetParams{Private: &yes}); !errors.Is(err, ErrPrivateFromForge) {
		t.Errorf("marking a forge's repository private: %v, want ErrPrivateFromForge", err)
	}
}
