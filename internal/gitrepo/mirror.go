// Package gitrepo keeps a bare mirror of a project's repository under a state directory and reads
// commits, trees and files from it without a checkout. It runs the git binary rather than a Go
// implementation so that transports, credentials and object formats behave exactly as the
// operator's git does.
package gitrepo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Mirror is a bare mirror of one repository at Dir.
type Mirror struct {
	Dir, URL string
}

// New returns the mirror of url kept at dir. Nothing is touched on disk until Fetch.
func New(dir, url string) (*Mirror, error) {
	if dir == "" {
		return nil, errors.New("empty mirror directory")
	}
	if err := ValidateURL(url); err != nil {
		return nil, err
	}
	return &Mirror{Dir: filepath.Clean(dir), URL: url}, nil
}

// Fetch brings the mirror up to date: a mirror clone when Dir does not exist yet, else a fetch of
// every ref that also prunes refs deleted upstream. It is safe to call from several processes at
// once.
func (m *Mirror) Fetch(ctx context.Context) error {
	return m.fetch(ctx, m.URL, nil)
}

// FetchWith is Fetch from cred.URL with the credential: a token reaches git only in its
// environment, as an Authorization header for that URL alone, a key only as a 0600 file in a
// private temporary directory that ssh reads and that is removed when git is done. Neither is
// on a command line, in the mirror's configuration or in the URL git records, and an error
// names neither. A host key seen for the first time is pinned in Dir.known_hosts, and checked
// on every later fetch.
func (m *Mirror) FetchWith(ctx context.Context, cred Credential) error {
	env, cleanup, err := cred.gitEnv(m.Dir + ".known_hosts")
	if err != nil {
		return fmt.Errorf("fetch %s: %w", redact(cred.URL), err)
	}
	defer cleanup()
	if err := m.fetch(ctx, cred.URL, env); err != nil {
		return cred.scrub(err)
	}
	return nil
}

// fetch is Fetch from url, git running with env added to its environment.
func (m *Mirror) fetch(ctx context.Context, url string, env []string) error {
	// The fields are exported, so a Mirror may not have come from New.
	if err := ValidateURL(url); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(m.Dir), 0o755); err != nil {
		return fmt.Errorf("fetch %s: %w", redact(url), err)
	}
	unlock, err := lock(ctx, m.Dir+".lock")
	if err != nil {
		return fmt.Errorf("fetch %s: %w", redact(url), err)
	}
	defer unlock()

	if _, err := os.Stat(m.Dir); errors.Is(err, fs.ErrNotExist) {
		return m.clone(ctx, url, env)
	} else if err != nil {
		return fmt.Errorf("fetch %s: %w", redact(url), err)
	}
	// Fetching from url rather than the remote recorded at clone time makes a changed project
	// URL take effect without recreating the mirror.
	// The negative refspec keeps harmonia-ci's own refs out of both the fetch and the prune.
	if _, err := runEnv(ctx, m.Dir, env, "fetch", "--prune", "--quiet", "--", url, "+refs/*:refs/*", "^"+LocalRefPrefix+"*"); err != nil {
		return fmt.Errorf("fetch %s: %w", redact(url), err)
	}
	return nil
}

// clone makes the mirror in a temporary directory and renames it into place, so that a failed or
// interrupted clone never leaves a Dir that later calls would take for a valid mirror. The caller
// holds the lock.
func (m *Mirror) clone(ctx context.Context, url string, env []string) error {
	tmp := m.Dir + ".tmp"
	// Only a process killed mid-clone leaves tmp behind, and the lock shuts out everyone else.
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("clone %s: %w", redact(url), err)
	}
	if _, err := runEnv(ctx, "", env, "clone", "--mirror", "--quiet", "--", url, tmp); err != nil {
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("clone %s: %w", redact(url), err)
	}
	if err := os.Rename(tmp, m.Dir); err != nil {
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("clone %s: %w", redact(url), err)
	}
	return nil
}

