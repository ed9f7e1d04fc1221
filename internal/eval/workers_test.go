package eval

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
)

// workersProject is a generated project for the workers' tests: shared dependencies, throwing
// and uncatchable attributes (abort, infinite recursion, a type error), nested
// recurseForDerivations sets, one large enough to be split (big, with a nested set of its own
// that is split again) and one that is not walked.
func workersProject(salt string) string {
	return nixtest.Lib(salt) + `
let
  shared = builtins.genList (i: mk "shared-${toString i}" (if i == 0 then [ ] else [ (mk "low-${toString i}" [ ]) ])) 5;
  member = prefix: i:
    if i == 3 then throw "${prefix} boom ${toString i}"
    else if i == 7 then abort "${prefix} aborted ${toString i}"
    else if i == 11 then (let x = x + 1; in x)
    else if i == 13 then 1 + "x"
    else mk "${prefix}-${toString i}" [ (builtins.elemAt shared (i - (i / 5) * 5)) ];
  set = prefix: n: builtins.listToAttrs (builtins.genList (i: { name = "${prefix}${toString i}"; value = member prefix i; }) n);
in {
  top = mk "top" shared;
  bad = throw "boom from bad";
  aborts = abort "aborted here";
  loops = let x = x + 1; in x;
  typeError = 1 + "x";
  notADerivation = 42;
  big = { recurseForDerivations = true; inner = { recurseForDerivations = true; } // set "inner" 16; } // set "p" 24;
  nested = { recurseForDerivations = true; deeper = { recurseForDerivations = true; x = mk "x" [ ]; }; notWalked = { y = mk "y" [ ]; }; };
  small = { recurseForDerivations = true; } // set "s" 4;
}`
}

// walkWith walks spec with workers walkers, sets of more than 5 children shared; starts counts
// the walker processes (probes included).
func walkWith(t *testing.T, spec Spec, workers int) (attrs map[string]Attr, starts int) {
	t.Helper()
	var mu sync.Mutex
	r := &NixRunner{Home: t.TempDir(), Workers: workers, SplitAbove: 5,
		OnStart: func(int) { mu.Lock(); starts++; mu.Unlock() }}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	got := map[string]Attr{}
	err := r.Walk(ctx, spec, func(a Attr) error {
		mu.Lock()
		defer mu.Unlock()
		if _, dup := got[a.Name]; dup {
			t.Errorf("%d workers: attribute %s reported twice", workers, a.Name)
		}
		a.Path = nil // the walk reports no path for an uncatchable error's attribute with one worker
		got[a.Name] = a
		return nil
	})
	if err != nil {
		t.Fatalf("%d workers: %v", workers, err)
	}
	return got, starts
}

// Any number of workers reports exactly the attributes, derivations and errors one does.
func TestWalkWorkersIdentical(t *testing.T) {
	nixtest.RequireNix(t)
	repo := nixtest.NewRepo(t)
	rev := repo.Commit("init", map[string]string{"ci.nix": workersProject("workers-walk")})
	spec := fileSpec(t, repo, rev, "ci.nix")
	one, oneStarts := walkWith(t, spec, 1)
	// 24 + 16 members of big, 4 of small, top, x and the five failing top-level attributes
	// less notADerivation.
	if len(one) != 24+16+4+1+1+4 {
		t.Errorf("one worker: %d attributes: %v", len(one), slices.Sorted(maps.Keys(one)))
	}
	for n, msg := range map[string]string{"bad": "boom from bad", "aborts": "aborted here", "loops": "infinite recursion",
		"typeError": "cannot add", "big.p3": "p boom 3", "big.p7": "p aborted 7", "big.inner.inner11": "infinite recursion",
		"big.inner.inner13": "cannot add"} {
		if !strings.Contains(one[n].Error, msg) {
			t.Errorf("one worker: %s: %+v, want an error containing %q", n, one[n], msg)
		}
	}
	for _, workers := range []int{2, 4} {
		t.Run(fmt.Sprint(workers), func(t *testing.T) {
			got, starts := walkWith(t, spec, workers)
			// big and big.inner are cut into units other walker processes take.
			if starts < oneStarts+4 {
				t.Errorf("%d walker processes, one worker started %d: the large sets were not shared", starts, oneStarts)
			}
			for _, n := range slices.Sorted(maps.Keys(one)) {
				if g, o := got[n], one[n]; g.DrvPath != o.DrvPath || g.Error != o.Error || g.Name != o.Name {
					t.Errorf("%s: %+v, one worker: %+v", n, got[n], one[n])
				}
			}
			for n := range got {
				if _, ok := one[n]; !ok {
					t.Errorf("%s: %+v, not reported by one worker", n, got[n])
				}
			}
		})
	}
}

