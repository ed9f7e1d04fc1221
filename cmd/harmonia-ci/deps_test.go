package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The import graph says what the design says: the object store knows nothing of forges and
// projects, the builder and the evaluator reach the signer through its client alone and never
// the garbage collector, and no frontend package carries the evaluator role (its Nix runner, its
// daemon). Each rule is one of the arrows that once held the other way.
func TestImportGraph(t *testing.T) {
	const mod = "github.com/harmonia-ci/harmonia-ci/internal/"
	rules := []struct {
		from   []string
		forbid []string
	}{
		{[]string{"blob", "cache"}, []string{"forge", "project", "web", "cluster"}},
		{[]string{"builder", "eval"}, []string{"signer", "gc"}},
		{[]string{"commitstatus", "webhook", "webui", "apiv1"}, []string{"eval"}},
	}
	for _, r := range rules {
		for _, from := range r.from {
			out, err := exec.Command("go", "list", "-deps", mod+from).Output()
			if err != nil {
				t.Fatalf("go list -deps %s: %v", from, err)
			}
			deps := map[string]bool{}
			for _, d := range strings.Fields(string(out)) {
				deps[d] = true
			}
			for _, f := range r.forbid {
				if deps[mod+f] {
					t.Errorf("internal/%s imports internal/%s (directly or through another package)", from, f)
				}
			}
		}
	}
}

// TestBenchImportedByCLIOnly: the benchmarks sit outside the product's layers. Only the harness
// and its benchmarks (internal/bench/...), the CLI that runs them and the binary may import them,
// so no role comes to depend on a benchmark's fixtures or shortcuts.
func TestBenchImportedByCLIOnly(t *testing.T) {
	const module = "github.com/harmonia-ci/harmonia-ci"
	const bench = module + "/internal/bench"
	allowed := []string{module + "/internal/cli", module + "/cmd/harmonia-ci"}
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}`, module+"/...").Output()
	if err != nil {
		t.Fatalf("go list %s/...: %v", module, err)
	}
	for line := range strings.Lines(string(out)) {
		pkg, imports, _ := strings.Cut(strings.TrimSpace(line), " ")
		if pkg == bench || strings.HasPrefix(pkg, bench+"/") || slices.Contains(allowed, pkg) {
			continue
		}
		for _, imp := range strings.Fields(imports) {
			if imp == bench || strings.HasPrefix(imp, bench+"/") {
				t.Errorf("%s imports %s: only internal/bench/..., internal/cli and cmd/harmonia-ci may", pkg, imp)
			}
		}
	}
}
