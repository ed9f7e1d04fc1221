package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
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

// Every Go name docs/architecture.md cites (`queue.EnqueueTx`, `builder.Builder.Handle`, a
// field such as `queue.Result.Continue`) is declared in the package it names, and every source
// file it cites (`eval/view.go`, `walker.nix`) exists, so a rename cannot leave the walk-through
// pointing at nothing. Config keys (`build.min_free`) and other modules' names (`pgx.Identifier`)
// are not Go names of this tree and are skipped.
func TestArchitectureNamesExist(t *testing.T) {
	otherModules := map[string]bool{"pgx": true}
	fileExt := map[string]bool{"go": true, "nix": true, "sql": true, "toml": true, "md": true}
	doc, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	decls := map[string]map[string]bool{} // package dir → "Name" and "Type.Member"
	declared := func(pkg string) map[string]bool {
		if d, ok := decls[pkg]; ok {
			return d
		}
		d := packageNames(t, filepath.Join("../../internal", pkg))
		decls[pkg] = d
		return d
	}
	for _, m := range regexp.MustCompile("`([a-z][a-z0-9]*)\\.([A-Za-z][A-Za-z0-9]*(?:\\.[A-Za-z][A-Za-z0-9]*)?)`").FindAllSubmatch(doc, -1) {
		pkg, name := string(m[1]), string(m[2])
		if st, err := os.Stat(filepath.Join("../../internal", pkg)); err != nil || !st.IsDir() {
			if !otherModules[pkg] && !fileExt[name] {
				t.Errorf("docs/architecture.md cites %s.%s, but there is no internal/%s", pkg, name, pkg)
			}
			continue
		}
		if !declared(pkg)[name] {
			t.Errorf("docs/architecture.md cites %s.%s, which internal/%s does not declare", pkg, name, pkg)
		}
	}
	files := map[string]bool{}
	err = filepath.WalkDir("../../internal", func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel("../../internal", p)
			files[filepath.ToSlash(rel)] = true
			files[d.Name()] = true
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile("`(?:internal/)?([a-z0-9_/]*[a-z0-9_]+\\.(?:go|nix|sql))`").FindAllSubmatch(doc, -1) {
		if !files[string(m[1])] {
			t.Errorf("docs/architecture.md cites %s, which is not in internal/", m[1])
		}
	}
}

// packageNames returns the top-level names a package directory declares, with its types'
// methods, struct fields and interface methods as "Type.Member".
func packageNames(t *testing.T, dir string) map[string]bool {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, p := range pkgs {
		for _, f := range p.Files {
			for _, decl := range f.Decls {
				switch d := decl.(type) {
				case *ast.FuncDecl:
					if d.Recv == nil {
						names[d.Name.Name] = true
						continue
					}
					recv := d.Recv.List[0].Type
					if s, ok := recv.(*ast.StarExpr); ok {
						recv = s.X
					}
					if id, ok := recv.(*ast.Ident); ok {
						names[id.Name+"."+d.Name.Name] = true
					}
				case *ast.GenDecl:
					for _, spec := range d.Specs {
						switch s := spec.(type) {
						case *ast.TypeSpec:
							names[s.Name.Name] = true
							members := &ast.FieldList{}
							switch ty := s.Type.(type) {
							case *ast.StructType:
								members = ty.Fields
							case *ast.InterfaceType:
								members = ty.Methods
							}
							for _, m := range members.List {
								for _, n := range m.Names {
									names[s.Name.Name+"."+n.Name] = true
								}
							}
						case *ast.ValueSpec:
							for _, n := range s.Names {
								names[n.Name] = true
							}
						}
					}
				}
			}
		}
	}
	return names
}
