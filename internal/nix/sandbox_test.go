package nix

import (
	"os"
	"path/filepath"
	"testing"
)

func TestBindResolved(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "usr", "bin")
	if err := os.MkdirAll(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(real, "dash"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	// A merged-/usr layout: bin -> usr/bin, usr/bin/sh -> dash.
	for link, target := range map[string]string{"bin": "usr/bin", "usr/bin/sh": "dash"} {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct{ in, want string }{
		{dir + "/bin/sh", dir + "/bin/sh=" + dir + "/usr/bin/dash"},
		{dir + "/bin", dir + "/bin=" + dir + "/usr/bin"},
		{dir + "/usr/bin/dash", dir + "/usr/bin/dash"},
		{dir + "/bin/sh?", dir + "/bin/sh=" + dir + "/usr/bin/dash?"},
		{dir + "/missing", dir + "/missing"},
	} {
		if got := bindResolved(tt.in); got != tt.want {
			t.Errorf("bindResolved(%s) = %s, want %s", tt.in, got, tt.want)
		}
	}
	// An entry already in TARGET=SOURCE form is the operator's, as given.
	if got := SandboxPaths([]string{"/x=" + dir + "/bin"}); got[len(got)-1] != "/x="+dir+"/bin" {
		t.Errorf("SandboxPaths kept %q, want /x=%s/bin", got, dir)
	}
}