// WorkersProject is workersProject, for the evaluator's tests (package eval_test).
var WorkersProject = workersProject

// The first error of any worker (here emit's, as past eval.max_attrs) ends the walk: Walk
// returns it once every walker process has stopped.
func TestWalkWorkersStopAtFirstError(t *testing.T) {
	nixtest.RequireNix(t)
	repo := nixtest.NewRepo(t)
	rev := repo.Commit("init", map[string]string{"ci.nix": workersProject("workers-stop")})
	var mu sync.Mutex
	var started []int
	r := &NixRunner{Home: t.TempDir(), Workers: 4, SplitAbove: 5,
		OnStart: func(pid int) { mu.Lock(); started = append(started, pid); mu.Unlock() }}
	errEnough := errors.New("enough")
	n := 0
	err := r.Walk(t.Context(), fileSpec(t, repo, rev, "ci.nix"), func(Attr) error {
		if n++; n > 10 {
			return errEnough
		}
		return nil
	})
	if !errors.Is(err, errEnough) {
		t.Fatalf("walk: %v, want emit's error", err)
	}
	if n != 11 {
		t.Errorf("emit called %d times, want 11: nothing after the error", n)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, p := range started {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p)); err == nil && strings.Contains(string(b), "nix-instantiate") {
			t.Errorf("walker %d still runs", p)
		}
	}
}

// A flake's roots are shared the same way: the system level below an output is walked
// without recurseForDerivations, by whichever worker takes its unit.
func TestWalkWorkersFlake(t *testing.T) {
	nixtest.RequireNix(t)
	repo := nixtest.NewRepo(t)
	rev := repo.Commit("init", map[string]string{"flake.nix": `{
  outputs = { self }: let sys = "x86_64-linux"; mk = name: builtins.derivation {
    inherit name; system = sys; builder = "/bin/sh"; args = [ "-c" "echo ${self.rev} > $out" ]; }; in {
    checks.${sys} = { one = mk "one"; two = mk "two"; seven = mk "seven"; bad = throw "bad check"; nested = { three = mk "three"; };
      deep = { recurseForDerivations = true; four = mk "four"; five = mk "five"; six = abort "six"; }; };
    packages.${sys}.default = mk "pkg";
  };
}`})
	spec := Spec{Source: repo.Dir, Mode: "flake", FlakeRef: "git+file://" + repo.Dir + "?rev=" + rev + "&allRefs=1",
		Roots: [][]string{{"checks"}, {"packages"}, {"missing"}}, Force: 2}
	one, oneStarts := walkWith(t, spec, 1)
	if len(one) != 9 {
		t.Errorf("one worker: %v", slices.Sorted(maps.Keys(one)))
	}
	got, starts := walkWith(t, spec, 3)
	if starts < oneStarts+3 {
		t.Errorf("%d walker processes, one worker started %d: checks.x86_64-linux was not shared", starts, oneStarts)
	}
	for n := range one {
		if g, o := got[n], one[n]; g.DrvPath != o.DrvPath || g.Error != o.Error {
			t.Errorf("%s: %+v, one worker: %+v", n, g, o)
		}
	}
	if len(got) != len(one) {
		t.Errorf("3 workers: %v, one worker: %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(one)))
	}
}
