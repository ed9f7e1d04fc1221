package gitrepo

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Credential is a short-lived, read-only credential for fetching one repository, which a
// frontend mints for one evaluation (forge.Forge.ReadCredential) and hands to the evaluator that
// holds it. It is never stored: whoever holds it uses it for one fetch and forgets it.
type Credential struct {
	// URL is where it fetches from: the https clone URL for a token, the ssh URL for a key.
	URL string `json:"url"`
	// Username and Token are HTTP basic authentication for an https URL (GitHub:
	// x-access-token and an installation token scoped to the one repository, contents: read).
	Username string `json:"username,omitempty"`
	Token    string `json:"token,omitempty"`
	// SSHKey is an OpenSSH private key for an ssh URL (Gitea: the repository's read-only deploy
	// key).
	SSHKey string `json:"ssh_key,omitempty"`
	// Expires is when the forge stops honouring it; zero when it does not say (a deploy key
	// lives as long as its registration).
	Expires time.Time `json:"expires,omitzero"`
	// RevokeURL, if set, is where the holder revokes the token once done with it: an HTTP
	// DELETE authenticated with the token itself (GitHub's DELETE /installation/token).
	RevokeURL string `json:"revoke_url,omitempty"`
}

// Secrets are the strings of c a log or an error message must never show.
func (c Credential) Secrets() []string {
	var out []string
	secrets := []string{c.Token, c.SSHKey}
	if c.Token == "" {
		secrets = append(secrets, c.Username) // a token given as the user name
	}
	for _, s := range secrets {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// String hides the secrets, so that a Credential printed by mistake shows none.
func (c Credential) String() string {
	kind := "none"
	switch {
	case c.Token != "" || c.Username != "":
		kind = "token"
	case c.SSHKey != "":
		kind = "ssh key"
	}
	return fmt.Sprintf("gitrepo.Credential{URL:%s, %s}", c.URL, kind)
}

// GoString is String, for %#v.
func (c Credential) GoString() string { return c.String() }

// gitEnv is what git's environment gets for c, and a cleanup that removes what it wrote
// (a key file) once git is done. knownHosts is where ssh pins the host key it sees first.
func (c Credential) gitEnv(knownHosts string) (env []string, cleanup func(), err error) {
	cleanup = func() {}
	switch {
	case c.Token != "" && c.SSHKey != "":
		return nil, cleanup, errors.New("credential with both a token and a key")
	case c.Token != "" || c.Username != "":
		if !strings.HasPrefix(c.URL, "https://") && !strings.HasPrefix(c.URL, "http://") {
			return nil, cleanup, errors.New("a token is for an http(s) URL")
		}
		// http.<url>.extraHeader: sent to this URL only, from the environment (git 2.31's
		// GIT_CONFIG_COUNT), never written to any configuration file. git redacts it in its
		// traces.
		basic := base64.StdEncoding.EncodeToString([]byte(c.Username + ":" + c.Token))
		return []string{
			"GIT_CONFIG_COUNT=1",
			"GIT_CONFIG_KEY_0=http." + c.URL + ".extraHeader",
			"GIT_CONFIG_VALUE_0=Authorization: Basic " + basic,
		}, cleanup, nil
	case c.SSHKey != "":
		dir, err := os.MkdirTemp("", "hci-fetch-key-")
		if err != nil {
			return nil, cleanup, err
		}
		cleanup = func() { _ = os.RemoveAll(dir) }
		key := filepath.Join(dir, "key")
		if err := os.WriteFile(key, []byte(c.SSHKey), 0o600); err != nil {
			cleanup()
			return nil, func() {}, err
		}
		// No agent, no other identity, no user configuration: only this key, and only the host
		// key pinned for this mirror (the first one seen is pinned).
		ssh := "ssh -F /dev/null -o BatchMode=yes -o IdentitiesOnly=yes -o IdentityAgent=none" +
			" -o StrictHostKeyChecking=accept-new -o UserKnownHostsFile=" + shellQuote(knownHosts) +
			" -i " + shellQuote(key)
		return []string{"GIT_SSH_COMMAND=" + ssh, "GIT_SSH_VARIANT=ssh"}, cleanup, nil
	}
	return nil, cleanup, nil
}

// scrub replaces c's secrets in err's message, should git or ssh ever echo one.
func (c Credential) scrub(err error) error {
	msg := err.Error()
	clean := msg
	for _, s := range c.Secrets() {
		clean = strings.ReplaceAll(clean, s, "[redacted]")
	}
	if clean == msg {
		return err
	}
	return errors.New(clean)
}

// shellQuote quotes s for sh, which runs GIT_SSH_COMMAND.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// revokeTimeout bounds a revocation: the token expires by itself anyway.
const revokeTimeout = 10 * time.Second

// Revoke revokes c's token at its RevokeURL (nothing to do without one): a DELETE
// authenticated with the token itself. Errors never show the token.
func (c Credential) Revoke(ctx context.Context, client *http.Client) error {
	if c.RevokeURL == "" || c.Token == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, revokeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, c.RevokeURL, nil)
	if err != nil {
		return fmt.Errorf("revoke token at %s: %w", redact(c.RevokeURL), err)
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	req.Header.Set("Accept", "application/vnd.github+json")
	res, err := client.Do(req)
	if err != nil {
		return c.scrub(fmt.Errorf("revoke token at %s: %w", redact(c.RevokeURL), err))
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 4<<10))
	if res.StatusCode != http.StatusNoContent && res.StatusCode != http.StatusOK {
		return fmt.Errorf("revoke token at %s: %s", redact(c.RevokeURL), res.Status)
	}
	return nil
}
