package eval

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// Every evaluation's Nix runs in a filesystem view of its own, a mount namespace made with
// bubblewrap, so that a fetcher restricted mode forgets to check finds nothing to read. The
// view holds the programs Nix runs with (read-only), the store, the daemon socket it talks to,
// the walker, the project's source and the project's HOME, at fixed places under viewDir:
// nothing of the state directory, other projects, or the node's configuration and keys.
const (
	viewDir    = "/eval"
	viewWalker = viewDir + "/walker" // the walker and its spec, read-only
	viewHome   = viewDir + "/home"   // the project's HOME, read-write
	// viewSocket is where a private daemon's socket appears: Nix's default, so nothing else of
	// the node's store layout is needed.
	viewSocket = "/nix/var/nix/daemon-socket/socket"
)

// bwrapPackage is what provides bwrap, for the error that says it is missing.
const bwrapPackage = "bubblewrap"

// lookBwrap finds bwrap: bin if set, else on PATH, else /usr/bin/bwrap.
func lookBwrap(bin string) (string, error) {
	candidates := []string{bin}
	if bin == "" {
		candidates = []string{"bwrap", "/usr/bin/bwrap"}
	}
	for _, c := range candidates {
		if p, err := exec.LookPath(c); err == nil {
			return p, nil
		}
	}
	if bin == "" {
		bin = "bwrap"
	}
	return "", fmt.Errorf("%s is not installed: every evaluation runs in a filesystem view of its own made with it (apt-get install %s, or scripts/deps.sh run)", bin, bwrapPackage)
}

// systemDirs are the directories Nix, git and the shell need to run, bound read-only; the
// ones that are symbolic links (a merged /usr) are recreated as links.
var systemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}

// viewSpec is what one view holds besides the system directories and the store.
type viewSpec struct {
	walker string // host directory shown at viewWalker; "" for none
	source string // host directory shown at sourceAt; "" for none
	// sourceAt is the source's place in the view.
	sourceAt string
	home     string // host directory shown at viewHome, read-write; "" for none
	// info: bwrap reports the pid of the Nix inside on fd 3, which the caller passes.
	info   bool
	socket string // the private daemon's socket, shown at viewSocket; "" when Nix reaches the store as this node does
}

// viewSource is where spec's source appears in the view: under viewDir, with its own name (a
// file project's tree is a directory named "source", which is the name ./. gets in the store).
func viewSource(source string) (string, error) {
	base := filepath.Base(source)
	if base == "/" || base == "." || base == ".." {
		return "", fmt.Errorf("the source directory %q has no name to show it under", source)
	}
	return viewDir + "/" + base, nil
}

// viewCommand returns bwrap running argv (argv[0] on the host) inside the view v, and the
// environment additions Nix needs there.
func (r *NixRunner) viewCommand(argv []string, v viewSpec) (bin string, args []string, err error) {
	bwrap, err := lookBwrap(r.Bwrap)
	if err != nil {
		return "", nil, err
	}
	nixBin, err := exec.LookPath(argv[0])
	if err != nil {
		return "", nil, fmt.Errorf("find %s: %w", argv[0], err)
	}
	if nixBin, err = filepath.Abs(nixBin); err != nil {
		return "", nil, err
	}
	// A new user namespace (Nix keeps the uid it runs as, with no capability outside), new
	// pid, ipc, uts, cgroup and network namespaces (an evaluation needs no network: it
	// substitutes nothing and fetches no URI), a session of its own (no terminal to inject
	// into), and Nix as the namespace's first process, so that the view ends with it and the
	// pid bwrap reports is Nix's.
	args = []string{"--unshare-all", "--die-with-parent", "--new-session", "--as-pid-1"}
	if v.info {
		args = append(args, "--info-fd", "3")
	}
	for _, d := range systemDirs {
		fi, err := os.Lstat(d)
		switch {
		case err != nil:
			continue
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(d)
			if err != nil {
				return "", nil, fmt.Errorf("read the link %s: %w", d, err)
			}
			args = append(args, "--symlink", target, d)
		case fi.IsDir():
			args = append(args, "--ro-bind", d, d)
		}
	}
	// No /etc: Nix's and git's configuration is given on their command lines and in the
	// environment, the loader finds the libraries in their standard directories, and USER
	// names the user to Nix; the node's configuration (nix.conf's access tokens, netrc,
	// harmonia-ci's own files, its users) is none of a project's business.
	args = append(args, "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--setenv", "USER", r.userName())
	storeDir := nix.StoreDir
	if d := os.Getenv("NIX_STORE_DIR"); d != "" {
		storeDir = d
	}
	if v.socket != "" {
		// An untrusted client of a daemon of ours: the store to read, the socket to write to.
		args = append(args, "--ro-bind", storeDir, storeDir, "--bind", v.socket, viewSocket)
	} else {
		// Nix reaches the store as this node does (its local store, or a daemon's socket
		// under /nix): with the node user's own permissions, nothing more.
		args = append(args, "--bind-try", "/nix", "/nix", "--bind-try", storeDir, storeDir)
		for _, k := range []string{"NIX_STATE_DIR", "NIX_DAEMON_SOCKET_PATH"} {
			if p := os.Getenv(k); filepath.IsAbs(p) {
				args = append(args, "--bind-try", p, p)
			}
		}
		if r.Store != "" {
			args = append(args, "--bind", r.Store, r.Store)
		}
	}
	if !underAny(nixBin, append([]string{storeDir}, systemDirs...)) {
		args = append(args, "--ro-bind", nixBin, nixBin)
	}
	for _, e := range r.SearchPath {
		if _, p, ok := strings.Cut(e, "="); ok && filepath.IsAbs(p) && p != "/" {
			args = append(args, "--ro-bind-try", p, p)
		}
	}
	chdir := "/"
	if v.walker != "" {
		args = append(args, "--ro-bind", v.walker, viewWalker)
		chdir = viewWalker
	}
	if v.source != "" {
		args = append(args, "--ro-bind", v.source, v.sourceAt)
	}
	if v.home != "" {
		args = append(args, "--bind", v.home, viewHome, "--setenv", "HOME", viewHome)
	} else {
		// Nix wants a HOME even to say its version; the private /tmp is one.
		args = append(args, "--setenv", "HOME", "/tmp")
	}
	args = append(args, "--setenv", "TMPDIR", "/tmp", "--chdir", chdir, "--", nixBin)
	return bwrap, append(args, argv[1:]...), nil
}

// userName is the name of the user Nix runs as.
func (r *NixRunner) userName() string {
	if r.User != nil {
		return r.User.Name
	}
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return "evaluator"
}

func underAny(p string, dirs []string) bool {
	for _, d := range dirs {
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

// readChildPid reads the pid of the view's first process (Nix) from bwrap's info fd, 0 if bwrap
// wrote none (it failed before starting Nix).
func readChildPid(f *os.File) int {
	defer f.Close()
	var info struct {
		ChildPid int `json:"child-pid"`
	}
	if err := json.NewDecoder(f).Decode(&info); err != nil {
		return 0
	}
	return info.ChildPid
}

// bwrapSignal is the signal that killed the view's Nix, if one did: bwrap then exits with 128
// plus the signal's number.
func bwrapSignal(exit *exec.ExitError) (syscall.Signal, bool) {
	if c := exit.ExitCode(); c > 128 && c < 128+65 {
		return syscall.Signal(c - 128), true
	}
	return 0, false
}
