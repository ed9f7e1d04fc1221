package gitrepo

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// git and what it runs inherit only the variables on gitEnv's allow-list.
func TestGitEnv(t *testing.T) {
	tests := []struct {
		name, value string
		kept        bool
	}{
		{"HARMONIA_CLUSTER_TOKEN", "secret", false},
		{"HARMONIA_DATABASE_URL", "postgres://u:secret@db/x", false},
		{"AWS_SECRET_ACCESS_KEY", "secret", false},
		{"DATABASE_URL", "postgres://u:secret@db/x", false},
		{"GIT_DIR", "/elsewhere", false},
		{"GIT_CONFIG_PARAMETERS", "'core.sshCommand'='evil'", false},
		{"LD_PRELOAD", "/tmp/evil.so", false},
		{"HOME", "/home/ci", true},
		{"SSH_AUTH_SOCK", "/run/agent.sock", true},
		{"https_proxy", "http://proxy:3128", true},
		{"NO_PROXY", "localhost", true},
		{"GIT_SSH_COMMAND", "ssh -i /etc/ci/key", true},
		{"GIT_SSL_CAINFO", "/etc/ci/ca.pem", true},
		{"GIT_TRACE_PACKET", "1", true},
	}
	for _, tt := range tests {
		t.Setenv(tt.name, tt.value)
	}
	env := gitEnv()
	for _, tt := range tests {
		if got := slices.Contains(env, tt.name+"="+tt.value); got != tt.kept {
			t.Errorf("%s passed to git: %v, want %v", tt.name, got, tt.kept)
		}
	}
	if !slices.Contains(env, "GIT_CONFIG_GLOBAL=/dev/null") {
		t.Errorf("env %q lacks the settings gitEnv adds", env)
	}
}

// End to end: the ssh program git runs for an ssh:// remote dumps the environment it got, and no
// secret of this process is in it.
func TestGitSeesNoSecrets(t *testing.T) {
	dir := t.TempDir()
	dump := filepath.Join(dir, "env")
	ssh := filepath.Join(dir, "ssh")
	if err := os.WriteFile(ssh, []byte("#!/bin/sh\nenv > '"+dump+"'\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GIT_SSH_COMMAND", ssh)
	t.Setenv("SSH_AUTH_SOCK", "/run/test-agent.sock")
	t.Setenv("HARMONIA_CLUSTER_TOKEN", "cluster-secret-1")
	t.Setenv("HARMONIA_S3_SECRET_KEY", "s3-secret-2")

	m, err := New(filepath.Join(dir, "mirror.git"), "ssh://git.example.invalid/project.git")
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Fetch(t.Context()); err == nil {
		t.Fatal("Fetch from a remote whose ssh exits 1 succeeded")
	}
	raw, err := os.ReadFile(dump)
	if err != nil {
		t.Fatalf("git did not run the ssh command: %v", err)
	}
	env := string(raw)
	if !strings.Contains(env, "SSH_AUTH_SOCK=/run/test-agent.sock") {
		t.Errorf("the ssh command did not get SSH_AUTH_SOCK:\n%s", env)
	}
	for _, secret := range []string{"HARMONIA_", "cluster-secret-1", "s3-secret-2"} {
		if strings.Contains(env, secret) {
			t.Errorf("the ssh command's environment holds %q:\n%s", secret, env)
		}
	}
}