// lock takes an exclusive flock on path, creating it if needed. The file is never removed:
// deleting it would let a waiter lock an unlinked inode while a newcomer locks a fresh one.
func lock(ctx context.Context, path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	// Poll rather than block: a blocking flock cannot be abandoned when ctx is done, and a clone
	// held by another process can take minutes.
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = f.Close() }, nil // closing releases the lock
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			_ = f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ResolveBranch returns the full sha of the commit at the tip of branch.
func (m *Mirror) ResolveBranch(ctx context.Context, branch string) (string, error) {
	if err := ValidateBranch(branch); err != nil {
		return "", err
	}
	id, ok, err := m.revParse(ctx, "refs/heads/"+branch+"^{commit}")
	if err != nil {
		return "", fmt.Errorf("resolve branch %q: %w", branch, err)
	}
	if !ok {
		return "", fmt.Errorf("branch %q not found in %s", branch, m.Dir)
	}
	return id, nil
}

// ResolveCommit returns the full sha of the commit that rev, a full or abbreviated object id,
// names. An annotated tag's id resolves to the commit it tags.
func (m *Mirror) ResolveCommit(ctx context.Context, rev string) (string, error) {
	if err := validateRev(rev); err != nil {
		return "", err
	}
	rev = strings.ToLower(rev)
	id, ok, err := m.revParse(ctx, rev+"^{commit}")
	if err != nil {
		return "", fmt.Errorf("resolve commit %s: %w", rev, err)
	}
	if !ok {
		return "", fmt.Errorf("commit %s not found in %s", rev, m.Dir)
	}
	if strings.HasPrefix(id, rev) {
		return id, nil
	}
	// Either rev is a tag's id, or git took an abbreviated rev for a ref name (a branch called
	// "cafe"), which it prefers over object ids. Only the first names the object the caller meant.
	obj, ok, err := m.revParse(ctx, rev)
	if err != nil {
		return "", fmt.Errorf("resolve commit %s: %w", rev, err)
	}
	if !ok || !strings.HasPrefix(obj, rev) {
		return "", fmt.Errorf("commit %s in %s: a ref has the same name, give the full sha", rev, m.Dir)
	}
	return id, nil
}

// Tree returns the id of the root tree of commit, a full or abbreviated commit id. Commits with
// identical contents share a tree id, whatever their history or message.
func (m *Mirror) Tree(ctx context.Context, commit string) (string, error) {
	id, err := m.ResolveCommit(ctx, commit)
	if err != nil {
		return "", err
	}
	tree, ok, err := m.revParse(ctx, id+"^{tree}")
	if err != nil {
		return "", fmt.Errorf("tree of %s: %w", id, err)
	}
	if !ok {
		return "", fmt.Errorf("tree of %s not found in %s", id, m.Dir)
	}
	return tree, nil
}

// RefContaining returns a ref that contains commit, preferring refs/heads/<branch>; "" if none
// does. Fetchers that take a ref and a revision (Nix's git fetcher) need one.
func (m *Mirror) RefContaining(ctx context.Context, commit, branch string) (string, error) {
	id, err := m.ResolveCommit(ctx, commit)
	if err != nil {
		return "", err
	}
	patterns := []string{"refs/"}
	if ValidateBranch(branch) == nil {
		patterns = []string{"refs/heads/" + branch, "refs/"}
	}
	for _, pattern := range patterns {
		out, err := run(ctx, nil, m.Dir, "for-each-ref", "--count=1", "--contains", id, "--format=%(refname)", pattern)
		if err != nil {
			return "", fmt.Errorf("refs containing %s: %w", id, err)
		}
		if ref := strings.TrimSpace(string(out)); ref != "" {
			return ref, nil
		}
	}
	return "", nil
}

