package cli

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
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

// withUmask runs the rest of the test under umask mask, to show that secret files do not take
// their mode from it.
func withUmask(t *testing.T, mask int) {
	old := syscall.Umask(mask)
	t.Cleanup(func() { syscall.Umask(old) })
}

func wantMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != want {
		t.Errorf("%s: mode %04o, want %04o", path, fi.Mode().Perm(), want)
	}
}

// The key files keygen writes are private even under a umask that grants everything.
func TestKeygenIgnoresUmask(t *testing.T) {
	withUmask(t, 0)
	dir := t.TempDir()
	sec := filepath.Join(dir, "k.sec")
	for _, args := range [][]string{{}, {"--force"}} {
		if out, err := runCLI(t, append([]string{"keygen", "--name", "k-1", "--secret-key-file", sec}, args...)...); err != nil {
			t.Fatalf("keygen %v: %v\n%s", args, err, out)
		}
		wantMode(t, sec, 0o600)
	}
}

// ensureToken creates a private token once and returns it ever after; it refuses an existing
// token other users can read, and replaces an empty one.
func TestEnsureToken(t *testing.T) {
	withUmask(t, 0)
	tests := []struct {
		name     string
		existing string // "" for none
		mode     os.FileMode
		wantErr  bool
	}{
		{"new", "", 0, false},
		{"existing 0600", "t0ken\n", 0o600, false},
		{"existing 0640", "t0ken\n", 0o640, false},
		{"existing 0644", "t0ken\n", 0o644, true},
		{"existing 0604", "t0ken\n", 0o604, true},
		{"empty 0600", "\n", 0o600, false},
		{"empty 0644", "", 0o644, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "admin-token")
			if tt.mode != 0 {
				if err := os.WriteFile(path, []byte(tt.existing), tt.mode); err != nil {
					t.Fatal(err)
				}
			}
			token, err := ensureToken(path)
			if tt.wantErr {
				want := fmt.Sprintf("%s is readable by other users (mode %04o); run chmod 600 %s", path, tt.mode, path)
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("ensureToken: token %q, error %v; want an error containing %q", token, err, want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.TrimSpace(tt.existing) != "" {
				if token != "t0ken" {
					t.Errorf("ensureToken = %q, want the existing t0ken", token)
				}
				wantMode(t, path, tt.mode)
				return
			}
			if len(token) != 64 {
				t.Errorf("new token %q, want 64 hex digits", token)
			}
			wantMode(t, path, 0o600)
			if again, err := ensureToken(path); err != nil || again != token {
				t.Errorf("second ensureToken = %q, %v; want %q", again, err, token)
			}
			if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
				t.Errorf("files left beside the token: %v", entries)
			}
		})
	}
}

// Concurrent first starts on one state directory agree on one token.
func TestEnsureTokenConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cluster-token")
	tokens := make([]string, 8)
	var wg sync.WaitGroup
	for i := range tokens {
		wg.Go(func() {
			var err error
			if tokens[i], err = ensureToken(path); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for _, tok := range tokens {
		if tok != tokens[0] || tok == "" {
			t.Fatalf("tokens differ: %q", tokens)
		}
	}
}

// ensureSigningKey creates a private key that loads, and refuses an existing one other users
// can read rather than sign with it.
func TestEnsureSigningKey(t *testing.T) {
	withUmask(t, 0)
	dir := t.TempDir()
	path, err := ensureSigningKey(dir, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	wantMode(t, path, 0o600)
	wantMode(t, path+".pub", 0o644)
	key, err := nix.LoadSecretKeyFile(path)
	if err != nil || key.Name != "node-1-1" {
		t.Fatalf("generated key: %v, %v", key, err)
	}
	if again, err := ensureSigningKey(dir, "node-1"); err != nil || again != path {
		t.Fatalf("second ensureSigningKey = %q, %v", again, err)
	}
	if k, _ := nix.LoadSecretKeyFile(path); k.Encode() != key.Encode() {
		t.Fatal("second ensureSigningKey replaced the key")
	}

	for mode, ok := range map[os.FileMode]bool{0o640: true, 0o644: false, 0o604: false} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		_, err := ensureSigningKey(dir, "node-1")
		want := fmt.Sprintf("%s is readable by other users (mode %04o); run chmod 600 %s", path, mode, path)
		if ok && err != nil || !ok && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("key mode %04o: error %v, want ok=%v", mode, err, ok)
		}
	}
}
