package eval_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/eval"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// A pull request's evaluation is of its head merged into its base: an attribute that holds for
// the head alone fails once merged, and one that needs the base's change holds (a flake, whose
// Nix fetches the merge by a ref of its own); a conflict is cancelled with nothing evaluated;
// pull-requests = "head" evaluates the head; and the next event of the pull request, after the
// base moved, evaluates it again against the new base.
func TestPullRequestMerged(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.startEvaluator("ev-1", func(c *eval.Config) { c.MaxEvals = 2 })
	sys := nixSystem(t)
	fileCI := h.lib() + `{ ok = mk "pr-ok" [ ]; feature = assert import ./value.nix == 1; mk "pr-feature" [ ]; }`
	flake := fmt.Sprintf(`{
  outputs = { self }: let
    mk = name: builtins.derivation { inherit name; system = %q; builder = "/bin/sh";
      args = [ "-c" "echo ${name} ${self.rev} > $out" ]; salt = %q; };
  in { checks.%[1]s.needsBase = assert import ./value.nix == 2; mk "pr-needs-base"; };
}`, sys, h.salt)
	cases := []struct {
		name     string
		settings string            // the base's .harmonia-ci.toml
		head     map[string]string // the pull request's change
		status   status.EvalStatus
		attrErr  string // the error of attribute errAttr
		errAttr  string
		merged   bool // evaluated merged (else the head)
		errWant  string
	}{
		{name: "merged-red", head: map[string]string{"ci.nix": fileCI}, status: status.EvalSucceeded,
			errAttr: "feature", attrErr: "assert", merged: true},
		{name: "merged-flake", head: map[string]string{"flake.nix": flake}, status: status.EvalSucceeded, merged: true},
		{name: "conflict", head: map[string]string{"value.nix": "3\n"}, status: status.EvalCancelled,
			errWant: evaluation.ConflictPrefix + "main and the pull request conflict in value.nix"},
		{name: "head", settings: "pull-requests = \"head\"\n", head: map[string]string{"ci.nix": fileCI}, status: status.EvalSucceeded},
	}
	type pr struct {
		id         int64
		base, head string
		repo       *nixtest.Repo
	}
	prs := map[string]pr{}
	for _, c := range cases {
		repo, _ := h.newProject(c.name, map[string]string{"ci.nix": h.lib() + `{ ok = mk "pr-ok" [ ]; }`, "value.nix": "1\n"})
		repo.Git("checkout", "-q", "-b", "feature")
		head := repo.Commit("pull request", c.head)
		repo.Git("checkout", "-q", "main")
		repo.Git("update-ref", "refs/pull/1/head", head)
		repo.Git("branch", "-q", "-D", "feature")
		files := map[string]string{"value.nix": "2\n"}
		if c.settings != "" {
			files[eval.SettingsFile] = c.settings
		}
		base := repo.Commit("the base moves", files)
		e, created, err := evaluation.Request(h.ctx(), h.pool, evaluation.RequestParams{ProjectID: h.queryInt(`SELECT id FROM projects WHERE name = $1`, c.name),
			FlakeURL: repo.Dir, Commit: head, Branch: "pull/1", PRNumber: 1, PRBase: "main"})
		if err != nil || !created {
			t.Fatalf("%s: request: %v (created %v)", c.name, err, created)
		}
		prs[c.name] = pr{id: e.ID, base: base, head: head, repo: repo}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := h.sub(t)
			p := prs[c.name]
			e := h.waitStatus(p.id, c.status)
			if !strings.Contains(e.Error, c.errWant) {
				t.Errorf("error %q, want it to contain %q", e.Error, c.errWant)
			}
			if e.Commit != p.head || e.PRBase != "main" {
				t.Errorf("evaluation of %s on %q, want the head %s on main", e.Commit, e.PRBase, p.head)
			}
			switch {
			case c.merged && (e.BaseCommit != p.base || len(e.MergeCommit) != 40):
				t.Errorf("merged into %q as %q, want into %s", e.BaseCommit, e.MergeCommit, p.base)
			case !c.merged && e.MergeCommit != "":
				t.Errorf("evaluated the merge %s, want the head", e.MergeCommit)
			}
			attrs := h.attrs(p.id)
			if c.status == status.EvalCancelled && len(attrs) != 0 {
				t.Errorf("a conflicting pull request has attributes %v", attrs)
			}
			for name, a := range attrs {
				if name == c.errAttr {
					if !strings.Contains(a.Error, c.attrErr) {
						t.Errorf("%s: error %q, want %q", name, a.Error, c.attrErr)
					}
				} else if a.Error != "" {
					t.Errorf("%s: error %q", name, a.Error)
				}
			}
		})
	}

	// The base moves back: the next event of the pull request evaluates it again, now green;
	// a request without an event (no delivery) leaves it be.
	p := prs["merged-red"]
	base := p.repo.Commit("the base moves back", map[string]string{"value.nix": "1\n"})
	params := evaluation.RequestParams{ProjectID: h.queryInt(`SELECT id FROM projects WHERE name = 'merged-red'`), FlakeURL: p.repo.Dir,
		Commit: p.head, Branch: "pull/1", PRNumber: 1, PRBase: "main"}
	if _, created, err := evaluation.Request(h.ctx(), h.pool, params); err != nil || created {
		t.Fatalf("a request without an event: created %v (%v), want the existing evaluation", created, err)
	}
	params.Delivery = &evaluation.Delivery{Forge: "test", ID: "again-1"}
	if _, created, err := evaluation.Request(h.ctx(), h.pool, params); err != nil || !created {
		t.Fatalf("the pull request's next event: created %v (%v), want it evaluated again", created, err)
	}
	e := h.waitSucceeded(p.id)
	if e.BaseCommit != base {
		t.Errorf("evaluated again against %s, want the new base %s", e.BaseCommit, base)
	}
	for name, a := range h.attrs(p.id) {
		if a.Error != "" {
			t.Errorf("against the new base, %s: error %q", name, a.Error)
		}
	}
}
