package gitrepo

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Snapshot commits what is on disk, ignored files excepted, with extra files; the same files
// give the same commit; a change (including a deletion) gives a child commit.
func TestSnapshot(t *testing.T) {
	ctx := context.Background()
	work := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		p := filepath.Join(work, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("ci.nix", "{ }")
	write("sub/lib.nix", "1")
	write(".gitignore", "result\n")
	write("result", "a build result")
	gitDir := filepath.Join(t.TempDir(), "snap.git")
	m, err := New(gitDir, gitDir)
	if err != nil {
		t.Fatal(err)
	}

	c1, err := Snapshot(ctx, gitDir, work, "run", map[string][]byte{".harmonia-ci.toml": []byte("attrs = [\"a\"]\n")})
	if err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{"ci.nix": "{ }", "sub/lib.nix": "1", ".harmonia-ci.toml": "attrs = [\"a\"]\n"} {
		got, ok, err := m.ReadFile(ctx, c1, file)
		if err != nil || !ok || string(got) != want {
			t.Errorf("%s in the snapshot: %q %v %v, want %q", file, got, ok, err, want)
		}
	}
	if _, ok, _ := m.ReadFile(ctx, c1, "result"); ok {
		t.Error("an ignored file was committed")
	}
	if _, err := os.Stat(filepath.Join(work, ".harmonia-ci.toml")); err == nil {
		t.Error("the extra file was written into the work tree")
	}

	same, err := Snapshot(ctx, gitDir, work, "run", map[string][]byte{".harmonia-ci.toml": []byte("attrs = [\"a\"]\n")})
	if err != nil || same != c1 {
		t.Fatalf("the same files gave commit %s (%v), want %s", same, err, c1)
	}

	if err := os.Remove(filepath.Join(work, "sub/lib.nix")); err != nil {
		t.Fatal(err)
	}
	c2, err := Snapshot(ctx, gitDir, work, "run", nil)
	if err != nil || c2 == c1 {
		t.Fatalf("after a deletion: %s %v", c2, err)
	}
	if _, ok, _ := m.ReadFile(ctx, c2, "sub/lib.nix"); ok {
		t.Error("a deleted file is still in the snapshot")
	}
	if got, _ := m.ResolveBranch(ctx, "run"); got != c2 {
		t.Errorf("branch run at %s, want %s", got, c2)
	}
	parent, err := run(ctx, nil, gitDir, "rev-parse", c2+"^")
	if err != nil || strings.TrimSpace(string(parent)) != c1 {
		t.Errorf("parent of the new snapshot: %s %v, want %s", parent, err, c1)
	}

	if _, err := Snapshot(ctx, gitDir, filepath.Join(work, "nope"), "run", nil); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("missing work tree: %v", err)
	}
	if _, err := Snapshot(ctx, gitDir, work, "bad..branch", nil); err == nil {
		t.Error("an invalid branch was accepted")
	}
}
