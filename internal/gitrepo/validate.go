package gitrepo

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// maxBranchLen bounds branch names; git allows longer ones, but no sane project needs them and
// they end up in paths, logs and database rows.
const maxBranchLen = 255

// ValidateURL reports whether git may be pointed at u. It accepts absolute local paths, file://,
// http(s)://, ssh:// and git:// URLs, and scp-like [user@]host:path; everything else, notably
// relative paths (git would resolve them against an arbitrary working directory) and remote
// helpers such as ext:: (which run commands), is rejected.
func ValidateURL(u string) error {
	if u == "" {
		return errors.New("empty repository URL")
	}
	// git would parse it as an option.
	if strings.HasPrefix(u, "-") {
		return fmt.Errorf("repository URL %q: must not start with '-'", u)
	}
	if i := strings.IndexFunc(u, isControl); i >= 0 {
		return fmt.Errorf("repository URL %q: contains control character %q", u, u[i])
	}
	if t, _, ok := strings.Cut(u, "::"); ok && isScheme(t) {
		return fmt.Errorf("repository URL %q: remote helper transport %q is not allowed", u, t)
	}
	if scheme, _, ok := strings.Cut(u, "://"); ok && isScheme(scheme) {
		return validateSchemeURL(u, strings.ToLower(scheme))
	}
	if strings.HasPrefix(u, "/") {
		return nil
	}
	// git takes a colon before any slash as scp-like syntax; anything else is a local path.
	hostPart, path, ok := strings.Cut(u, ":")
	if !ok || strings.Contains(hostPart, "/") {
		return fmt.Errorf("repository URL %q: relative path, use an absolute path or a URL", u)
	}
	host := hostPart
	if i := strings.LastIndex(hostPart, "@"); i >= 0 {
		if i == 0 {
			return fmt.Errorf("repository URL %q: empty user", u)
		}
		host = hostPart[i+1:]
	}
	switch {
	case host == "":
		return fmt.Errorf("repository URL %q: empty host", u)
	case strings.HasPrefix(host, "-"):
		// ssh would take it for an option.
		return fmt.Errorf("repository URL %q: host must not start with '-'", u)
	case strings.ContainsAny(host, " []"):
		return fmt.Errorf("repository URL %q: invalid host %q, use ssh:// for IPv6 addresses", u, host)
	case path == "":
		return fmt.Errorf("repository URL %q: empty path", u)
	}
	return nil
}

func validateSchemeURL(u, scheme string) error {
	switch scheme {
	case "file", "http", "https", "ssh", "git":
	default:
		return fmt.Errorf("repository URL %q: unsupported scheme %q", u, scheme)
	}
	p, err := url.Parse(u)
	if err != nil {
		return fmt.Errorf("repository URL: %w", err)
	}
	if scheme == "file" {
		// git ignores a host in file:// URLs, so one is almost certainly a typo for file:///.
		if p.Host != "" {
			return fmt.Errorf("repository URL %q: file URL with host %q, want file:///absolute/path", u, p.Host)
		}
		if p.Path == "" || p.Path == "/" {
			return fmt.Errorf("repository URL %q: empty path", u)
		}
		return nil
	}
	switch {
	case p.Hostname() == "":
		return fmt.Errorf("repository URL %q: empty host", u)
	case strings.HasPrefix(p.Hostname(), "-"):
		return fmt.Errorf("repository URL %q: host must not start with '-'", u)
	case p.User != nil && strings.HasPrefix(p.User.Username(), "-"):
		return fmt.Errorf("repository URL %q: user must not start with '-'", u)
	}
	return nil
}

// isScheme reports whether s has the syntax of a URL scheme (RFC 3986), which is also what git
// accepts as a remote helper name in "<transport>::<address>".
func isScheme(s string) bool {
	if s == "" || !isAlpha(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !isAlpha(c) && !('0' <= c && c <= '9') && c != '+' && c != '-' && c != '.' {
			return false
		}
	}
	return true
}

func isAlpha(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// ValidateBranch reports whether b is a valid branch name by git check-ref-format's rules, so
// that refs/heads/<b> can only ever name that branch.
func ValidateBranch(b string) error {
	switch {
	case b == "":
		return errors.New("empty branch name")
	case len(b) > maxBranchLen:
		return fmt.Errorf("branch name longer than %d bytes", maxBranchLen)
	case b == "@":
		return errors.New(`branch "@": not a valid branch name`)
	case strings.HasPrefix(b, "-"):
		return fmt.Errorf("branch %q: must not start with '-'", b)
	case strings.HasPrefix(b, "/"), strings.HasSuffix(b, "/"):
		return fmt.Errorf("branch %q: must not start or end with '/'", b)
	case strings.HasSuffix(b, "."):
		return fmt.Errorf("branch %q: must not end with '.'", b)
	case strings.Contains(b, ".."):
		return fmt.Errorf("branch %q: must not contain \"..\"", b)
	case strings.Contains(b, "//"):
		return fmt.Errorf("branch %q: must not contain \"//\"", b)
	case strings.Contains(b, "@{"):
		return fmt.Errorf("branch %q: must not contain \"@{\"", b)
	}
	for _, r := range b {
		if isControl(r) || strings.ContainsRune(" ~^:?*[\\", r) {
			return fmt.Errorf("branch %q: must not contain %q", b, r)
		}
	}
	for c := range strings.SplitSeq(b, "/") {
		if strings.HasPrefix(c, ".") {
			return fmt.Errorf("branch %q: component %q starts with '.'", b, c)
		}
		if strings.HasSuffix(c, ".lock") {
			return fmt.Errorf("branch %q: component %q ends with \".lock\"", b, c)
		}
	}
	return nil
}

// validateRev checks that rev is a full or abbreviated object id. git would take anything else as
// a revision expression (HEAD~3, a ref, :/message), none of which a caller should be able to pass.
func validateRev(rev string) error {
	if len(rev) < 4 || len(rev) > 64 {
		return fmt.Errorf("commit %q: want 4 to 64 hex digits", rev)
	}
	for i := 0; i < len(rev); i++ {
		c := rev[i]
		if !('0' <= c && c <= '9') && !('a' <= c && c <= 'f') && !('A' <= c && c <= 'F') {
			return fmt.Errorf("commit %q: not a hex object id", rev)
		}
	}
	return nil
}

// validatePath checks that p is a clean slash-separated path relative to the repository root, the
// only form "<tree>:<path>" reads literally.
func validatePath(p string) error {
	switch {
	case p == "":
		return errors.New("empty file path")
	case strings.HasPrefix(p, "/"):
		return fmt.Errorf("file path %q: must be relative", p)
	case strings.HasPrefix(p, "-"):
		return fmt.Errorf("file path %q: must not start with '-'", p)
	case strings.IndexFunc(p, isControl) >= 0:
		return fmt.Errorf("file path %q: contains a control character", p)
	}
	for c := range strings.SplitSeq(p, "/") {
		switch c {
		case "..":
			return fmt.Errorf("file path %q: must not contain \"..\"", p)
		case "", ".":
			return fmt.Errorf("file path %q: not clean, want e.g. %q", p, "dir/file")
		}
	}
	return nil
}
