package e2e

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
)

// substitutePrivate turns d's jobs into a private project's (project name): its outputs are
// then refused to a Nix client without credentials, as paths the cache does not have, and
// substituted with require-sigs by one whose netrc-file holds a token minted by
// `harmonia-ci cache-token`.
func (f *fixture) substitutePrivate(d dag, name, cacheURL, trusted string) {
	t := f.t
	t.Helper()
	ctx := context.Background()
	for _, q := range []string{
		`INSERT INTO repositories (forge, owner, name, full_name, clone_url, is_private) VALUES ('git', 'e2e', $1, 'e2e/'||$1, 'file:///'||$1, true)`,
		`INSERT INTO projects (repo_id, name) SELECT id, $1 FROM repositories WHERE full_name = 'e2e/'||$1`,
	} {
		if _, err := f.pool.Exec(ctx, q, name); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, drv := range d.drvs {
		if _, err := f.pool.Exec(ctx, `UPDATE build_jobs SET project_id = (SELECT id FROM projects WHERE name = $1) WHERE drv_path = $2`, name, drv); err != nil {
			t.Fatal(err)
		}
	}
	sp, err := nix.ParseStorePath(d.outputs["a"])
	if err != nil {
		t.Fatal(err)
	}
	// Cache nodes learn of a project turned private within their TTL.
	proctest.WaitFor(t, 30*time.Second, "a's narinfo refused anonymously", func() bool {
		resp, err := http.Get(cacheURL + "/" + sp.Hash + ".narinfo")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusNotFound
	})

	out := newCLI(t, f).ok("cache-token", "--projects", name, "--expires", "1h")
	var token string
	for _, l := range strings.Fields(out) {
		if strings.HasPrefix(l, "hcc1_") {
			token = l
		}
	}
	if token == "" {
		t.Fatalf("cache-token printed no token:\n%s", out)
	}
	u, err := url.Parse(cacheURL)
	if err != nil {
		t.Fatal(err)
	}
	netrc := filepath.Join(t.TempDir(), "netrc")
	if err := os.WriteFile(netrc, []byte("machine "+u.Hostname()+" login nix password "+token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, withNetrc := range []bool{false, true} {
		args := []string{"--store", t.TempDir(), "-r", d.outputs["c"], d.outputs["b"], d.outputs["a"],
			"--option", "substituters", cacheURL, "--option", "trusted-public-keys", trusted, "--option", "require-sigs", "true"}
		if withNetrc {
			args = append(args, "--option", "netrc-file", netrc)
		}
		cmd := exec.Command("nix-store", args...)
		// A narinfo disk cache of its own: the earlier substitution's would skip the lookups.
		cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+t.TempDir())
		out, err := cmd.CombinedOutput()
		switch {
		case withNetrc && err != nil:
			t.Fatalf("nix-store -r of a private project's outputs with a netrc-file: %v\n%s", err, out)
		case !withNetrc && err == nil:
			t.Fatalf("nix-store -r of a private project's outputs without credentials succeeded:\n%s", out)
		}
	}

	// Listed (never the token), revoked: refused on the next lookup.
	cli := newCLI(t, f)
	var tokens []struct {
		ID       int64    `json:"id"`
		Projects []string `json:"projects"`
	}
	cli.json(&tokens, "cache-token", "list", "--json")
	if len(tokens) == 0 || len(tokens[0].Projects) != 1 || tokens[0].Projects[0] != name {
		t.Fatalf("cache-token list: %+v", tokens)
	}
	if l := cli.ok("cache-token", "list"); strings.Contains(l, token) {
		t.Fatalf("cache-token list shows the token:\n%s", l)
	}
	cli.ok("cache-token", "revoke", strconv.FormatInt(tokens[0].ID, 10))
	req, err := http.NewRequest(http.MethodGet, cacheURL+"/"+sp.Hash+".narinfo", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth("nix", token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("a's narinfo with a revoked token: %d, want 404", resp.StatusCode)
	}
}
