package eval

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/gitrepo"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
)

func walkAll(t *testing.T, spec Spec) map[string]Attr {
	t.Helper()
	r := &NixRunner{Home: t.TempDir()}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	got := map[string]Attr{}
	err := r.Walk(ctx, spec, func(a Attr) error {
		if _, dup := got[a.Name]; dup {
			t.Errorf("attribute %s reported twice", a.Name)
		}
		got[a.Name] = a
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// fileSpec walks file at rev of repo, exported as the evaluator exports it.
func fileSpec(t *testing.T, repo *nixtest.Repo, rev, file string) Spec {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "source")
	if err := (&gitrepo.Mirror{Dir: filepath.Join(repo.Dir, ".git")}).Export(t.Context(), rev, dir); err != nil {
		t.Fatal(err)
	}
	return Spec{Source: dir, Mode: "file", Rev: rev, File: file, Roots: [][]string{{}}, Force: 1}
}

func TestWalkFile(t *testing.T) {
	nixtest.RequireNix(t)
	repo := nixtest.NewRepo(t)
	rev := repo.Commit("init", map[string]string{"ci.nix": nixtest.Lib("walk") + `
let a = mk "a" [ ]; in {
  inherit a;
  b = mk "b" [ a ];
  bad = throw "boom from bad";
  typeError = 1 + "x";
  abortive = abort "aborted here";
  nested = { c = mk "c" [ ]; };
  recursing = { recurseForDerivations = true; d = mk "d" [ a ]; deeper = { e = mk "e" [ ]; }; };
  "dotted.name" = mk "dotted" [ ];
  notADerivation = 42;
  env = mk (builtins.getEnv "HARMONIA_DATABASE_URL" + builtins.getEnv "HARMONIA_ADMIN_TOKEN" + "env") [ ];
}`})
	t.Setenv("HARMONIA_DATABASE_URL", "postgres://secret")
	t.Setenv("HARMONIA_ADMIN_TOKEN", "token")
	got := walkAll(t, fileSpec(t, repo, rev, "ci.nix"))

	var names []string
	for n := range got {
		names = append(names, n)
	}
	slices.Sort(names)
	want := []string{"\"dotted.name\"", "a", "abortive", "b", "bad", "env", "recursing.d", "typeError"}
	if !slices.Equal(names, want) {
		t.Fatalf("attributes %q, want %q", names, want)
	}
	for _, n := range []string{"a", "b", "recursing.d", "\"dotted.name\""} {
		if !strings.HasSuffix(got[n].DrvPath, ".drv") || got[n].Error != "" {
			t.Errorf("%s: %+v, want a derivation", n, got[n])
		}
	}
	if !strings.HasSuffix(got["env"].DrvPath, "-env.drv") {
		t.Errorf("the Nix child saw the node's secrets: %s", got["env"].DrvPath)
	}
	for n, msg := range map[string]string{"bad": "boom from bad", "typeError": "cannot add", "abortive": "aborted here"} {
		if got[n].DrvPath != "" || !strings.Contains(got[n].Error, msg) {
			t.Errorf("%s: %+v, want error containing %q", n, got[n], msg)
		}
	}
}

func TestWalkFlake(t *testing.T) {
	nixtest.RequireNix(t)
	repo := nixtest.NewRepo(t)
	rev := repo.Commit("init", map[string]string{"flake.nix": `{
  outputs = { self }: let sys = "x86_64-linux"; mk = name: builtins.derivation {
    inherit name; system = sys; builder = "/bin/sh"; args = [ "-c" "echo ${self.rev} > $out" ]; }; in {
    checks.${sys} = { one = mk "one"; two = mk "two"; nested = { three = mk "three"; }; };
    packages.${sys}.default = mk "pkg";
  };
}`})
	got := walkAll(t, Spec{Source: repo.Dir, Mode: "flake", FlakeRef: "git+file://" + repo.Dir + "?rev=" + rev + "&allRefs=1",
		Roots: [][]string{{"checks"}, {"packages"}, {"missing"}}, Force: 2})
	for _, n := range []string{"checks.x86_64-linux.one", "checks.x86_64-linux.two", "packages.x86_64-linux.default"} {
		if !strings.HasSuffix(got[n].DrvPath, ".drv") {
			t.Errorf("%s: %+v, want a derivation", n, got[n])
		}
	}
	if _, ok := got["checks.x86_64-linux.nested.three"]; ok {
		t.Error("walked into a nested set without recurseForDerivations")
	}
	if !strings.Contains(got["missing"].Error, "does not exist") {
		t.Errorf("missing root: %+v", got["missing"])
	}
}

func TestWalkFailsOutsideAttributes(t *testing.T) {
	nixtest.RequireNix(t)
	repo := nixtest.NewRepo(t)
	rev := repo.Commit("init", map[string]string{"ci.nix": `{ a = ; }`})
	r := &NixRunner{Home: t.TempDir()}
	err := r.Walk(context.Background(), fileSpec(t, repo, rev, "ci.nix"),
		func(a Attr) error { t.Errorf("unexpected attribute %+v", a); return nil })
	if err == nil || !strings.Contains(err.Error(), "syntax error") {
		t.Fatalf("got %v, want the syntax error", err)
	}
}
