package cli

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

// keygen writes a key pair Nix itself accepts, with private permissions, and refuses to
// overwrite a key it would otherwise destroy.
func TestKeygen(t *testing.T) {
	dir := t.TempDir()
	sec, pub := filepath.Join(dir, "k.sec"), filepath.Join(dir, "k.pub")
	out, err := runCLI(t, "keygen", "--name", "cache.test-1", "--secret-key-file", sec, "--public-key-file", pub)
	if err != nil {
		t.Fatalf("keygen: %v\n%s", err, out)
	}
	for path, mode := range map[string]os.FileMode{sec: 0o600, pub: 0o644} {
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != mode {
			t.Fatalf("%s: mode %v (err %v), want %v", path, fi.Mode().Perm(), err, mode)
		}
	}
	pubText, _ := os.ReadFile(pub)
	if !strings.Contains(out, string(pubText)) {
		t.Errorf("printed %q, want the public key %q", out, pubText)
	}
	key, err := nix.LoadSecretKeyFile(sec)
	if err != nil || key.Public().String() != string(pubText) {
		t.Fatalf("secret key file does not load or does not match the public key: %v", err)
	}
	// Real Nix derives the same public key from our secret key.
	cmd := exec.Command("nix", "--extra-experimental-features", "nix-command", "key", "convert-secret-to-public")
	cmd.Stdin, _ = os.Open(sec)
	got, err := cmd.Output()
	if err != nil {
		t.Fatalf("nix key convert-secret-to-public (Debian package nix-bin): %v", err)
	}
	if strings.TrimSpace(string(got)) != string(pubText) {
		t.Fatalf("nix derives %q from our secret key, we wrote %q", got, pubText)
	}

	before, _ := os.ReadFile(sec)
	if out, err := runCLI(t, "keygen", "--name", "cache.test-2", "--secret-key-file", sec); err == nil ||
		!strings.Contains(err.Error(), "--secret-key-file") || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("overwriting without --force: err %v, output %s", err, out)
	}
	if after, _ := os.ReadFile(sec); !bytes.Equal(before, after) {
		t.Fatal("a refused keygen changed the existing secret key")
	}
	if _, err := runCLI(t, "keygen", "--secret-key-file", filepath.Join(dir, "x")); err == nil || !strings.Contains(err.Error(), "--name") {
		t.Fatalf("missing --name: %v", err)
	}
}
