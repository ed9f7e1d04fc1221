package config

import (
	"fmt"
	"os"
	"path/filepath"
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
