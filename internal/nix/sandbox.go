package nix

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// SandboxPaths are the host paths a sandboxed build sees ("sandbox-paths"): what a /bin/sh
// builder needs (the shell and, for Debian's dynamically linked dash, the system libraries; those
// that exist here), then extra. The builders' builds and the evaluator's imports from derivation
// get the same.
//
// A path that is or passes through a symbolic link is given as "PATH=TARGET", the resolved
// target bound at the path: on a merged-/usr system /bin, /lib and /lib64 are links into /usr,
// and Nix since 2.20 (unlike 2.8) copies a link into the sandbox as a link, whose target the
// sandbox does not have.
func SandboxPaths(extra []string) []string {
	var paths []string
	add := func(p string) {
		if !strings.Contains(p, "=") {
			p = bindResolved(p)
		}
		if !slices.Contains(paths, p) {
			paths = append(paths, p)
		}
	}
	for _, p := range []string{"/bin/sh", "/lib", "/lib64", "/usr/lib"} {
		if _, err := os.Stat(p); err == nil {
			add(p)
		}
	}
	for _, p := range extra {
		add(p)
	}
	return paths
}

// bindResolved is p, or "p=target" when p resolves through symbolic links to another path.
// Nix's optional marker (a trailing "?") stays at the end.
func bindResolved(p string) string {
	path, optional := strings.CutSuffix(p, "?")
	target, err := filepath.EvalSymlinks(path)
	if err != nil || target == path {
		return p
	}
	if optional {
		return path + "=" + target + "?"
	}
	return path + "=" + target
}