// ReadFile returns the contents of the file at path in commit, and false when there is none.
// path is slash-separated and relative to the repository root. A symlink yields its target.
func (m *Mirror) ReadFile(ctx context.Context, commit, path string) ([]byte, bool, error) {
	if err := validatePath(path); err != nil {
		return nil, false, err
	}
	tree, err := m.Tree(ctx, commit)
	if err != nil {
		return nil, false, err
	}
	// cat-file --batch tells "missing" apart from failures without parsing error messages, and
	// takes the path on stdin, out of reach of option parsing. The tree is known to exist, so
	// "missing" can only mean the path.
	out, err := run(ctx, strings.NewReader(tree+":"+path+"\n"), m.Dir, "cat-file", "--batch")
	if err != nil {
		return nil, false, fmt.Errorf("read %s:%s: %w", commit, path, err)
	}
	header, body, _ := bytes.Cut(out, []byte("\n"))
	if bytes.HasSuffix(header, []byte(" missing")) {
		return nil, false, nil
	}
	// header is "<id> <type> <size>".
	f := strings.Fields(string(header))
	if len(f) != 3 {
		return nil, false, fmt.Errorf("read %s:%s: unexpected cat-file output %q", commit, path, header)
	}
	if f[1] != "blob" {
		return nil, false, fmt.Errorf("read %s:%s: is a %s, not a file", commit, path, f[1])
	}
	size, err := strconv.Atoi(f[2])
	if err != nil || size < 0 || size > len(body) {
		return nil, false, fmt.Errorf("read %s:%s: unexpected cat-file output %q", commit, path, header)
	}
	return body[:size], true, nil
}

// revParse returns the object id rev names, and false when it names none.
func (m *Mirror) revParse(ctx context.Context, rev string) (string, bool, error) {
	out, err := run(ctx, nil, m.Dir, "rev-parse", "--verify", "--quiet", "--end-of-options", rev)
	var gerr *gitError
	// With --quiet, "no such object" is exit status 1 and silence; anything said on stderr (an
	// ambiguous abbreviation, a missing repository) is a real error.
	if errors.As(err, &gerr) && gerr.code == 1 && gerr.stderr == "" {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return strings.TrimSpace(string(out)), true, nil
}

// gitError is a failed git invocation, carrying what git said about it.
type gitError struct {
	sub    string // subcommand, e.g. "fetch"
	stderr string // trimmed
	code   int    // exit status, -1 when git did not exit normally
	err    error
}

func (e *gitError) Error() string {
	if e.stderr == "" {
		return fmt.Sprintf("git %s: %v", e.sub, e.err)
	}
	return fmt.Sprintf("git %s: %s (%v)", e.sub, e.stderr, e.err)
}

func (e *gitError) Unwrap() error { return e.err }

// run runs git sub args in the repository at gitDir ("" for none) and returns its stdout.
func run(ctx context.Context, stdin io.Reader, gitDir, sub string, args ...string) ([]byte, error) {
	return runIn(ctx, stdin, gitDir, "", sub, args...)
}

// runIn is run with a work tree ("" for none) and the git identity of harmonia-ci's own commits.
func runIn(ctx context.Context, stdin io.Reader, gitDir, workTree, sub string, args ...string) ([]byte, error) {
	cmd, stderr := command(ctx, stdin, gitDir, workTree, sub, args...)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	if err := cmd.Run(); err != nil {
		return nil, commandError(ctx, sub, stderr, err)
	}
	return stdout.Bytes(), nil
}

// command is git SUB ARGS... as runIn runs it; the caller takes its stdout and, on failure,
// passes its error and stderr to commandError.
func command(ctx context.Context, stdin io.Reader, gitDir, workTree, sub string, args ...string) (*exec.Cmd, *bytes.Buffer) {
	argv := make([]string, 0, len(args)+10)
	if gitDir != "" {
		argv = append(argv, "--git-dir="+gitDir)
	}
	if workTree != "" {
		argv = append(argv, "--work-tree="+workTree, "-c", "user.name=harmonia-ci", "-c", "user.email=harmonia-ci@localhost")
	}
	// A detached auto-gc would outlive the lock and race with the next fetch or a directory
	// cleanup; running it in the foreground keeps it under the lock.
	argv = append(argv, "-c", "gc.autoDetach=false", sub)
	argv = append(argv, args...)

	cmd := exec.CommandContext(ctx, "git", argv...)
	cmd.Env = gitEnv()
	cmd.Stdin = stdin
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	// SIGTERM lets git remove its lock files on the way out; after SIGKILL, the default, a stale
	// packed-refs.lock or ref lock would make every later fetch fail.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	// Helpers such as ssh or git-remote-https hold the output pipes and may outlive git.
	cmd.WaitDelay = 10 * time.Second
	return cmd, &stderr
}

// commandError is the error of a git command that failed with err.
func commandError(ctx context.Context, sub string, stderr *bytes.Buffer, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("git %s: %w", sub, ctx.Err())
	}
	gerr := &gitError{sub: sub, stderr: strings.TrimSpace(stderr.String()), code: -1, err: err}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		gerr.code = exit.ExitCode()
	}
	return gerr
}

