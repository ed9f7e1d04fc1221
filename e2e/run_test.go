package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
)

// TestRunExample runs the README's first command on the shipped example project: the summary
// shows every attribute (one failed, one dep-failed, the rest built), the command fails, the
// cache it names serves every built output signed by the key it prints, and a second run of the
// same files changes nothing. --attr leaves the broken part out and succeeds.
func TestRunExample(t *testing.T) {
	nixtest.RequireNix(t)
	state := stateDir(t)
	store := t.TempDir() // a chroot store: built in the sandbox, isolated from other tests
	args := []string{"run", "../examples/dag", "--state-dir", state, "--nix-store", store, "--jobs", "3"}

	code, out := proctest.Run(t, nil, args...)
	if code != 1 {
		t.Fatalf("run exited %d, want 1 (broken.tool fails on purpose):\n%s", code, out)
	}
	rows := summaryRows(t, out)
	if len(rows) != 29 {
		t.Fatalf("summary has %d attributes, want 29:\n%s", len(rows), out)
	}
	for attr, want := range map[string]string{"broken.tool": "failed", "broken.app": "dep-failed", "release": "succeeded", "libs.lib-9": "succeeded"} {
		if rows[attr].status != want {
			t.Errorf("%s: status %q, want %q", attr, rows[attr].status, want)
		}
	}
	for _, want := range []string{"broken.tool: builder for", "harmonia-ci: 2 of 29 attributes failed", "cache:      file://" + filepath.Join(state, "cache")} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	key := regexp.MustCompile(`(?m)^public key: (\S+)$`).FindStringSubmatch(out)
	if key == nil {
		t.Fatalf("no public key in the output:\n%s", out)
	}
	pub, err := os.ReadFile(filepath.Join(state, "signing-key.pub"))
	if err != nil || strings.TrimSpace(string(pub)) != key[1] {
		t.Fatalf("printed key %s, signing-key.pub %q (%v)", key[1], pub, err)
	}

	// Every built output substitutes from the file:// cache into a fresh store, signatures
	// checked, nothing built.
	var paths []string
	for attr, r := range rows {
		if r.status == "succeeded" {
			if !strings.HasPrefix(r.path, "/nix/store/") {
				t.Fatalf("%s: store path %q", attr, r.path)
			}
			paths = append(paths, r.path)
		}
	}
	fresh := t.TempDir()
	sub := append([]string{"--store", fresh, "--realise"}, paths...)
	sub = append(sub, "--option", "substituters", "file://"+filepath.Join(state, "cache"),
		"--option", "trusted-public-keys", key[1], "--option", "require-sigs", "true",
		"--option", "build-users-group", "", "--option", "max-jobs", "0")
	if b, err := exec.Command("nix-store", sub...).CombinedOutput(); err != nil {
		t.Fatalf("substitute the outputs from the printed cache: %v\n%s", err, b)
	}

	// The same files again: the same evaluation, nothing rebuilt, the same verdict.
	code, again := proctest.Run(t, nil, args...)
	if code != 1 || !strings.Contains(again, "2 of 29 attributes failed") {
		t.Fatalf("second run exited %d:\n%s", code, again)
	}
	if rows2 := summaryRows(t, again); rows2["release"] != rows["release"] {
		t.Errorf("second run: release %+v, first %+v", rows2["release"], rows["release"])
	}

	code, ok := proctest.Run(t, nil, append(args, "--attr", "libs", "--attr", "tools", "--attr", "tests", "--attr", "release")...)
	if code != 0 {
		t.Fatalf("run --attr without broken exited %d:\n%s", code, ok)
	}
	if rows := summaryRows(t, ok); len(rows) != 27 || rows["broken.tool"].status != "" {
		t.Fatalf("run --attr: %d attributes:\n%s", len(rows), ok)
	}
}

// TestRunGitURL builds a repository given by URL, at the head of a chosen branch.
func TestRunGitURL(t *testing.T) {
	nixtest.RequireNix(t)
	repo := nixtest.NewRepo(t)
	repo.Commit("first", map[string]string{"ci.nix": nixtest.Lib(t.Name()) + "\n{ a = mk \"a\" [ ]; }"})
	repo.Git("checkout", "-q", "-b", "feature")
	repo.Commit("feature", map[string]string{"ci.nix": nixtest.Lib(t.Name()) + "\nrec { a = mk \"a\" [ ]; b = mk \"b\" [ a ]; }"})
	state := stateDir(t)
	code, out := proctest.Run(t, nil, "run", "file://"+repo.Dir, "--branch", "feature", "--state-dir", state, "--nix-store", t.TempDir())
	if code != 0 {
		t.Fatalf("run exited %d:\n%s", code, out)
	}
	rows := summaryRows(t, out)
	if len(rows) != 2 || rows["b"].status != "succeeded" {
		t.Fatalf("want a and b succeeded:\n%s", out)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", filepath.Join(state, "no-such-dir")}, "no such directory, and not a git URL"},
		{[]string{"run", "../examples/dag", "--branch", "x"}, "--branch applies to git URLs only"},
		{[]string{"run", "../examples/dag", "--attr", "../x"}, "--attr"},
	} {
		code, out := proctest.Run(t, nil, append(c.args, "--state-dir", state)...)
		if code == 0 || !strings.Contains(out, c.want) {
			t.Errorf("%v: exit %d, want an error containing %q:\n%s", c.args, code, c.want, out)
		}
	}
}

// stateDir is a state directory the embedded PostgreSQL (running as the postgres user when the
// tests run as root) can reach: t.TempDir's parent is private (0700).
func stateDir(t *testing.T) string {
	t.Helper()
	state := t.TempDir()
	if err := os.Chmod(filepath.Dir(state), 0o711); err != nil {
		t.Fatal(err)
	}
	return state
}

type summaryRow struct{ status, path string }

// summaryRows parses run's table: ATTRIBUTE STATUS DURATION STORE PATH.
func summaryRows(t *testing.T, out string) map[string]summaryRow {
	t.Helper()
	rows := map[string]summaryRow{}
	in := false
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 4 && f[0] == "ATTRIBUTE" && f[1] == "STATUS":
			in = true
		case in && len(f) >= 4:
			rows[f[0]] = summaryRow{status: f[1], path: f[3]}
		case in:
			return rows
		}
	}
	return rows
}
