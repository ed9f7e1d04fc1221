package nix

import (
	"fmt"
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
