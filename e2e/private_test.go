package e2e

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/giteatest"
	"github.com/harmonia-ci/harmonia-ci/internal/githubtest"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
)

// probeNix is a project that looks for a forge credential where a careless CI leaves one: at
// evaluation time in its environment and its source's .git, at build time in the builder's
// environment, ~/.git-credentials, ~/.netrc and .git/config (of the build directory and of
// HOME). Finding one fails the evaluation (a throw) or the build (exit 1); the build's log
// shows what it looked at.
func probeNix(salt string) string {
	return shLib(salt) + ` let
  marks = [ "ghs_" "x-access-token" "PRIVATE KEY" "[Aa]uthorization" "[Ee]xtra[Hh]eader" "GIT_SSH" "GIT_CONFIG_" ];
  leaks = s: builtins.any (m: builtins.match ".*${m}.*" s != null) marks;
  env = builtins.concatStringsSep " " (map builtins.getEnv
    [ "HOME" "GIT_CONFIG_COUNT" "GIT_CONFIG_KEY_0" "GIT_CONFIG_VALUE_0" "GIT_SSH_COMMAND" "GIT_ASKPASS" "NETRC" ]);
  evalSeen = env + (if builtins.pathExists ./.git then "a .git in the evaluated source" else "");
  probe = ''
    found=0
    for f in "$HOME/.git-credentials" "$HOME/.netrc" "$HOME/.git/config" ./.git/config /root/.git-credentials /root/.netrc /build/.git/config; do
      if [ -r "$f" ]; then echo "readable: $f"; found=1; fi
    done
    env > env.txt
    while IFS= read -r l; do
      case "$l" in
        *ghs_*|*x-access-token*|*"PRIVATE KEY"*|*uthorization*|*xtraheader*|*xtraHeader*|GIT_SSH*|GIT_CONFIG_*) echo "in the environment: $l"; found=1;;
      esac
    done < env.txt
    echo "probed the environment and credential files: found=$found"
    if [ "$found" != 0 ]; then exit 1; fi
  '';
in
  if leaks evalSeen then throw "credential visible at evaluation time" else {
    probe = sh "probe" [] probe;
  }`
}

