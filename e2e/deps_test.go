package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// TestDepsNixSetup runs scripts/deps.sh's Nix set-up on a scratch root with a scratch build group,
// so the set-up a fresh CI machine gets is tested whatever this machine already has: the users
// and the store it makes, a sandboxed build that really runs as one of those users, and a second
// run that changes nothing.
func TestDepsNixSetup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the Nix set-up creates system users and groups, which needs root")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute) // apt-get install nix-bin if missing
	defer cancel()

	group := scratchGroupName(t)
	evalUser := group + "ev"
	buildUsers := []string{group + "1", group + "2"}
	t.Cleanup(func() {
		for _, u := range append(slices.Clone(buildUsers), evalUser) {
			_ = exec.Command("userdel", u).Run() // absent if the script failed early
		}
		for _, g := range []string{evalUser, group} {
			_ = exec.Command("groupdel", g).Run()
		}
	})

	// Build users must be able to reach the store; t.TempDir's per-test parent is 0700.
	root := t.TempDir()
	for _, d := range []string{filepath.Dir(root), root} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	setup := func() string {
		t.Helper()
		cmd := exec.CommandContext(ctx, "../scripts/deps.sh", "nix")
		cmd.Env = append(os.Environ(), "NIX_SETUP_ROOT="+root, "NIX_BUILD_GROUP="+group,
			"NIX_BUILD_USERS=2", "NIX_BUILD_USER_PREFIX=", "HARMONIA_EVAL_USER="+evalUser)
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stderr, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("scripts/deps.sh nix: %v\n%s", err, stderr.String())
		}
		return stderr.String()
	}

	out := setup()
	t.Logf("first run:\n%s", out)

	gid, members := groupEntry(t, group)
	slices.Sort(members)
	if !slices.Equal(members, buildUsers) {
		t.Errorf("group %s has members %v, want %v", group, members, buildUsers)
	}
	uids := map[int]string{}
	for _, u := range buildUsers {
		pw := passwdEntry(t, u)
		if pw.gid != gid || pw.home != "/var/empty" || !strings.HasSuffix(pw.shell, "/nologin") {
			t.Errorf("build user %s: %+v, want primary group %d, home /var/empty, shell nologin", u, pw, gid)
		}
		uids[pw.uid] = u
	}
	pw := passwdEntry(t, evalUser)
	if groups := userGroups(t, evalUser); pw.gid == gid || slices.Contains(groups, group) {
		t.Errorf("eval user %s is in the build group %s: %+v, groups %v", evalUser, group, pw, groups)
	}

	store := filepath.Join(root, "nix", "store")
	checkStore := func() {
		t.Helper()
		fi, err := os.Stat(store)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode()&(fs.ModePerm|fs.ModeSticky) != fs.ModeSticky|0o775 || st.Uid != 0 || int(st.Gid) != gid {
			t.Errorf("%s: mode %v, owner %d:%d; want 1775 root:%s (%d)", store, fi.Mode(), st.Uid, st.Gid, group, gid)
		}
	}
	checkStore()
	if _, err := os.Stat(filepath.Join(root, "nix", "var", "nix", "db", "db.sqlite")); err != nil {
		t.Fatalf("store database: %v", err)
	}

	build := func(name string) {
		t.Helper()
		uid := buildInScratchStore(ctx, t, root, group, name)
		if _, ok := uids[uid]; !ok {
			t.Errorf("build %s ran as uid %d, want one of the scratch build users %v", name, uid, uids)
		}
		// Nix 2.8 locks the build user it takes as NIX_STATE_DIR/userpool/UID.
		entries, err := os.ReadDir(filepath.Join(root, "nix", "var", "nix", "userpool"))
		if err != nil {
			t.Fatal(err)
		}
		var locked []string
		for _, e := range entries {
			if n, err := strconv.Atoi(e.Name()); err != nil || uids[n] == "" {
				t.Errorf("userpool holds %q, not a scratch build user's uid (%v)", e.Name(), uids)
			}
			locked = append(locked, e.Name())
		}
		if !slices.Contains(locked, strconv.Itoa(uid)) {
			t.Errorf("userpool holds %v, want the lock of uid %d", locked, uid)
		}
	}
	build("deps-probe-1")

	// Run again: nothing to do, so nothing said and nothing changed.
	before := accountsSnapshot(t, group, append(slices.Clone(buildUsers), evalUser))
	if out := setup(); out != "" {
		t.Errorf("second run of an already set-up machine said:\n%s", out)
	}
	if after := accountsSnapshot(t, group, append(slices.Clone(buildUsers), evalUser)); after != before {
		t.Errorf("second run changed the accounts:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	checkStore()
	build("deps-probe-2")
}

// scratchGroupName returns "hcit" and six random letters, a group and user prefix that exists
// nowhere yet and leaves room for a suffix within useradd's 32 characters.
func scratchGroupName(t *testing.T) string {
	t.Helper()
	for {
		b := make([]byte, 6)
		rand.Read(b)
		for i := range b {
			b[i] = 'a' + b[i]%26
		}
		name := "hcit" + string(b)
		if exec.Command("getent", "group", name).Run() != nil && exec.Command("getent", "passwd", name+"1").Run() != nil {
			return name
		}
	}
}

// groupEntry returns a group's gid and its supplementary members, from the system's databases.
func groupEntry(t *testing.T, name string) (int, []string) {
	t.Helper()
	f := strings.Split(getent(t, "group", name), ":")
	if len(f) != 4 {
		t.Fatalf("getent group %s: %q", name, f)
	}
	gid, err := strconv.Atoi(f[2])
	if err != nil {
		t.Fatal(err)
	}
	var members []string
	if f[3] != "" {
		members = strings.Split(f[3], ",")
	}
	return gid, members
}

type passwd struct {
	uid, gid    int
	home, shell string
}

func passwdEntry(t *testing.T, name string) passwd {
	t.Helper()
	f := strings.Split(getent(t, "passwd", name), ":")
	if len(f) != 7 {
		t.Fatalf("getent passwd %s: %q", name, f)
	}
	uid, err1 := strconv.Atoi(f[2])
	gid, err2 := strconv.Atoi(f[3])
	if err1 != nil || err2 != nil {
		t.Fatalf("getent passwd %s: %q", name, f)
	}
	return passwd{uid: uid, gid: gid, home: f[5], shell: f[6]}
}

func userGroups(t *testing.T, user string) []string {
	t.Helper()
	out, err := exec.Command("id", "-nG", user).Output()
	if err != nil {
		t.Fatalf("id -nG %s: %v", user, err)
	}
	return strings.Fields(string(out))
}

func getent(t *testing.T, db, key string) string {
	t.Helper()
	out, err := exec.Command("getent", db, key).Output()
	if err != nil {
		t.Fatalf("getent %s %s: %v", db, key, err)
	}
	return strings.TrimSpace(string(out))
}

// accountsSnapshot is the group's entry and the users' entries, as the system reports them.
func accountsSnapshot(t *testing.T, group string, users []string) string {
	t.Helper()
	s := getent(t, "group", group) + "\n"
	for _, u := range users {
		s += getent(t, "passwd", u) + "\n" + strings.Join(userGroups(t, u), " ") + "\n"
	}
	return s
}

// buildInScratchStore builds a derivation in root's chroot store, sandboxed, with group as the
// build users group, and returns the uid the builder ran as on this machine. The builder records
// its uid and /proc/self/uid_map, which maps it out of the sandbox's user namespace.
func buildInScratchStore(ctx context.Context, t *testing.T, root, group, name string) int {
	t.Helper()
	expr := filepath.Join(t.TempDir(), "probe.nix")
	if err := os.WriteFile(expr, []byte(`builtins.derivation {
  name = "`+name+`";
  system = builtins.currentSystem;
  builder = "/bin/sh";
  args = [ "-c" "{ while IFS= read -r l; do echo \"map $l\"; done < /proc/self/uid_map; while IFS= read -r l; do case $l in Uid:*) echo \"$l\";; esac; done < /proc/self/status; } > $out" ];
}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, append([]string{"--store", root, "--option", "build-users-group", group}, args...)...)
		// Nix 2.8 keeps its user pool in its own state directory, not the chroot store's: this
		// keeps the test's locks in the scratch root and off this machine's /nix.
		cmd.Env = append(os.Environ(), "NIX_STATE_DIR="+filepath.Join(root, "nix", "var", "nix"))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.String())
		}
		return strings.TrimSpace(string(out))
	}
	drv := run("nix-instantiate", expr)
	out := run("nix-store", "--realise", drv, "--option", "sandbox", "true",
		"--option", "sandbox-paths", strings.Join(nix.SandboxPaths(nil), " "), "--option", "substituters", "")
	raw, err := os.ReadFile(filepath.Join(root, out))
	if err != nil {
		t.Fatalf("build output: %v", err)
	}
	uid, err := hostUID(string(raw))
	if err != nil {
		t.Fatalf("build output %q: %v", raw, err)
	}
	return uid
}

// hostUID maps the "Uid:" a process saw through the "map INSIDE OUTSIDE COUNT" lines of its
// uid_map, giving its uid outside its user namespace.
func hostUID(probe string) (int, error) {
	uid := -1
	var maps [][3]int
	for line := range strings.Lines(probe) {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && f[0] == "Uid:":
			uid, _ = strconv.Atoi(f[1])
		case len(f) == 4 && f[0] == "map":
			var m [3]int
			for i := range m {
				m[i], _ = strconv.Atoi(f[i+1])
			}
			maps = append(maps, m)
		}
	}
	for _, m := range maps {
		if uid >= m[0] && uid-m[0] < m[2] {
			return m[1] + uid - m[0], nil
		}
	}
	return 0, fmt.Errorf("uid %d is in no uid_map range %v", uid, maps)
}
