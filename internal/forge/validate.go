package forge

import (
	"fmt"
	"regexp"
	"strings"
)

var (
	shaRE = regexp.MustCompile(`^[0-9a-f]{40}$`)
	// Logins and repository path segments as Gitea and GitHub allow them: letters, digits, '-',
	// '_' and '.', not starting with '.' or '-'; GitHub Apps add a "[bot]" suffix.
	loginRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}(\[bot\])?$`)
	nameRE  = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$`)
)

func isSHA(s string) bool { return shaRE.MatchString(s) }

func isZeroSHA(s string) bool { return s != "" && strings.Trim(s, "0") == "" }

// ValidateLogin checks a user login from a delivery before it goes into a URL.
func ValidateLogin(login string) error {
	if !loginRE.MatchString(login) {
		return fmt.Errorf("login %q: want letters, digits, '-', '_' or '.'", login)
	}
	return nil
}

// ValidateRepo checks an owner and repository name before they go into a URL or a row.
func ValidateRepo(r Repo) error {
	if !nameRE.MatchString(r.Owner) || !nameRE.MatchString(r.Name) || r.Name == "." || r.Name == ".." {
		return fmt.Errorf("repository %q: want owner/name of letters, digits, '-', '_' or '.'", r.FullName())
	}
	return nil
}

func (r Repository) validate() error {
	if err := ValidateRepo(r.Repo); err != nil {
		return err
	}
	if r.DefaultBranch == "" {
		return fmt.Errorf("repository %s: no default branch", r.FullName())
	}
	if !strings.HasPrefix(r.CloneURL, "https://") && !strings.HasPrefix(r.CloneURL, "http://") {
		return fmt.Errorf("repository %s: clone URL %q is not http(s)", r.FullName(), r.CloneURL)
	}
	return nil
}

func (p PullRequest) validate() error {
	switch {
	case p.Number <= 0:
		return fmt.Errorf("pull request number %d", p.Number)
	case !isSHA(p.HeadSHA):
		return fmt.Errorf("pull request #%d: head %q is not a commit id", p.Number, p.HeadSHA)
	case p.Author != "" && ValidateLogin(p.Author) != nil:
		return fmt.Errorf("pull request #%d: author %q", p.Number, p.Author)
	}
	return nil
}
