package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A secret file other users can read stops Load with the file, its mode and the fix; its group
// may read it, and a secret from the environment makes the file irrelevant.
func TestSecretFileMode(t *testing.T) {
	setup(t)
	tests := []struct {
		mode os.FileMode
		env  map[string]string
		ok   bool
	}{
		{0o600, nil, true},
		{0o400, nil, true},
		{0o640, nil, true},
		{0o644, nil, false},
		{0o604, nil, false},
		{0o644, map[string]string{"HARMONIA_ADMIN_TOKEN": "from-env"}, true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%04o env=%v", tt.mode, tt.env != nil), func(t *testing.T) {
			dir := t.TempDir()
			token := filepath.Join(dir, "admin-token")
			if err := os.WriteFile(token, []byte("s3cret\n"), tt.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(token, tt.mode); err != nil { // undo the umask
				t.Fatal(err)
			}
			cfg := filepath.Join(dir, "c.toml")
			if err := os.WriteFile(cfg, []byte("[auth]\nadmin_token_file = \"admin-token\"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			c, err := Load(Overrides{ConfigFile: cfg}, fakeEnv(tt.env))
			if !tt.ok {
				wantErr(t, err, fmt.Sprintf("config: auth.admin_token_file: %s is readable by other users (mode %04o); run chmod 600 %s", token, tt.mode, token))
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Auth.AdminToken == "" {
				t.Error("no admin token loaded")
			}
		})
	}
}

func TestDatabasePasswordInAReadableConfigIsRefused(t *testing.T) {
	setup(t)
	for _, tt := range []struct {
		name, url string
		mode      os.FileMode
		wantErr   bool
	}{
		{"password, readable by others", "postgres://ci:s3cret@db/ci", 0o644, true},
		{"password in a DSN, readable by others", "host=db password=s3cret", 0o644, true},
		{"password, private file", "postgres://ci:s3cret@db/ci", 0o600, false},
		{"no password, readable by others", "postgres://ci@db/ci", 0o644, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, t.TempDir(), "c.toml", fmt.Sprintf("database_url = %q\n", tt.url))
			if err := os.Chmod(path, tt.mode); err != nil {
				t.Fatal(err)
			}
			_, err := Load(Overrides{ConfigFile: path}, fakeEnv(nil))
			if tt.wantErr {
				wantErr(t, err, "database_url holds a password", "is readable by other users", "chmod 600")
				if strings.Contains(err.Error(), "s3cret") {
					t.Errorf("the error shows the password: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
