package gitrepo

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A key reaches ssh as a file that is gone once git is done, whether the fetch worked or not,
// and no error repeats it; a credential that does not fit its URL is refused before git runs.
func TestFetchWithCredential(t *testing.T) {
	const key = "-----BEGIN OPENSSH PRIVATE KEY-----\nnot-a-real-key-FETCHWITHTEST\n-----END OPENSSH PRIVATE KEY-----\n"
	tests := []struct {
		name    string
		cred    Credential
		wantErr string
	}{
		// Port 1 on loopback: nothing listens, ssh fails at once.
		{name: "ssh key", cred: Credential{URL: "ssh://git@127.0.0.1:1/o/r.git", SSHKey: key}, wantErr: "git clone"},
		{name: "token for ssh", cred: Credential{URL: "ssh://git@127.0.0.1:1/o/r.git", Username: "x-access-token", Token: "tok-FETCHWITHTEST"},
			wantErr: "a token is for an http(s) URL"},
		{name: "both", cred: Credential{URL: "https://127.0.0.1:1/o/r.git", Token: "tok-FETCHWITHTEST", SSHKey: key},
			wantErr: "both a token and a key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmp := t.TempDir()
			t.Setenv("TMPDIR", tmp)
			m, err := New(filepath.Join(t.TempDir(), "m.git"), tt.cred.URL)
			if err != nil {
				t.Fatal(err)
			}
			err = m.FetchWith(t.Context(), tt.cred)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("FetchWith: %v, want an error with %q", err, tt.wantErr)
			}
			if strings.Contains(err.Error(), "FETCHWITHTEST") {
				t.Errorf("error %q repeats the credential", err)
			}
			left, err := os.ReadDir(tmp)
			if err != nil {
				t.Fatal(err)
			}
			if len(left) != 0 {
				t.Errorf("left in TMPDIR after the fetch: %v", left)
			}
			if _, err := os.Stat(m.Dir); err == nil {
				t.Errorf("a failed fetch left the mirror %s", m.Dir)
			}
		})
	}
}

// The token goes to git as an Authorization header for the credential's URL, in the
// environment; nothing of it is on git's command line.
func TestCredentialGitEnv(t *testing.T) {
	t.Parallel()
	c := Credential{URL: "https://forge.example/o/r.git", Username: "x-access-token", Token: "tok"}
	env, cleanup, err := c.gitEnv("/known_hosts")
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	want := []string{"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=http.https://forge.example/o/r.git.extraHeader",
		"GIT_CONFIG_VALUE_0=Authorization: Basic eC1hY2Nlc3MtdG9rZW46dG9r"}
	if strings.Join(env, "\n") != strings.Join(want, "\n") {
		t.Errorf("env %q, want %q", env, want)
	}
	if s := c.String(); strings.Contains(s, "tok\"") || strings.Contains(s, ":tok") {
		t.Errorf("String() = %q shows the token", s)
	}
}
