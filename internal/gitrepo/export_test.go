package gitrepo

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestExport: the exported tree is the commit's files, as a checkout shows them, readable by
// others, without .git, export-ignored files or other commits' files.
func TestExport(t *testing.T) {
	src := newSource(t)
	old := src.commit("old", map[string]string{"gone.txt": "old\n"})
	src.git("rm", "--quiet", "gone.txt")
	src.commit("head", map[string]string{
		"default.nix":    "{ }\n",
		"nix/lib.nix":    "x: x\n",
		"with space.txt": "spaced\n",
		"secret.key":     "not exported\n",
		".gitattributes": "secret.key export-ignore\n",
		"run.sh":         "#!/bin/sh\n",
	})
	if err := os.Chmod(filepath.Join(src.dir, "run.sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("nix/lib.nix", filepath.Join(src.dir, "link.nix")); err != nil {
		t.Fatal(err)
	}
	src.git("add", "link.nix", "run.sh")
	src.git("commit", "--quiet", "-m", "link")
	head := src.git("rev-parse", "HEAD")
	m := fetched(t, src)

	dir := filepath.Join(t.TempDir(), "source")
	if err := m.Export(t.Context(), head, dir); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			got[rel] = "-> " + target
		case d.IsDir():
			got[rel] = info.Mode().Perm().String()
		default:
			b, _ := os.ReadFile(p)
			got[rel] = info.Mode().Perm().String() + " " + string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		".":              "-rwxr-xr-x",
		"default.nix":    "-rw-r--r-- { }\n",
		"nix":            "-rwxr-xr-x",
		"nix/lib.nix":    "-rw-r--r-- x: x\n",
		"with space.txt": "-rw-r--r-- spaced\n",
		".gitattributes": "-rw-r--r-- secret.key export-ignore\n",
		"run.sh":         "-rwxr-xr-x #!/bin/sh\n",
		"link.nix":       "-> nix/lib.nix",
	}
	if len(got) != len(want) {
		t.Errorf("exported %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}

	for _, tt := range []struct{ name, commit, dir, wantErr string }{
		{"existing directory", old, dir, "file exists"},
		{"unknown commit", strings.Repeat("deadbeef", 5), filepath.Join(t.TempDir(), "x"), "git archive"},
		{"not a commit id", "HEAD", filepath.Join(t.TempDir(), "y"), "not a hex object id"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			wantErrContaining(t, "Export", m.Export(t.Context(), tt.commit, tt.dir), tt.wantErr)
		})
	}
}
