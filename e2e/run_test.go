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

// TestRunExample runs the README's first command on the shipped example project: every
// attribute builds, the command exits 0, the cache it names serves every built output signed by
// the key it prints, and a second run of the same files changes nothing. --attr builds a part.
func TestRunExample(t *testing.T) {
	nixtest.RequireNix(t)
	state := stateDir(t)
	store := t.TempDir() // a chroot store: built in the sandbox, isolated from other tests
	args := []string{"run", "../examples/dag", "--state-dir", state, "--nix-store", store, "--jobs", "3"}

	code, out := proctest.Run(t, nil, args...)
	if code != 0 {
		t.Fatalf("run exited %d, want 0:\n%s", code, out)
	}
	rows := summaryRows(t, out)
	if len(rows) != 27 {
		t.Fatalf("summary has %d attributes, want 27:\n%s", len(rows), out)
	}
	for attr, r := range rows {
		if r.status != "succeeded" {
			t.Errorf("%s: status %q, want succeeded", attr, r.status)
		}
	}
	for _, want := range []string{"27 attributes in", "cache:      file://" + filepath.Join(state, "cache")} {
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
		if !strings.HasPrefix(r.path, "/nix/store/") {
			t.Fatalf("%s: store path %q", attr, r.path)
		}
		paths = append(paths, r.path)
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
	if code != 0 {
		t.Fatalf("second run exited %d:\n%s", code, again)
	}
	if rows2 := summaryRows(t, again); rows2["release"] != rows["release"] {
		t.Errorf("second run: release %+v, first %+v", rows2["release"], rows["release"])
	}

	code, part := proctest.Run(t, nil, append(args, "--attr", "libs", "--attr", "release")...)
	if code != 0 {
		t.Fatalf("run --attr libs --attr release exited %d:\n%s", code, part)
	}
	if rows := summaryRows(t, part); len(rows) != 11 || rows["release"].status != "succeeded" || rows["libs.lib-9"].status != "succeeded" {
		t.Fatalf("run --attr libs --attr release: %d attributes, want 11:\n%s", len(rows), part)
	}
}

// TestRunFailingExample runs the README's second example, what a failure looks like: the
// summary shows the failed attribute, the one that needs it as dep-failed and the one that built;
// the failure's message is printed and the command exits 1, on a second run too.
func TestRunFailingExample(t *testing.T) {
	nixtest.RequireNix(t)
	state := stateDir(t)
	args := []string{"run", "../examples/failing", "--state-dir", state, "--nix-store", t.TempDir()}
	for _, round := range []string{"first run", "second run"} {
		code, out := proctest.Run(t, nil, args...)
		if code != 1 {
			t.Fatalf("%s exited %d, want 1 (tool fails on purpose):\n%s", round, code, out)
		}
		rows := summaryRows(t, out)
		if len(rows) != 3 {
			t.Fatalf("%s: summary has %d attributes, want 3:\n%s", round, len(rows), out)
		}
		for attr, want := range map[string]string{"tool": "failed", "app": "dep-failed", "lib": "succeeded"} {
			if rows[attr].status != want {
				t.Errorf("%s: %s: status %q, want %q", round, attr, rows[attr].status, want)
			}
		}
		for _, want := range []string{"tool: builder for", "harmonia-ci: 2 of 3 attributes failed"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: output lacks %q:\n%s", round, want, out)
			}
		}
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
