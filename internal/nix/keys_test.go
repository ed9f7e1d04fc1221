package nix

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestKeysMatchNix(t *testing.T) {
	// Nix's secret → our public key.
	secret := runNix(t, "nix", "key", "generate-secret", "--key-name", "test-1")
	sk, err := ParseSecretKey(secret)
	if err != nil {
		t.Fatal(err)
	}
	if sk.Encode() != secret {
		t.Errorf("Encode() = %q, want Nix's text %q back", sk.Encode(), secret)
	}
	if got, want := sk.Public().String(), convertToPublic(t, secret); got != want {
		t.Errorf("Public() = %q, nix key convert-secret-to-public says %q", got, want)
	}

	// Our secret → Nix's public key.
	ours, err := GenerateKey("harmonia-test-1")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := convertToPublic(t, ours.Encode()), ours.Public().String(); got != want {
		t.Errorf("nix key convert-secret-to-public of our key = %q, we say %q", got, want)
	}
	if pk, err := ParsePublicKey(ours.Public().String()); err != nil || pk.String() != ours.Public().String() {
		t.Errorf("ParsePublicKey round trip: %v, %v", pk, err)
	}
}

func convertToPublic(t *testing.T, secret string) string {
	t.Helper()
	requireNix(t)
	cmd := exec.Command("nix", "--extra-experimental-features", "nix-command", "key", "convert-secret-to-public")
	cmd.Stdin = strings.NewReader(secret)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("nix key convert-secret-to-public: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func TestSignVerify(t *testing.T) {
	sk, err := GenerateKey("cache.example.org-1")
	if err != nil {
		t.Fatal(err)
	}
	other, err := GenerateKey("cache.example.org-1")
	if err != nil {
		t.Fatal(err)
	}
	fp, err := Fingerprint("/nix/store/3bg33srm85jxx662i9qk4qlvkqimzllk-x",
		"sha256:06ms8hqrzysfdg7qxrpg8xx43xd9ma0zigkn21llv7b84jd666n3", 160,
		[]string{"dwycdyjrq46n5jwam106ysjkclk3rvzv-y"})
	if err != nil {
		t.Fatal(err)
	}
	sig := sk.Sign(fp)
	if !strings.HasPrefix(sig, "cache.example.org-1:") {
		t.Fatalf("Sign() = %q, want the key name prefix", sig)
	}
	pub := sk.Public()
	if !pub.Verify(fp, sig) {
		t.Fatal("Verify rejected a valid signature")
	}
	renamed := pub
	renamed.Name = "cache.example.org-2"
	for name, ok := range map[string]bool{
		"tampered fingerprint": pub.Verify(strings.Replace(fp, ";160;", ";161;", 1), sig),
		"other key, same name": other.Public().Verify(fp, sig),
		"other key name":       renamed.Verify(fp, sig),
		"garbage signature":    pub.Verify(fp, "cache.example.org-1:AAAA"),
		"no name":              pub.Verify(fp, strings.TrimPrefix(sig, "cache.example.org-1:")),
		"flipped byte":         pub.Verify(fp, flipLastSigChar(sig)),
	} {
		if ok {
			t.Errorf("Verify accepted: %s", name)
		}
	}
}

func flipLastSigChar(sig string) string {
	// The last base64 char before "==" carries signature bits; change it to another valid one.
	i := strings.TrimRight(sig, "=")
	c := i[len(i)-1]
	r := byte('A')
	if c == 'A' {
		r = 'Q'
	}
	return i[:len(i)-1] + string(r) + sig[len(i):]
}

func TestParseKeyRejects(t *testing.T) {
	sk, err := GenerateKey("k")
	if err != nil {
		t.Fatal(err)
	}
	enc := sk.Encode()
	pub := sk.Public().String()
	b64 := strings.TrimPrefix(enc, "k:")
	for _, s := range []string{
		"",
		"k",
		":" + b64,
		"k:" + b64 + "!",
		"k:" + b64[:len(b64)-4],
		pub, // a public key is too short to be a secret key
		"k k:" + b64,
		// Seed and public half from different keys.
		"k:" + mixKeys(t, enc),
	} {
		if _, err := ParseSecretKey(s); err == nil {
			t.Errorf("ParseSecretKey(%q) succeeded", s)
		}
	}
	for _, s := range []string{"", "k", ":" + strings.TrimPrefix(pub, "k:"), enc, "k:AAAA"} {
		if _, err := ParsePublicKey(s); err == nil {
			t.Errorf("ParsePublicKey(%q) succeeded", s)
		}
	}
	for _, name := range []string{"", "a:b", "a b", "a\tb", "a\n"} {
		if _, err := GenerateKey(name); err == nil {
			t.Errorf("GenerateKey(%q) succeeded", name)
		}
	}
}

func mixKeys(t *testing.T, enc string) string {
	other, err := GenerateKey("k")
	if err != nil {
		t.Fatal(err)
	}
	a, _ := ParseSecretKey(enc)
	raw := append([]byte{}, a.key[:32]...)
	raw = append(raw, other.key[32:]...)
	return strings.TrimPrefix(SecretKey{Name: "k", key: raw}.Encode(), "k:")
}

func TestSecretKeyRedacted(t *testing.T) {
	sk, err := GenerateKey("k")
	if err != nil {
		t.Fatal(err)
	}
	secret := strings.TrimPrefix(sk.Encode(), "k:")
	for _, s := range []string{sk.String(), fmt.Sprint(sk), fmt.Sprintf("%v %+v %#v %s", sk, sk, sk, sk), fmt.Sprint(&sk)} {
		if strings.Contains(s, secret) || strings.Contains(s, secret[:16]) {
			t.Errorf("formatted secret key leaks the secret: %q", s)
		}
	}
	if sk.String() != "k:<redacted>" {
		t.Errorf("String() = %q", sk.String())
	}
}

func TestKeyFiles(t *testing.T) {
	dir := t.TempDir()
	sk, err := GenerateKey("k-1")
	if err != nil {
		t.Fatal(err)
	}
	secretPath, publicPath := filepath.Join(dir, "secret"), filepath.Join(dir, "public")
	if err := sk.WriteFile(secretPath, false); err != nil {
		t.Fatal(err)
	}
	if err := sk.Public().WriteFile(publicPath, false); err != nil {
		t.Fatal(err)
	}
	for path, mode := range map[string]os.FileMode{secretPath: 0o600, publicPath: 0o644} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != mode {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), mode)
		}
	}
	loaded, err := LoadSecretKeyFile(secretPath)
	if err != nil || loaded.Encode() != sk.Encode() {
		t.Fatalf("LoadSecretKeyFile = %v, %v", loaded, err)
	}
	// A key file with a trailing newline (written by hand or `echo`) loads too.
	withNL := filepath.Join(dir, "nl")
	writeFile(t, withNL, []byte(sk.Encode()+"\n"), 0o600)
	if k, err := LoadSecretKeyFile(withNL); err != nil || k.Encode() != sk.Encode() {
		t.Fatalf("LoadSecretKeyFile with newline = %v, %v", k, err)
	}
	// Nix reads our secret key file.
	if got := convertToPublic(t, mustRead(t, secretPath)); got != mustRead(t, publicPath) {
		t.Errorf("nix reads our key file as %q, public file says %q", got, mustRead(t, publicPath))
	}

	other, err := GenerateKey("k-2")
	if err != nil {
		t.Fatal(err)
	}
	if err := other.WriteFile(secretPath, false); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("overwrite without permission: err = %v", err)
	}
	if k, _ := LoadSecretKeyFile(secretPath); k.Encode() != sk.Encode() {
		t.Fatal("refused overwrite still changed the file")
	}
	if err := other.WriteFile(secretPath, true); err != nil {
		t.Fatal(err)
	}
	if k, _ := LoadSecretKeyFile(secretPath); k.Encode() != other.Encode() {
		t.Fatal("forced overwrite did not replace the key")
	}
	if fi, _ := os.Stat(secretPath); fi.Mode().Perm() != 0o600 {
		t.Errorf("overwritten secret key has mode %v", fi.Mode().Perm())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 3 {
		t.Errorf("temporary files left behind: %v", entries)
	}
	if _, err := LoadSecretKeyFile(filepath.Join(dir, "missing")); err == nil {
		t.Error("LoadSecretKeyFile of a missing file succeeded")
	}
	// Private, so that it is the contents that are refused.
	privatePublic := filepath.Join(dir, "public-0600")
	writeFile(t, privatePublic, []byte(mustRead(t, publicPath)), 0o600)
	if _, err := LoadSecretKeyFile(privatePublic); err == nil {
		t.Error("LoadSecretKeyFile of a public key succeeded")
	}
}

// A secret key file other users can read is refused with the fix; its group may read it.
func TestLoadSecretKeyFileMode(t *testing.T) {
	sk, err := GenerateKey("k-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		mode os.FileMode
		ok   bool
	}{
		{0o600, true},
		{0o400, true},
		{0o640, true},
		{0o644, false},
		{0o604, false},
		{0o666, false},
	} {
		t.Run(fmt.Sprintf("%04o", tt.mode), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "signing-key")
			writeFile(t, path, []byte(sk.Encode()), tt.mode)
			k, err := LoadSecretKeyFile(path)
			if tt.ok {
				if err != nil || k.Encode() != sk.Encode() {
					t.Fatalf("LoadSecretKeyFile = %v, %v", k, err)
				}
				return
			}
			want := fmt.Sprintf("%s is readable by other users (mode %04o); run chmod 600 %s", path, tt.mode, path)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("LoadSecretKeyFile: error %v, want one containing %q", err, want)
			}
		})
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
