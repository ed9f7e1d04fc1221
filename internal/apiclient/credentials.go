package apiclient

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// Credentials is the file `harmonia-ci login` writes: a token per server, keyed by the server's
// URL as ParseServer spells it. The file is 0600 in a 0700 directory; one that others may read
// is refused rather than used.
type Credentials struct {
	Servers map[string]StoredToken `json:"servers"`
}

// StoredToken is one server's token.
type StoredToken struct {
	Token    string    `json:"token"`
	Name     string    `json:"name"`
	StoredAt time.Time `json:"stored_at"`
}

// CredentialsPath is $XDG_CONFIG_HOME/harmonia-ci/credentials.json (default
// ~/.config/harmonia-ci/credentials.json); getenv reads the environment.
func CredentialsPath(getenv func(string) string) (string, error) {
	dir := getenv("XDG_CONFIG_HOME")
	if dir == "" || !filepath.IsAbs(dir) {
		home := getenv("HOME")
		if home == "" {
			return "", errors.New("no credentials file: neither XDG_CONFIG_HOME nor HOME is set")
		}
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "harmonia-ci", "credentials.json"), nil
}

// LoadCredentials reads the file at path; a missing file is empty credentials.
func LoadCredentials(path string) (Credentials, error) {
	c := Credentials{Servers: map[string]StoredToken{}}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return c, fmt.Errorf("credentials file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return c, fmt.Errorf("credentials file: %w", err)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return c, fmt.Errorf("credentials file %s is readable by others (mode %04o): its tokens may have leaked; "+
			"revoke them, then `chmod 600 %s` or remove it and log in again", path, perm, path)
	}
	if err := json.NewDecoder(f).Decode(&c); err != nil {
		return c, fmt.Errorf("credentials file %s: %w", path, err)
	}
	if c.Servers == nil {
		c.Servers = map[string]StoredToken{}
	}
	return c, nil
}

// StoredTokenFor is the token stored for server ("" if none).
func StoredTokenFor(path, server string) (string, error) {
	u, err := ParseServer(server)
	if err != nil {
		return "", err
	}
	c, err := LoadCredentials(path)
	if err != nil {
		return "", err
	}
	return c.Servers[u.String()].Token, nil
}

// StoreToken records server's token in the file at path, creating it (0600, its directory
// 0700), and replacing it whole so that a crash leaves the old file or the new one.
func StoreToken(path, server string, t StoredToken) error {
	u, err := ParseServer(server)
	if err != nil {
		return err
	}
	c, err := LoadCredentials(path)
	if err != nil {
		return err
	}
	c.Servers[u.String()] = t
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("credentials directory: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("credentials directory: %w", err)
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".credentials-*.json") // 0600
	if err != nil {
		return fmt.Errorf("credentials file: %w", err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("credentials file: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("credentials file: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("credentials file: %w", err)
	}
	return nil
}
