package githubtest

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// GitHub's user login flow (the web application flow of OAuth Apps and GitHub Apps) and the
// user endpoints behind it. On github.com the first two live on the web host and /user on the
// API host; the stand-in serves all three at URL.
//
//   - GET /login/oauth/authorize?client_id&redirect_uri&state: where GitHub would show its
//     consent page, the stand-in redirects at once to redirect_uri with a code for the user
//     OAuthAs chose (or error=access_denied when none is chosen), and state;
//   - POST /login/oauth/access_token (form or JSON; answered in JSON with Accept:
//     application/json, else form-encoded as GitHub does): a code once for a user token, with
//     GitHub's error answers (200 with "error") for a bad code, client or redirect_uri;
//   - GET /user with the user token.

// codeLifetime is how long an authorization code can be exchanged, as on GitHub.
const codeLifetime = 10 * time.Minute

type oauthCode struct {
	login, redirectURI string
	expires            time.Time
}

// OAuthAs makes the next authorizations log in as login, as if that user had approved the
// App on GitHub's consent page; "" makes them deny it.
func (s *Server) OAuthAs(login string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.oauthLogin = login
}

// SetPermission gives login a role on the repository: "admin", "maintain", "write", "triage",
// "read" (a collaborator, or an organisation member through the base permission) or "none".
// Users without one: the owner is admin, everyone else has read on a public repository and
// none on a private one, and is no collaborator.
func (s *Server) SetPermission(fullName, login, permission string) {
	switch permission {
	case "admin", "maintain", "write", "triage", "read", "none":
	default:
		panic(fmt.Sprintf("githubtest: permission %q is not a GitHub role", permission))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.repo(fullName).permissions[strings.ToLower(login)] = permission
}

// UserTokens is how many user access tokens were issued.
func (s *Server) UserTokens() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.userTokens)
}

func (s *Server) oauthRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /login/oauth/authorize", s.authorize)
	mux.HandleFunc("POST /login/oauth/access_token", s.accessToken)
	mux.HandleFunc("GET /user", s.user)
	mux.HandleFunc("GET /users/{login}", s.installation(s.userByLogin))
	mux.HandleFunc("GET /repos/{owner}/{repo}/collaborators/{user}/permission", s.inRepo(s.permission))
}

func (s *Server) authorize(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Get("client_id") != s.OAuthClientID {
		http.Error(w, "404 page not found", http.StatusNotFound) // GitHub's answer is an HTML 404 page
		return
	}
	redirect, err := url.Parse(q.Get("redirect_uri"))
	if err != nil || (redirect.Scheme != "http" && redirect.Scheme != "https") || redirect.Host == "" {
		http.Error(w, "The redirect_uri is not valid", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	login := s.oauthLogin
	back := redirect.Query()
	if login == "" {
		back.Set("error", "access_denied")
		back.Set("error_description", "The user has denied your application access.")
		back.Set("error_uri", "https://docs.github.com/apps/troubleshooting-authorization-request-errors/#access-denied")
	} else {
		b := make([]byte, 10)
		rand.Read(b)
		code := hex.EncodeToString(b)
		s.codes[code] = &oauthCode{login: login, redirectURI: q.Get("redirect_uri"), expires: time.Now().Add(codeLifetime)}
		back.Set("code", code)
	}
	s.mu.Unlock()
	if st := q.Get("state"); st != "" {
		back.Set("state", st)
	}
	redirect.RawQuery = back.Encode()
	http.Redirect(w, r, redirect.String(), http.StatusFound)
}

func (s *Server) accessToken(w http.ResponseWriter, r *http.Request) {
	var in struct {
		ClientID     string `json:"client_id"`
		ClientSecret string `json:"client_secret"`
		Code         string `json:"code"`
		RedirectURI  string `json:"redirect_uri"`
	}
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			writeError(w, http.StatusBadRequest, "Problems parsing JSON", docsURL)
			return
		}
	} else {
		if err := r.ParseForm(); err != nil {
			writeError(w, http.StatusBadRequest, "Problems parsing the form", docsURL)
			return
		}
		in.ClientID, in.ClientSecret = r.PostForm.Get("client_id"), r.PostForm.Get("client_secret")
		in.Code, in.RedirectURI = r.PostForm.Get("code"), r.PostForm.Get("redirect_uri")
	}
	asJSON := strings.Contains(r.Header.Get("Accept"), "json")
	answer := func(v map[string]string) {
		if asJSON {
			writeJSON(w, http.StatusOK, v)
			return
		}
		form := url.Values{}
		for k, x := range v {
			form.Set(k, x)
		}
		w.Header().Set("Content-Type", "application/x-www-form-urlencoded; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		w.Write([]byte(form.Encode()))
	}
	oauthError := func(code, desc, doc string) {
		answer(map[string]string{"error": code, "error_description": desc,
			"error_uri": "https://docs.github.com/apps/managing-oauth-apps/troubleshooting-oauth-app-access-token-request-errors/#" + doc})
	}
	s.mu.Lock()
	c := s.codes[in.Code]
	valid := c != nil && time.Now().Before(c.expires)
	delete(s.codes, in.Code) // a code is good for one exchange, right or wrong
	s.mu.Unlock()
	switch {
	case in.ClientID != s.OAuthClientID || in.ClientSecret != s.OAuthClientSecret:
		oauthError("incorrect_client_credentials", "The client_id and/or client_secret passed are incorrect.", "incorrect-client-credentials")
	case !valid:
		oauthError("bad_verification_code", "The code passed is incorrect or expired.", "bad-verification-code")
	case in.RedirectURI != "" && in.RedirectURI != c.redirectURI:
		oauthError("redirect_uri_mismatch", "The redirect_uri MUST match the registered callback URL for this application.", "redirect-uri-mismatch")
	default:
		b := make([]byte, 18)
		rand.Read(b)
		tok := "ghu_" + strings.ToUpper(hex.EncodeToString(b))[:36]
		s.mu.Lock()
		s.userTokens[tok] = c.login
		s.mu.Unlock()
		answer(map[string]string{"access_token": tok, "token_type": "bearer", "scope": ""})
	}
}

func (s *Server) user(w http.ResponseWriter, r *http.Request) {
	cred := credential(r)
	s.mu.Lock()
	login, ok := s.userTokens[cred]
	s.mu.Unlock()
	switch {
	case cred == "":
		writeError(w, http.StatusUnauthorized, "Requires authentication", "https://docs.github.com/rest/users/users#get-the-authenticated-user")
	case !ok:
		writeError(w, http.StatusUnauthorized, "Bad credentials", docsURL)
	default:
		u := s.userJSON(login)
		u["name"] = nil
		u["created_at"] = "2020-01-02T03:04:05Z"
		writeJSON(w, http.StatusOK, u)
	}
}

func (s *Server) permission(w http.ResponseWriter, r *http.Request, repo *repoState) {
	login := r.PathValue("user")
	key := strings.ToLower(login)
	owner, _, _ := strings.Cut(strings.ToLower(repo.FullName), "/")
	perm, ok := repo.permissions[key]
	switch {
	case ok:
	case key == owner:
		perm = "admin"
	case repo.Private:
		perm = "none"
	default:
		perm = "read"
	}
	// "permission" is the legacy word (maintain shows as write, triage as read); role_name the
	// precise one.
	legacy := map[string]string{"maintain": "write", "triage": "read"}[perm]
	writeJSON(w, http.StatusOK, map[string]any{
		"permission": cmpOr(legacy, perm),
		"role_name":  perm,
		"user":       userJSON(login),
	})
}
