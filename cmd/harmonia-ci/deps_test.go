package main

import (
	"os/exec"
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
		{[]string{"commitstatus", "webhook", "webui"}, []string{"eval"}},
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
