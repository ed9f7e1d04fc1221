package e2e

import (
	"context"
	"encoding/json"
	"html"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/giteatest"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
)

var snippetRE = regexp.MustCompile(`(?s)<pre class="snippet" id="(nix-conf|netrc)">(.*?)</pre>`)

// A user's cache token against the real binary, Gitea and Nix: a reader of a private
// repository logs in with Gitea, mints a token on /ci/tokens, and nix-store -r with the
// project page's nix.conf and netrc snippet substitutes the project's built output with
// require-sigs (and without the netrc does not); once Gitea takes the reader's access back,
// the maintenance leader's next refresh stops the token.
func TestUserCacheTokenForReal(t *testing.T) {
	lb, public := startRoundRobin(t, 0)
	ctx := context.Background()
	c := newForgeCluster(t, forgeOptions{private: true, publicURL: public, frontendLines: "cache_token_refresh = \"1s\"\n",
		prepare: func(g *giteatest.Server, owner giteatest.User) (string, []string) {
			return oauthLines(giteaOAuthApp(t, g, owner.Token, public))
		}})
	lb.set(c.endpoint("front-1"))
	c.enable(nil)
	reader, err := c.gitea.CreateUser(ctx, giteatest.UniqueName("reader"))
	if err != nil {
		t.Fatal(err)
	}
	collaborator := "/repos/" + c.repo.FullName() + "/collaborators/" + reader.Login
	if err := c.gitea.Do(ctx, c.owner.Token, http.MethodPut, collaborator, map[string]any{"permission": "read"}, nil); err != nil {
		t.Fatal(err)
	}

	sha := c.push(c.owner, c.repo, "main", map[string]string{"ci.nix": shLib(uniqueSalt(t)) + ` { secret = sh "secret" [] "echo private"; }`}, false)
	c.waitStatuses(sha, "success", "success", 3*time.Minute)
	var name, output string
	if err := c.pool.QueryRow(ctx, `
SELECT p.name, o.output_path FROM evaluations e JOIN projects p ON p.id = e.project_id
JOIN eval_attrs a ON a.eval_id = e.id JOIN derivation_outputs o ON o.drv_path = a.drv_path
WHERE e.commit_sha = $1 AND a.attr = 'secret'`, sha).Scan(&name, &output); err != nil {
		t.Fatal(err)
	}
	sp, err := nix.ParseStorePath(output)
	if err != nil {
		t.Fatal(err)
	}

	f := &identityFrontend{fixture: c.fixture, gitea: c.gitea, public: public}
	u := f.login(reader)
	_, page := u.do("GET", public+"/ci/"+url.PathEscape(name)+"/", nil)
	snippets := map[string]string{}
	for _, m := range snippetRE.FindAllStringSubmatch(page, -1) {
		snippets[m[1]] = html.UnescapeString(m[2])
	}
	if !strings.Contains(snippets["nix-conf"], "extra-substituters = "+c.cacheURL) ||
		!strings.Contains(snippets["nix-conf"], "extra-trusted-public-keys = "+c.pub) || snippets["netrc"] == "" {
		t.Fatalf("the project page's snippets %q: want the cluster's cache %s, its key %s and a netrc line", snippets, c.cacheURL, c.pub)
	}
	_, page = u.do("GET", public+"/ci/tokens", nil)
	resp, page := u.do("POST", public+"/ci/tokens", url.Values{"csrf": {hiddenFields(page).Get("csrf")}, "note": {"laptop"}, "days": {"7"}})
	// A client that does not ask for HTML gets JSON.
	var minted struct {
		Token    string   `json:"token"`
		Projects []string `json:"projects"`
	}
	if err := json.Unmarshal([]byte(page), &minted); resp.StatusCode != http.StatusOK || err != nil ||
		!strings.HasPrefix(minted.Token, "hcc1_") || !slices.Contains(minted.Projects, name) {
		t.Fatalf("mint a cache token: %d %v\n%.3000s", resp.StatusCode, err, page)
	}
	token := minted.Token
	netrc := filepath.Join(t.TempDir(), "netrc")
	if err := os.WriteFile(netrc, []byte(strings.ReplaceAll(snippets["netrc"], "<your cache token>", token)), 0o600); err != nil {
		t.Fatal(err)
	}

	substitute := func(netrcFile string) ([]byte, error) {
		args := []string{"--store", t.TempDir(), "-r", output, "--option", "substituters", "", "--option", "require-sigs", "true"}
		for line := range strings.Lines(snippets["nix-conf"]) {
			key, value, _ := strings.Cut(strings.TrimSpace(line), " = ")
			if key == "netrc-file" {
				value = netrcFile
			}
			args = append(args, "--option", key, value)
		}
		cmd := exec.Command("nix-store", args...)
		cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+t.TempDir())
		return cmd.CombinedOutput()
	}
	if out, err := substitute(filepath.Join(t.TempDir(), "no-netrc")); err == nil {
		t.Fatalf("nix-store -r of the private output without the netrc succeeded:\n%s", out)
	}
	if out, err := substitute(netrc); err != nil {
		t.Fatalf("nix-store -r with the page's snippet and the minted token: %v\n%s", err, out)
	}

	// Gitea takes the reader's access back: within the refresh, the token reads nothing.
	if err := c.gitea.Do(ctx, c.owner.Token, http.MethodDelete, collaborator, nil, nil); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, time.Minute, "the token refused once the reader lost access", func() bool {
		req, err := http.NewRequest(http.MethodGet, c.cacheURL+"/"+sp.Hash+".narinfo", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.SetBasicAuth("nix", token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusNotFound
	})
}
