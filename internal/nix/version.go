package nix

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
)

// versionRE finds the version in what `nix-store --version` and its siblings print:
// "nix-store (Nix) 2.26.3", "nix-instantiate (Lix, like Nix) 2.91.1".
var versionRE = regexp.MustCompile(`\b[0-9]+\.[0-9]+[0-9A-Za-z.+_~-]*`)

// ParseVersion returns the version in the first line of a Nix command's --version output.
func ParseVersion(out string) (string, error) {
	line, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	v := versionRE.FindString(line)
	if v == "" {
		return "", fmt.Errorf("no version in %q", line)
	}
	return v, nil
}

// CommandVersion runs `bin --version` (a Nix command such as nix-instantiate) with env and
// returns the version it prints.
func CommandVersion(ctx context.Context, bin string, env []string) (string, error) {
	cmd := exec.CommandContext(ctx, bin, "--version")
	cmd.Env = env
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", bin, err)
	}
	v, err := ParseVersion(string(out))
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", bin, err)
	}
	return v, nil
}
