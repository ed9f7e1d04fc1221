package gitrepo

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// prSource is an upstream with a base branch main and a pull request branch feature forked
// from it, each with a change of its own (conflicting in shared.txt when conflict is true).
func prSource(t *testing.T, conflict bool) (src *source, base, head string) {
	t.Helper()
	src = newSource(t)
	src.commit("first", map[string]string{"shared.txt": "one\n", "a.txt": "a\n"})
	src.git("checkout", "--quiet", "-b", "feature")
	headFiles := map[string]string{"feature.txt": "new\n"}
	if conflict {
		headFiles["shared.txt"] = "feature's\n"
	}
	head = src.commit("feature", headFiles)
	src.git("checkout", "--quiet", "main")
	base = src.commit("base moves", map[string]string{"shared.txt": "main's\n"})
	return src, base, head
}

func TestMergeInto(t *testing.T) {
	ctx := t.Context()
	src, base, head := prSource(t, false)
	m := fetched(t, src)
	mg, err := m.MergeInto(ctx, "main", head, "")
	if err != nil {
		t.Fatal(err)
	}
	if mg.Base != base || mg.Head != head || mg.Forge || len(mg.Commit) != 40 {
		t.Fatalf("MergeInto = %+v, want base %s head %s", mg, base, head)
	}
	if p, err := m.parents(ctx, mg.Commit); err != nil || !slices.Equal(p, []string{base, head}) {
		t.Fatalf("parents of the merge: %v %v, want [base head]", p, err)
	}
	for path, want := range map[string]string{"shared.txt": "main's\n", "feature.txt": "new\n", "a.txt": "a\n"} {
		if got, ok, err := m.ReadFile(ctx, mg.Commit, path); err != nil || !ok || string(got) != want {
			t.Errorf("merge's %s = %q %v %v, want %q", path, got, ok, err, want)
		}
	}

	// Reproducible: another mirror makes the same commit.
	other, err := fetched(t, src).MergeInto(ctx, "main", head, "")
	if err != nil || other.Commit != mg.Commit {
		t.Fatalf("the same merge in another mirror: %+v %v, want %s", other, err, mg.Commit)
	}

	// The merge stays reachable through a fetch (which prunes what upstream lacks), and the
	// upstream cannot plant a ref in harmonia-ci's namespace.
	src.git("update-ref", LocalRefPrefix+"planted", base)
	if err := m.Fetch(ctx); err != nil {
		t.Fatal(err)
	}
	if ref, err := m.RefContaining(ctx, mg.Commit, ""); err != nil || ref != mergeRefPrefix+mg.Commit {
		t.Errorf("ref containing the merge after a fetch: %q %v", ref, err)
	}
	if _, ok, _ := m.revParse(ctx, LocalRefPrefix+"planted"); ok {
		t.Error("a ref upstream planted under " + LocalRefPrefix + " was fetched")
	}
}

func TestMergeIntoForgeRef(t *testing.T) {
	ctx := t.Context()
	src, base, head := prSource(t, false)
	// The forge's merge, as GitHub makes it: base's tip then head, its own identity and message.
	tree := src.git("merge-tree", "--write-tree", base, head)
	forgeMerge := src.git("commit-tree", tree, "-p", base, "-p", head, "-m", "Merge forge")
	src.git("update-ref", "refs/pull/7/merge", forgeMerge)
	m := fetched(t, src)
	mg, err := m.MergeInto(ctx, "main", head, "refs/pull/7/merge")
	if err != nil || mg.Commit != forgeMerge || !mg.Forge {
		t.Fatalf("MergeInto with the forge's ref = %+v %v, want the forge's %s", mg, err, forgeMerge)
	}

	// The base moved and the forge has not merged again yet: its ref is stale, so the merge is
	// made here, against the new tip.
	src.commit("base moves again", map[string]string{"b.txt": "b\n"})
	if err := m.Fetch(ctx); err != nil {
		t.Fatal(err)
	}
	mg, err = m.MergeInto(ctx, "main", head, "refs/pull/7/merge")
	if err != nil || mg.Forge || mg.Commit == forgeMerge {
		t.Fatalf("MergeInto with a stale forge ref = %+v %v, want a merge of its own", mg, err)
	}
	if _, err := m.MergeInto(ctx, "main", head, "refs/pull/7/../merge"); err == nil {
		t.Error("an invalid forge ref was accepted")
	}
}

func TestMergeIntoConflict(t *testing.T) {
	src, _, head := prSource(t, true)
	m := fetched(t, src)
	_, err := m.MergeInto(t.Context(), "main", head, "")
	var ce *ConflictError
	if !errors.Is(err, ErrConflict) || !errors.As(err, &ce) || !slices.Equal(ce.Paths, []string{"shared.txt"}) {
		t.Fatalf("MergeInto of a conflicting head: %v, want a conflict in shared.txt", err)
	}
	if !strings.Contains(err.Error(), "conflicts in shared.txt") {
		t.Errorf("conflict error %q does not name the path", err)
	}
	// A head with no history in common with the base does not merge either.
	src.git("checkout", "--quiet", "--orphan", "orphan")
	orphan := src.commit("orphan", map[string]string{"o.txt": "o\n"})
	if err := m.Fetch(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, err = m.MergeInto(t.Context(), "main", orphan, "")
	if !errors.As(err, &ce) || !ce.Unrelated || !strings.Contains(err.Error(), "share no history") {
		t.Fatalf("MergeInto of an unrelated head: %v, want a conflict sharing no history", err)
	}
	for _, tt := range []struct{ base, head, want string }{
		{"nope", head, "not found"},
		{"main", "zz", "hex digits"},
		{"main..x", head, `must not contain ".."`},
	} {
		if _, err := m.MergeInto(t.Context(), tt.base, tt.head, ""); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("MergeInto(%q, %q): %v, want an error containing %q", tt.base, tt.head, err, tt.want)
		}
	}
}
