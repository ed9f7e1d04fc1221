package forge

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/harmonia-ci/harmonia-ci/internal/githubtest"
	"github.com/harmonia-ci/harmonia-ci/internal/gitrepo"
)

// A GitHub read credential is an installation token GitHub scopes to the one repository with
// contents: read: it fetches that repository, not another of the installation, and cannot set
// a status; without it the private repository cannot be fetched at all; the mirror it made
// keeps no trace of it.
func TestGitHubReadCredential(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv := githubtest.New(t)
	work := t.TempDir()
	for _, args := range [][]string{{"init", "-q", "-b", "main", work},
		{"-C", work, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "--allow-empty", "-m", "init"}} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %s: %v\n%s", args, err, out)
		}
	}
	secret := githubtest.Repo{FullName: "octo/secret", Private: true, CloneURL: srv.CloneURL("octo/secret")}
	other := githubtest.Repo{FullName: "octo/other", Private: true, CloneURL: srv.CloneURL("octo/other")}
	srv.AddInstallation(7, secret, other)
	srv.ServeGit(secret.FullName, filepath.Join(work, ".git"))
	srv.ServeGit(other.FullName, filepath.Join(work, ".git"))
	gh, err := NewGitHub(GitHubConfig{Name: "gh", APIURL: srv.URL, AppID: srv.AppID, PrivateKey: srv.PrivateKeyPEM, WebhookSecret: srv.WebhookSecret})
	if err != nil {
		t.Fatal(err)
	}

	for _, byID := range []bool{true, false} {
		repo := Repository{Repo: Repo{Owner: "octo", Name: "secret", InstallationID: 7}, CloneURL: secret.CloneURL, Private: true}
		if byID {
			repo.ForgeID = githubtest.RepoID(secret.FullName)
		}
		cred, err := gh.ReadCredential(ctx, repo)
		if err != nil {
			t.Fatal(err)
		}
		if cred.URL != secret.CloneURL || cred.Username != "x-access-token" || cred.Token == "" || cred.Expires.IsZero() {
			t.Fatalf("credential %v, want a token for %s", cred, secret.CloneURL)
		}
		if s := cred.String() + " " + cred.GoString(); strings.Contains(s, cred.Token) {
			t.Errorf("%q shows the token", s)
		}

		dir := filepath.Join(t.TempDir(), "mirror.git")
		m, err := gitrepo.New(dir, secret.CloneURL)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Fetch(ctx); err == nil {
			t.Fatal("an anonymous fetch of the private repository succeeded")
		}
		if err := m.FetchWith(ctx, cred); err != nil {
			t.Fatalf("fetch with the credential: %v", err)
		}
		if _, err := m.ResolveBranch(ctx, "main"); err != nil {
			t.Fatal(err)
		}
		if err := m.FetchWith(ctx, cred); err != nil { // again, into the existing mirror
			t.Fatalf("second fetch with the credential: %v", err)
		}
		config, err := os.ReadFile(filepath.Join(dir, "config"))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(config), cred.Token) || strings.Contains(strings.ToLower(string(config)), "extraheader") {
			t.Errorf("the mirror's configuration holds the credential:\n%s", config)
		}

		// The same token, another repository of the installation: refused, and the error does
		// not repeat the token.
		om, err := gitrepo.New(filepath.Join(t.TempDir(), "other.git"), other.CloneURL)
		if err != nil {
			t.Fatal(err)
		}
		stolen := cred
		stolen.URL = other.CloneURL
		err = om.FetchWith(ctx, stolen)
		if err == nil {
			t.Fatal("the token fetched another repository")
		}
		if strings.Contains(err.Error(), cred.Token) {
			t.Errorf("error %q holds the token", err)
		}

		// Nor may it set a status: contents: read only.
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/repos/octo/secret/statuses/"+strings.Repeat("1", 40),
			strings.NewReader(`{"state":"success","context":"x"}`))
		req.Header.Set("Authorization", "Bearer "+cred.Token)
		req.Header.Set("User-Agent", "test")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusForbidden {
			t.Errorf("status with the read token: %d, want 403", res.StatusCode)
		}

		// Revoked once used: the token fetches nothing more.
		if len(srv.LiveReadTokens()) != 1 {
			t.Fatalf("live read tokens before the revocation: %d, want 1", len(srv.LiveReadTokens()))
		}
		if err := cred.Revoke(ctx, http.DefaultClient); err != nil {
			t.Fatalf("revoke: %v", err)
		}
		if live := srv.LiveReadTokens(); len(live) != 0 {
			t.Errorf("%d read tokens live after the revocation", len(live))
		}
		if err := m.FetchWith(ctx, cred); err == nil {
			t.Error("a revoked token fetched the repository")
		}
	}
	if served, refused := srv.GitFetches(secret.FullName); served < 2 || refused < 1 {
		t.Errorf("stand-in served %d fetches and refused %d, want the credential's served and the anonymous one refused", served, refused)
	}
	if _, refused := srv.GitFetches(other.FullName); refused < 2 {
		t.Errorf("stand-in refused %d fetches of the other repository, want 2", refused)
	}
}

// Deploy keys are derived: the same for the same repository, another for another repository
// or another forge secret, and a valid OpenSSH key whose public half is the one registered.
func TestDeployKey(t *testing.T) {
	t.Parallel()
	a1, a2 := deployKey([]byte("secret-a"), 1), deployKey([]byte("secret-a"), 1)
	if !a1.Equal(a2) {
		t.Error("the deploy key of one repository changed")
	}
	if a1.Equal(deployKey([]byte("secret-a"), 2)) || a1.Equal(deployKey([]byte("secret-b"), 1)) {
		t.Error("two repositories or two forges share a deploy key")
	}
	priv, err := openSSHPrivateKey(a1)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.ParsePrivateKey([]byte(priv))
	if err != nil {
		t.Fatalf("ssh cannot read the key: %v\n%s", err, priv)
	}
	pub, err := authorizedKey(a1)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey()))); got != pub {
		t.Errorf("public key %q, registered %q", got, pub)
	}
	if _, err := ssh.ParsePublicKey(signer.PublicKey().Marshal()); err != nil {
		t.Fatal(err)
	}
}