// Private repositories, one on Gitea (fetched over Gitea's SSH server with the repository's
// read-only deploy key) and one on the GitHub stand-in (fetched over HTTP with an installation
// token scoped to it, contents: read), are enabled, evaluated and built, and their statuses
// arrive. The project's code finds no credential at evaluation or build time, and no
// credential is in the database, the nodes' logs or the nodes' state directories afterwards.
func TestPrivateRepositories(t *testing.T) {
	const ghName, ghInstall = "octo-private/secret", 77
	var gh *githubtest.Server
	ghWork := t.TempDir()
	c := newForgeCluster(t, forgeOptions{private: true, prepare: func(*giteatest.Server, giteatest.User) (string, []string) {
		gh = githubtest.New(t)
		gitRun(t, "init", "-q", "-b", "main", ghWork)
		repo := githubtest.Repo{FullName: ghName, Private: true, CloneURL: gh.CloneURL(ghName)}
		gh.AddInstallation(ghInstall, repo)
		gh.ServeGit(ghName, filepath.Join(ghWork, ".git"))
		lines := fmt.Sprintf("[[forges]]\nname = \"gh\"\ntype = \"github\"\napi_url = %q\napp_id = %d\n", gh.URL, gh.AppID)
		return lines, []string{"HARMONIA_FORGE_GH_PRIVATE_KEY=" + string(gh.PrivateKeyPEM),
			"HARMONIA_FORGE_GH_WEBHOOK_SECRET=" + string(gh.WebhookSecret)}
	}})
	ctx := context.Background()
	salt := uniqueSalt(t)

	// Gitea: enabling registers the webhook and a read-only deploy key; a push is evaluated and
	// built.
	c.enable(nil)
	var keys []struct {
		ReadOnly bool   `json:"read_only"`
		Key      string `json:"key"`
	}
	if err := c.gitea.Do(ctx, c.owner.Token, http.MethodGet, "/repos/"+c.repo.FullName()+"/keys", nil, &keys); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || !keys[0].ReadOnly || !strings.HasPrefix(keys[0].Key, "ssh-ed25519 ") {
		t.Fatalf("deploy keys after enable: %+v, want one read-only ed25519 key", keys)
	}
	giteaSHA := c.push(c.owner, c.repo, "main", map[string]string{"ci.nix": probeNix(salt + "-gitea")}, false)

	// The stand-in: discovered as private, enabled, a push delivered.
	var ghRepoID int64
	proctest.WaitFor(t, 30*time.Second, "repository "+ghName+" discovered", func() bool {
		c.checkRunning()
		var private bool
		err := c.pool.QueryRow(ctx, `SELECT id, is_private FROM repositories WHERE forge = 'gh' AND full_name = $1 AND forge_id IS NOT NULL`,
			ghName).Scan(&ghRepoID, &private)
		return err == nil && private
	})
	if code, out := c.admin("front-1", http.MethodPost, fmt.Sprintf("/api/projects/%d/enable", ghRepoID), map[string]any{}); code != http.StatusOK {
		t.Fatalf("enable %s: %d %s", ghName, code, out)
	}
	if err := os.WriteFile(filepath.Join(ghWork, "ci.nix"), []byte(probeNix(salt+"-github")), 0o644); err != nil {
		t.Fatal(err)
	}
	gitRun(t, "-C", ghWork, "add", "ci.nix")
	gitRun(t, "-C", ghWork, "-c", "user.name=octo", "-c", "user.email=octo@example.invalid", "commit", "-q", "-m", "ci")
	ghSHA := strings.TrimSpace(gitRun(t, "-C", ghWork, "rev-parse", "HEAD"))
	gh.SetBranch(ghName, "main", ghSHA)
	res, err := gh.Deliver(ctx, c.endpoint("front-1")+"/webhook/gh", "push", githubtest.PushPayload(githubtest.Push{
		Repo: githubtest.Repo{FullName: ghName, Private: true, CloneURL: gh.CloneURL(ghName)}, Ref: "refs/heads/main",
		After: ghSHA, Sender: "octo", Installation: ghInstall}))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode/100 != 2 {
		t.Fatalf("push delivery to gh: %d %s", res.StatusCode, body)
	}

	// Both are evaluated and built; both forges get their statuses.
	c.waitStatuses(giteaSHA, "success", "success", 3*time.Minute)
	proctest.WaitFor(t, 3*time.Minute, "statuses of "+ghName, func() bool {
		c.checkRunning()
		got := map[string]string{}
		for _, s := range gh.Statuses(ghName, ghSHA) {
			got[s.Context] = s.State
		}
		return got[ctxEval] == "success" && got[ctxBuild] == "success"
	})
	if served, _ := gh.GitFetches(ghName); served == 0 {
		t.Error("the stand-in served no fetch of the private repository")
	}
	// The evaluator revoked its read token after the fetch, not leaving it to expire.
	if live := gh.LiveReadTokens(); len(live) != 0 {
		t.Errorf("%d read tokens still live after the evaluation", len(live))
	}
	front := c.procs["front-1"].Logs()
	for _, forgeName := range []string{"gitea", "gh"} {
		if !strings.Contains(front, "read credential issued") || !strings.Contains(front, "forge="+forgeName) {
			t.Errorf("front-1 logged no read credential issued for forge %s:\n%s", forgeName, lastLines(front, 40))
		}
	}
	// Gitea's was a deploy key over ssh: the evaluator pinned the SSH server's host key.
	pinned, err := filepath.Glob(filepath.Join(filepath.Dir(ghWork), "*", "*", "git", "*.known_hosts"))
	if err != nil {
		t.Fatal(err)
	}
	if len(pinned) != 1 {
		t.Errorf("known_hosts files of the mirrors: %q, want the Gitea repository's", pinned)
	} else if data, err := os.ReadFile(pinned[0]); err != nil || !strings.Contains(string(data), fmt.Sprintf("[127.0.0.1]:%d ssh-ed25519 ", c.gitea.SSHPort)) {
		t.Errorf("%s: %q, %v; want Gitea's ed25519 host key", pinned[0], data, err)
	}

	// No credential anywhere it could stay: the database, the logs, the state directories.
	// (The tokens themselves; the deploy key by its PEM header, which the probe's own text
	// does not hold.)
	secrets := append(gh.IssuedTokens(), "OPENSSH PRIVATE KEY")
	if len(secrets) < 2 {
		t.Fatal("the stand-in issued no token")
	}
	dump := databaseText(t, c.pool)
	for id, p := range c.procs {
		for _, s := range secrets {
			if strings.Contains(p.Logs(), s) {
				t.Errorf("%s's log holds %q", id, s)
			}
		}
	}
	for _, s := range secrets {
		if strings.Contains(dump, s) {
			t.Errorf("the database holds %q", s)
		}
	}
	root := filepath.Dir(ghWork) // the test's temporary directories: every node's state
	if err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // a build's read-only or vanished file
		}
		if d.IsDir() {
			if d.Name() == "store" || d.Name() == "nix" || path == ghWork {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil || !info.Mode().IsRegular() || info.Size() > 4<<20 {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		for _, s := range secrets {
			if strings.Contains(string(data), s) {
				t.Errorf("%s holds %q", path, s)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(os.TempDir(), "hci-fetch-key-*")); len(leftovers) > 0 {
		t.Errorf("key directories left after the fetches: %q", leftovers)
	}
}

// gitRun runs git and returns its output.
func gitRun(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("git", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// databaseText is every row of every table of the public schema, as text.
func databaseText(t *testing.T, pool interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) string {
	t.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' AND table_type = 'BASE TABLE'`)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, table := range tables {
		rows, err := pool.Query(ctx, `SELECT t::text FROM `+pgx.Identifier{table}.Sanitize()+` t`)
		if err != nil {
			t.Fatal(err)
		}
		texts, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range texts {
			b.WriteString(s + "\n")
		}
	}
	if !strings.Contains(b.String(), "octo-private") {
		t.Fatal("the database text holds not even the repository's name")
	}
	return b.String()
}

// A repository made private after discovery recorded it public: the evaluator's anonymous
// fetch is refused for want of credentials, so it asks a frontend for the evaluation's read
// credential and fetches once more with it, and the push is evaluated and built.
func TestRepositoryMadePrivateAfterDiscovery(t *testing.T) {
	// Discovery lists the repository public at the start, and not again for an hour.
	c := newForgeCluster(t, forgeOptions{repoSync: "1h"})
	ctx := context.Background()
	proctest.WaitFor(t, time.Minute, "the first repository discovery", func() bool {
		c.checkRunning()
		var n int
		err := c.pool.QueryRow(ctx, `SELECT count(*) FROM maintenance_runs WHERE task = 'forge-repositories'`).Scan(&n)
		return err == nil && n > 0
	})
	c.enable(nil)
	// Made private on the forge; the row still says public.
	if err := c.gitea.Do(ctx, c.owner.Token, http.MethodPatch, "/repos/"+c.repo.FullName(), map[string]any{"private": true}, nil); err != nil {
		t.Fatal(err)
	}
	sha := c.push(c.owner, c.repo, "main", map[string]string{"ci.nix": probeNix(uniqueSalt(t))}, false)
	c.waitStatuses(sha, "success", "success", 3*time.Minute)

	var logs string
	for _, p := range c.procs {
		logs += p.Logs()
	}
	if !strings.Contains(logs, "anonymous fetch was refused for want of credentials") {
		t.Errorf("no evaluator logged the fallback to a read credential:\n%s", lastLines(logs, 40))
	}
	if front := c.procs["front-1"].Logs(); !strings.Contains(front, "read credential issued") {
		t.Errorf("front-1 issued no read credential:\n%s", lastLines(front, 40))
	}
	if strings.Contains(logs, "OPENSSH PRIVATE KEY") {
		t.Error("a node's log holds the deploy key")
	}
}
