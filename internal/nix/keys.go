package nix

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"unicode"
)

// SecretKey is an ed25519 signing key in Nix's format ("name:base64(64-byte private key)"), as
// produced by `nix key generate-secret` and read by Nix's secret-key-files option.
// The zero value is not usable.
type SecretKey struct {
	Name string
	key  ed25519.PrivateKey
}

// PublicKey is an ed25519 verification key in Nix's format ("name:base64(32 bytes)"), as used
// in trusted-public-keys.
type PublicKey struct {
	Name string
	key  ed25519.PublicKey
}

// checkKeyName rejects names Nix would mis-split (':') or that cannot survive being written in
// a whitespace-separated trusted-public-keys list.
func checkKeyName(name string) error {
	if name == "" {
		return errors.New("empty key name")
	}
	if strings.ContainsRune(name, ':') {
		return fmt.Errorf("key name %q contains ':'", name)
	}
	if strings.ContainsFunc(name, unicode.IsSpace) {
		return fmt.Errorf("key name %q contains whitespace", name)
	}
	return nil
}

// splitKey splits "name:base64" at the first colon (as Nix does) and decodes the key.
func splitKey(s string, size int) (string, []byte, error) {
	name, b64, ok := strings.Cut(s, ":")
	if !ok {
		return "", nil, errors.New("want name:base64")
	}
	if err := checkKeyName(name); err != nil {
		return "", nil, err
	}
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return "", nil, fmt.Errorf("key %q: invalid base64: %w", name, err)
	}
	if len(raw) != size {
		return "", nil, fmt.Errorf("key %q: want %d bytes, got %d", name, size, len(raw))
	}
	return name, raw, nil
}

// GenerateKey creates a new signing key named name (conventionally "cache.example.org-1").
func GenerateKey(name string) (SecretKey, error) {
	if err := checkKeyName(name); err != nil {
		return SecretKey{}, fmt.Errorf("generate key: %w", err)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return SecretKey{}, fmt.Errorf("generate key: %w", err)
	}
	return SecretKey{Name: name, key: priv}, nil
}

// ParseSecretKey parses Nix's secret key text. Surrounding whitespace (a trailing newline in a
// key file) is ignored.
func ParseSecretKey(s string) (SecretKey, error) {
	name, raw, err := splitKey(strings.TrimSpace(s), ed25519.PrivateKeySize)
	if err != nil {
		return SecretKey{}, fmt.Errorf("parse secret key: %w", err)
	}
	// The second half of an ed25519 private key is its public key; a mismatch means a corrupt
	// key that would sign with one key and advertise another.
	priv := ed25519.PrivateKey(raw)
	derived := ed25519.NewKeyFromSeed(priv.Seed())
	if !bytes.Equal(derived, priv) {
		return SecretKey{}, fmt.Errorf("parse secret key %q: public half does not match the seed", name)
	}
	return SecretKey{Name: name, key: priv}, nil
}

// LoadSecretKeyFile reads a secret key file such as Nix's secret-key-files entries. A file other
// users can read is refused (see CheckSecretMode).
func LoadSecretKeyFile(path string) (SecretKey, error) {
	f, err := os.Open(path)
	if err != nil {
		return SecretKey{}, fmt.Errorf("load secret key: %w", err)
	}
	defer f.Close()
	// The mode of the file opened, not of whatever the path names by the time of the check.
	fi, err := f.Stat()
	if err != nil {
		return SecretKey{}, fmt.Errorf("load secret key: %w", err)
	}
	if err := CheckSecretMode(path, fi.Mode()); err != nil {
		return SecretKey{}, fmt.Errorf("load secret key: %w", err)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return SecretKey{}, fmt.Errorf("load secret key: %w", err)
	}
	k, err := ParseSecretKey(string(b))
	if err != nil {
		return SecretKey{}, fmt.Errorf("load secret key %s: %w", path, err)
	}
	return k, nil
}

// CheckSecretMode refuses a secret file, at path with mode, that other users can read, naming
// the fix. Its group may read it: operators share secrets with a service's group.
func CheckSecretMode(path string, mode fs.FileMode) error {
	if mode&0o004 == 0 {
		return nil
	}
	return fmt.Errorf("%s is readable by other users (mode %04o); run chmod 600 %s", path, mode.Perm(), path)
}

