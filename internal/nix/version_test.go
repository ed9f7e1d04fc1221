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

// TestCommandVersion: the installed Nix's version, as its own commands print it.
func TestCommandVersion(t *testing.T) {
	skipWithoutNixInstantiate(t)
	v, err := CommandVersion(t.Context(), "nix-instantiate", nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("nix-store", "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := ParseVersion(string(out)); v != want {
		t.Errorf("nix-instantiate says %s, nix-store %s", v, want)
	}
}
