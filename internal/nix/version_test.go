package nix

import (
	"os/exec"
	"testing"
)

func TestParseVersion(t *testing.T) {
	for _, tt := range []struct{ out, want string }{
		{"nix-store (Nix) 2.8.0\n", "2.8.0"},
		{"nix-instantiate (Nix) 2.26.3", "2.26.3"},
		{"nix-instantiate (Lix, like Nix) 2.91.1\nSystem type: x86_64-linux\n", "2.91.1"},
		{"nix (Nix) 2.29.0pre20250401_abcdef", "2.29.0pre20250401_abcdef"},
		{"nix-env (Nix) 2.4", "2.4"},
	} {
		got, err := ParseVersion(tt.out)
		if err != nil || got != tt.want {
			t.Errorf("ParseVersion(%q) = %q, %v; want %q", tt.out, got, err, tt.want)
		}
	}
	if v, err := ParseVersion("command not found"); err == nil {
		t.Errorf("ParseVersion of no version = %q", v)
	}
}

// TestInstalledVersion: the installed Nix's commands print a version ParseVersion reads, the
// same for each.
func TestInstalledVersion(t *testing.T) {
	skipWithoutNixInstantiate(t)
	var versions []string
	for _, cmd := range []string{"nix-instantiate", "nix-store", "nix-daemon"} {
		out, err := exec.Command(cmd, "--version").Output()
		if err != nil {
			t.Fatalf("%s --version: %v", cmd, err)
		}
		v, err := ParseVersion(string(out))
		if err != nil {
			t.Fatalf("%s --version: %v", cmd, err)
		}
		versions = append(versions, v)
	}
	if versions[0] != versions[1] || versions[1] != versions[2] {
		t.Errorf("versions %q differ", versions)
	}
}
