package githubtest_test

import (
	"net/http"
	"testing"

	"github.com/golang-jwt/jwt/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/githubtest"
)

// An access token asked for with repositories, repository_ids or permissions is scoped as
// GitHub scopes it: other repositories of the installation are 404, other permissions 403, and
// asking for what the installation does not hold is a 422.
func TestScopedTokens(t *testing.T) {
	t.Parallel()
	s := githubtest.New(t)
	s.AddInstallation(7, githubtest.Repo{FullName: "octo/one"}, githubtest.Repo{FullName: "octo/two"})
	s.SetBranch("octo/one", "main", sha1)
	s.SetBranch("octo/two", "main", sha1)
	jwtAuth := "Bearer " + signJWT(t, appKey(t, s), jwt.SigningMethodRS256, goodClaims(s))
	mint := func(body any) (int, string) {
		a := call(t, s, "POST", "/app/installations/7/access_tokens", jwtAuth, body)
		var tok struct {
			Token string `json:"token"`
		}
		if a.code == http.StatusCreated {
			a.json(t, &tok)
		}
		return a.code, tok.Token
	}
	readOne := map[string]any{"repositories": []string{"one"}, "permissions": map[string]string{"contents": "read"}}
	byID := map[string]any{"repository_ids": []int64{githubtest.RepoID("octo/one")}}
	status := map[string]string{"state": "success", "context": "ci"}
	tests := []struct {
		name                 string
		body                 any
		mintCode             int
		branchOne, branchTwo int
		statusOne            int
	}{
		{"unscoped", nil, 201, 200, 200, 201},
		{"one repository, contents read", readOne, 201, 200, 404, 403},
		{"one repository by id", byID, 201, 200, 404, 201},
		{"a repository it does not hold", map[string]any{"repositories": []string{"three"}}, 422, 0, 0, 0},
		{"a permission it does not hold", map[string]any{"permissions": map[string]string{"administration": "write"}}, 422, 0, 0, 0},
		{"more than it holds", map[string]any{"permissions": map[string]string{"contents": "write"}}, 422, 0, 0, 0},
	}
	for _, tt := range tests {
		code, tok := mint(tt.body)
		if code != tt.mintCode {
			t.Errorf("%s: access_tokens %d, want %d", tt.name, code, tt.mintCode)
			continue
		}
		if code != 201 {
			continue
		}
		for _, c := range []struct {
			method, path string
			body         any
			want         int
		}{
			{"GET", "/repos/octo/one/branches/main", nil, tt.branchOne},
			{"GET", "/repos/octo/two/branches/main", nil, tt.branchTwo},
			{"POST", "/repos/octo/one/statuses/" + sha1, status, tt.statusOne},
		} {
			if a := call(t, s, c.method, c.path, "token "+tok, c.body); a.code != c.want {
				t.Errorf("%s: %s %s: %d %s, want %d", tt.name, c.method, c.path, a.code, a.body, c.want)
			}
		}
	}
}
