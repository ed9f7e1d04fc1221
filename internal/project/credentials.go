package project

import (
	"errors"
	"net/url"
	"strings"
)

// ErrCredentialsInURL is returned for a repository URL that carries a credential
// (https://user:token@host/…): it would be stored in the database, shown to every reader of the
// dashboard and API, and handed to every evaluator. A private repository is reached through its
// forge ([[forges]] and harmonia-ci project enable), whose evaluations fetch it with a
// credential issued per evaluation, or over ssh:// with a key the evaluator nodes hold.
var ErrCredentialsInURL = errors.New("the repository URL carries a credential, which harmonia-ci does not store: " +
	"add the repository through its forge ([[forges]], then harmonia-ci project enable), whose evaluations fetch private " +
	"repositories with a credential issued per evaluation, or use an ssh:// URL with a key the evaluator nodes hold")

// redacted stands for a credential in a URL shown to anyone.
const redacted = "REDACTED"

// hasCredentials reports whether u, a URL, carries a credential: a password, or a user name
// over http(s), where a forge takes a token as the user name. An ssh user name (git@host) is
// no secret.
func hasCredentials(u string) bool {
	p, ok := parseURLWithUser(u)
	if !ok {
		return false
	}
	if _, set := p.User.Password(); set {
		return true
	}
	s := strings.ToLower(p.Scheme)
	return (s == "http" || s == "https") && p.User.Username() != ""
}

// parseURLWithUser parses u as a URL with a user part; false for anything else (a local path,
// scp-like syntax, a URL without one).
func parseURLWithUser(u string) (*url.URL, bool) {
	if !strings.Contains(u, "://") {
		return nil, false
	}
	p, err := url.Parse(u)
	if err != nil || p.User == nil {
		return nil, false
	}
	return p, true
}

// RedactURL is u as it may be shown to anyone: a credential in it (see hasCredentials) is
// replaced with REDACTED. Anything that is not such a URL (owner/name, a path, an ssh URL's
// user) is returned as it is. Rows recorded before credentials were refused are shown through
// it.
func RedactURL(u string) string {
	if !hasCredentials(u) {
		if strings.Contains(u, "://") && strings.Contains(u, "@") {
			if _, err := url.Parse(u); err != nil {
				return redacted // unparsable, and may hide one
			}
		}
		return u
	}
	p, _ := parseURLWithUser(u)
	p.User = url.User(redacted)
	return p.String()
}

// Redacted is p as it may be shown: its repository URL and name (the URL, for a repository
// added by URL) without credentials.
func (p Project) Redacted() Project {
	p.RepoURL, p.FullName = RedactURL(p.RepoURL), RedactURL(p.FullName)
	return p
}

// Redacted is r as it may be shown: its clone URL and name without credentials.
func (r Repository) Redacted() Repository {
	r.CloneURL, r.FullName = RedactURL(r.CloneURL), RedactURL(r.FullName)
	return r
}
