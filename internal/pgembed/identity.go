package pgembed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// identity is the user the server runs as. PostgreSQL refuses to run as root, so root runs
// it as the unprivileged "postgres" system user and hands it the directories it writes.
type identity struct {
	root     bool // this process is root and switches to uid/gid for the server
	uid, gid int
}

func lookupUser(name string) (*user.User, error) { return user.Lookup(name) }

func currentIdentity(lookup func(string) (*user.User, error)) (identity, error) {
	if os.Geteuid() != 0 {
		return identity{uid: os.Geteuid(), gid: os.Getegid()}, nil
	}
	u, err := lookup("postgres")
	if err != nil {
		return identity{}, fmt.Errorf(`embedded PostgreSQL: running as root needs the unprivileged "postgres" system user (created by the postgresql package): %w`, err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return identity{}, fmt.Errorf("embedded PostgreSQL: postgres user has non-numeric uid/gid %q/%q", u.Uid, u.Gid)
	}
	if uid == 0 {
		return identity{}, errors.New(`embedded PostgreSQL: the "postgres" system user must not be root`)
	}
	return identity{root: true, uid: uid, gid: gid}, nil
}

// command runs a server program as the server user, from "/" because the caller's working
// directory may be unreadable to that user, with only the environment it needs: the server
// keeps its environment for its lifetime, where any superuser can read it
// (pg_read_binary_file('/proc/PID/environ')), so the caller's secrets must not reach it, and
// no PG* variable is passed, so a stray PGDATA or PGPORT cannot redirect it.
func (id identity) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = "/"
	cmd.Env = serverEnv(os.Environ())
	if id.root {
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Credential: &syscall.Credential{Uid: uint32(id.uid), Gid: uint32(id.gid)},
		}
	}
	return cmd
}

// serverEnv keeps from env what the server programs use: PATH for the shell pg_ctl starts the
// server through, the time zone initdb writes into the configuration, the temporary directory
// and the language of messages.
func serverEnv(env []string) []string {
	out := []string{} // not nil: a nil Cmd.Env means the whole environment
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if name == "PATH" || name == "TZ" || name == "TMPDIR" || name == "LANG" || strings.HasPrefix(name, "LC_") {
			out = append(out, kv)
		}
	}
	return out
}

// mkdir creates a 0700 directory owned by the server user.
func (id identity) mkdir(p string) error {
	if err := os.Mkdir(p, 0o700); err != nil {
		return err
	}
	return id.chown(p)
}

func (id identity) chown(p string) error {
	if !id.root {
		return nil
	}
	return os.Chown(p, id.uid, id.gid)
}

// canSearch reports whether the server user may traverse a directory with this stat.
func (id identity) canSearch(fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	perm := fi.Mode().Perm()
	switch {
	case int(st.Uid) == id.uid:
		return perm&0o100 != 0
	case int(st.Gid) == id.gid:
		// The child runs with no supplementary groups, so only the primary group counts.
		return perm&0o010 != 0
	default:
		return perm&0o001 != 0
	}
}

// prepareDir creates Dir and returns its canonical absolute path. As root it checks that the
// server user can reach it, and makes Dir itself searchable (not readable) for that user.
func prepareDir(dir string, id identity) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("embedded PostgreSQL: %w", err)
	}
	// Parents we create are ordinary 0755 directories: 0700 ones would lock the server out.
	if err := os.MkdirAll(filepath.Dir(abs), 0o755); err != nil {
		return "", fmt.Errorf("embedded PostgreSQL: %w", err)
	}
	if err := os.Mkdir(abs, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("embedded PostgreSQL: %w", err)
	}
	if abs, err = filepath.EvalSymlinks(abs); err != nil {
		return "", fmt.Errorf("embedded PostgreSQL: %w", err)
	}
	if !id.root {
		return abs, nil
	}
	if err := checkReachable(abs, id); err != nil {
		return "", err
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return "", fmt.Errorf("embedded PostgreSQL: %w", err)
	}
	if !id.canSearch(fi) {
		if err := os.Chmod(abs, fi.Mode().Perm()|0o001); err != nil {
			return "", fmt.Errorf("embedded PostgreSQL: %w", err)
		}
	}
	return abs, nil
}

// checkReachable fails unless the server user can search every parent of dir.
func checkReachable(dir string, id identity) error {
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("embedded PostgreSQL: %w", err)
		}
		if !id.canSearch(fi) {
			return fmt.Errorf("embedded PostgreSQL: the postgres user cannot reach %s (parent %s is not searchable); choose a state directory outside a private home, e.g. /var/lib/harmonia-ci", dir, p)
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// lockFile takes an exclusive flock on path, giving up when ctx ends. The returned func
// releases it. flock locks belong to the open file, so two Starts in one process exclude each
// other just as two processes do.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() {
		for {
			err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
			if err != syscall.EINTR {
				done <- err
				return
			}
		}
	}()
	select {
	case err := <-done:
		if err != nil {
			f.Close()
			return nil, err
		}
		return func() { f.Close() }, nil // closing the file drops the lock
	case <-ctx.Done():
		// The flock call cannot be interrupted: release the lock once it comes.
		go func() { <-done; f.Close() }()
		return nil, ctx.Err()
	}
}
