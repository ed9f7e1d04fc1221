package webui

import (
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
)

// harmonia-ci login: the command line listens on a loopback port and opens the browser on
// GET /ci/tokens/cli?callback=http://127.0.0.1:PORT/...&state=S&name=N. The user, logged in,
// confirms; the POST mints a personal API token and answers a page whose form POSTs token and
// state to the callback (submitted by a script of our own, or by the user's click), so the
// token never appears in a URL, a log or the browser's history.

// cliTokenDays is how long a command line's token lives.
const cliTokenDays = 90

var cliStateRE = regexp.MustCompile(`^[A-Za-z0-9_-]{16,128}$`)

// CLILogin is the data of the command line's login pages.
type CLILogin struct {
	Callback, State, Name string
	Days                  int
	// Token is set once minted: the page hands it to Callback.
	Token string
}

// cliParams checks the login's parameters, from the query (GET) or the form (POST).
func cliParams(get func(string) string) (CLILogin, error) {
	p := CLILogin{Callback: get("callback"), State: get("state"), Name: strings.TrimSpace(get("name")), Days: cliTokenDays}
	if err := checkCallback(p.Callback); err != nil {
		return p, err
	}
	if !cliStateRE.MatchString(p.State) {
		return p, badRequest("state must be 16 to 128 URL-safe characters (letters, digits, '-', '_')")
	}
	if err := checkName(p.Name); err != nil {
		return p, err
	}
	return p, nil
}

// checkCallback accepts only http://127.0.0.1:PORT/... or http://localhost:PORT/...: the
// token goes to a program on the user's own machine, nowhere else.
func checkCallback(raw string) error {
	if raw == "" {
		return badRequest("callback is required: the command line's http://127.0.0.1:PORT/ address")
	}
	if len(raw) > 2000 {
		return badRequest("callback is too long")
	}
	c, err := url.Parse(raw)
	switch {
	case err != nil:
		return badRequest("callback is not a URL")
	case c.Scheme != "http":
		return badRequest("callback must be an http:// URL on this machine's loopback (127.0.0.1 or localhost), not %q", c.Scheme)
	case c.User != nil:
		return badRequest("callback must not carry a user or password")
	case c.Fragment != "" || c.Opaque != "":
		return badRequest("callback must be a plain http://127.0.0.1:PORT/path URL")
	}
	host, port := c.Hostname(), c.Port()
	if host != "127.0.0.1" && host != "localhost" {
		return badRequest("callback's host must be 127.0.0.1 or localhost, not %q", host)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
		return badRequest("callback must name a numeric port (1-65535)")
	}
	if c.Host != host+":"+port {
		return badRequest("callback's host must be 127.0.0.1:PORT or localhost:PORT")
	}
	return nil
}

// cliLoginPage is GET /ci/tokens/cli: the confirmation (logged in), or off to the login.
func (u *UI) cliLoginPage(w http.ResponseWriter, r *http.Request) (string, Page, error) {
	if _, in := u.session(r); !in {
		if u.auth.sessions != nil && len(u.auth.oauth) > 0 {
			http.Redirect(w, r, "/ci/login?"+url.Values{"next": {r.URL.RequestURI()}}.Encode(), http.StatusFound)
			return "", Page{}, nil
		}
		return "", Page{}, httpapi.Errorf(http.StatusUnauthorized, "log in first: tokens are minted by logged-in users")
	}
	p, err := cliParams(r.URL.Query().Get)
	if err != nil {
		return "", Page{}, err
	}
	return "cli_login", Page{Title: "Log in the command line", Nav: "tokens", Data: p}, nil
}

// cliLoginMint is POST /ci/tokens/cli (callback, state, name, csrf): the token minted, and the
// page that hands it to the callback.
func (u *UI) cliLoginMint(w http.ResponseWriter, r *http.Request) {
	r, who, cancel, err := u.userPost(w, r)
	defer cancel()
	if err != nil {
		u.fail(w, r, err, "/ci/tokens")
		return
	}
	p, err := cliParams(r.PostFormValue)
	if err != nil {
		u.fail(w, r, err, "/ci/tokens")
		return
	}
	m, err := u.mintFor(r.Context(), who, p.Name, p.Days)
	if err != nil {
		u.fail(w, r, err, "/ci/tokens")
		return
	}
	p.Token = m.Token
	u.render(w, http.StatusOK, "cli_login", Page{Title: "Log in the command line", Nav: "tokens", Data: p,
		Scripts: u.scripts, Viewer: u.viewer(r)})
}
