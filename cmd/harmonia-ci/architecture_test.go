package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
)

// docs/architecture.md's package table names every package of the tree, and nothing else.
func TestArchitectureListsEveryPackage(t *testing.T) {
	doc, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, m := range regexp.MustCompile("(?m)^\\| `((?:internal/|cmd/)[a-z0-9/-]+|e2e)` \\|").FindAllSubmatch(doc, -1) {
		listed = append(listed, string(m[1]))
	}
	var tree []string
	for _, root := range []string{"internal", "cmd", "e2e"} {
		err := filepath.WalkDir(filepath.Join("../..", root), func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return err
			}
			if gos, _ := filepath.Glob(filepath.Join(p, "*.go")); len(gos) > 0 {
				rel, _ := filepath.Rel("../..", p)
				tree = append(tree, filepath.ToSlash(rel))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(listed)
	slices.Sort(tree)
	for _, p := range tree {
		if !slices.Contains(listed, p) {
			t.Errorf("docs/architecture.md's package table lacks %s", p)
		}
	}
	for _, p := range listed {
		if !slices.Contains(tree, p) {
			t.Errorf("docs/architecture.md lists %s, which is not in the tree", p)
		}
	}
}
