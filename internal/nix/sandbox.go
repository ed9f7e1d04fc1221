package nix

import (
	"os"
	"slices"
)

// SandboxPaths are the host paths a sandboxed build sees ("sandbox-paths"): what a /bin/sh
// builder needs (the shell and, for Debian's dynamically linked dash, the system libraries; those
// that exist here), then extra. The builders' builds and the evaluator's imports from derivation
// get the same.
func SandboxPaths(extra []string) []string {
	var paths []string
	for _, p := range []string{"/bin/sh", "/lib", "/lib64", "/usr/lib"} {
		if _, err := os.Stat(p); err == nil {
			paths = append(paths, p)
		}
	}
	for _, p := range extra {
		if !slices.Contains(paths, p) {
			paths = append(paths, p)
		}
	}
	return paths
}