// ParsePublicKey parses Nix's public key text.
func ParsePublicKey(s string) (PublicKey, error) {
	name, raw, err := splitKey(strings.TrimSpace(s), ed25519.PublicKeySize)
	if err != nil {
		return PublicKey{}, fmt.Errorf("parse public key: %w", err)
	}
	return PublicKey{Name: name, key: ed25519.PublicKey(raw)}, nil
}

// Public returns the matching public key.
func (k SecretKey) Public() PublicKey {
	return PublicKey{Name: k.Name, key: k.key.Public().(ed25519.PublicKey)}
}

// String redacts the key so that it cannot leak through logs or %v.
func (k SecretKey) String() string { return k.Name + ":<redacted>" }

// GoString redacts the key for %#v too.
func (k SecretKey) GoString() string {
	return fmt.Sprintf("nix.SecretKey{Name:%q, <redacted>}", k.Name)
}

// Encode returns the real secret key text, for writing a key file.
func (k SecretKey) Encode() string {
	return k.Name + ":" + base64.StdEncoding.EncodeToString(k.key)
}

// Sign signs a fingerprint (see Fingerprint) and returns the signature as a narinfo Sig value,
// "name:base64(signature)".
func (k SecretKey) Sign(fingerprint string) string {
	return k.Name + ":" + base64.StdEncoding.EncodeToString(ed25519.Sign(k.key, []byte(fingerprint)))
}

// String returns the key in Nix's trusted-public-keys format.
func (k PublicKey) String() string {
	return k.Name + ":" + base64.StdEncoding.EncodeToString(k.key)
}

// Verify reports whether sig ("name:base64") is a valid signature of fingerprint by this key.
// A signature by a key of a different name is never valid, as in Nix.
func (k PublicKey) Verify(fingerprint, sig string) bool {
	name, raw, err := splitSig(sig)
	if err != nil || name != k.Name || len(k.key) != ed25519.PublicKeySize {
		return false
	}
	return ed25519.Verify(k.key, []byte(fingerprint), raw)
}

func splitSig(sig string) (string, []byte, error) {
	name, raw, err := splitKey(sig, ed25519.SignatureSize)
	if err != nil {
		return "", nil, fmt.Errorf("invalid signature: %w", err)
	}
	return name, raw, nil
}

// WriteFile writes the secret key to path with mode 0600. An existing file is an error unless
// overwrite is set; overwriting replaces the file atomically so a crash never leaves half a key.
func (k SecretKey) WriteFile(path string, overwrite bool) error {
	if err := writeKeyFile(path, []byte(k.Encode()), 0o600, overwrite); err != nil {
		return fmt.Errorf("write secret key: %w", err)
	}
	return nil
}

// WriteFile writes the public key to path with mode 0644 (see SecretKey.WriteFile).
func (k PublicKey) WriteFile(path string, overwrite bool) error {
	if err := writeKeyFile(path, []byte(k.String()), 0o644, overwrite); err != nil {
		return fmt.Errorf("write public key: %w", err)
	}
	return nil
}

// writeKeyFile writes data without a trailing newline, as Nix writes its key files. The file is
// created with its final mode from the start, so the secret is never readable by others.
func writeKeyFile(path string, data []byte, perm fs.FileMode, overwrite bool) (err error) {
	if !overwrite {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
		if err != nil {
			if errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("%s already exists", path)
			}
			return err
		}
		// Chmod undoes the umask, so a public key is readable even under umask 077.
		_, err = f.Write(data)
		if err == nil {
			err = f.Chmod(perm)
		}
		if err != nil {
			f.Close()
			os.Remove(path)
			return err
		}
		if err := f.Close(); err != nil {
			os.Remove(path)
			return err
		}
		return nil
	}
	// CreateTemp makes the file 0600, so a secret is never briefly readable by others; Chmod
	// then sets the final mode before the rename makes the file visible.
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(f.Name())
		}
	}()
	if _, err = f.Write(data); err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