// gitEnv is the environment for git and the programs it runs (ssh, credential helpers): only
// the variables the operator sets to reach remotes, so no secret of this process (a database URL,
// a token) reaches them and no GIT_ variable points git at another repository or injects
// configuration (an allow-list, since git keeps adding such variables); plus settings that keep
// the user's and the system's git configuration out and make git fail instead of waiting for
// input that will never come.
func gitEnv() []string {
	env := make([]string, 0, 16)
	sshSet := false
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !gitEnvAllowed(name) {
			continue
		}
		// The operator's way to choose keys and known_hosts for ssh remotes.
		sshSet = sshSet || name == "GIT_SSH" || name == "GIT_SSH_COMMAND"
		env = append(env, kv)
	}
	env = append(env,
		"GIT_TERMINAL_PROMPT=0",
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null",
		"LC_ALL=C",
		// The transports ValidateURL accepts; git also applies this to redirects.
		"GIT_ALLOW_PROTOCOL=file:git:http:https:ssh",
	)
	if !sshSet {
		// ssh prompts on the terminal for passwords and unknown host keys, out of
		// GIT_TERMINAL_PROMPT's reach.
		env = append(env, "GIT_SSH_COMMAND=ssh -o BatchMode=yes")
	}
	return env
}

// gitEnvAllowed reports whether git inherits the variable name: the basics (HOME holds ssh's
// keys and known_hosts), the ssh agent, proxies and CA certificates, and git's ssh and
// tracing settings.
func gitEnvAllowed(name string) bool {
	switch name {
	case "PATH", "HOME", "TMPDIR", "TZ", "LANG",
		"SSH_AUTH_SOCK",
		"http_proxy", "https_proxy", "no_proxy", "all_proxy",
		"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
		"SSL_CERT_FILE", "SSL_CERT_DIR",
		"GIT_SSH", "GIT_SSH_COMMAND", "GIT_SSH_VARIANT", "GIT_SSL_CAINFO", "GIT_SSL_CAPATH",
		"GIT_CURL_VERBOSE":
		return true
	}
	return strings.HasPrefix(name, "LC_") || strings.HasPrefix(name, "GIT_TRACE")
}

// redact hides a password in u, for error messages that end up in logs.
func redact(u string) string {
	if p, err := url.Parse(u); err == nil && p.User != nil {
		return p.Redacted()
	}
	return u
}

// authRefusals are what git says when a remote wants credentials it was not given: HTTP's 401
// with prompts off, a refused password or token, ssh refusing the key.
var authRefusals = []string{
	"could not read username",
	"terminal prompts disabled",
	"authentication failed",
	"requested url returned error: 401",
	"requested url returned error: 403",
	"http basic: access denied",
	"permission denied (publickey",
}

// IsAuthError reports whether err is a fetch the remote refused for want of credentials (a
// repository made private since it was recorded public, say), rather than one that failed
// for another reason.
func IsAuthError(err error) bool {
	var ge *gitError
	if !errors.As(err, &ge) {
		return false
	}
	s := strings.ToLower(ge.stderr)
	for _, r := range authRefusals {
		if strings.Contains(s, r) {
			return true
		}
	}
	return false
}
