// Package githubtest is a stand-in for GitHub's REST API as a GitHub App sees it, for tests: an
// httptest.Server that speaks GitHub's real wire format (paths, JSON shapes, status codes,
// Link pagination, X-RateLimit-* headers, error bodies) over HTTP, with in-memory state the test
// sets up and inspects.
//
// It fakes:
//   - App authentication: RS256 JWTs checked against the App's public key (iss, iat, exp), and
//     installation access tokens (POST /app/installations/{id}/access_tokens) that then
//     authenticate repository calls, scoped to the installation's repositories;
//   - GET /app/installations, GET /repos/{o}/{r}/installation, GET /installation/repositories,
//     DELETE /installation/token (a token revoking itself);
//   - per-user permission levels (admin, maintain, write, triage, read) answered as GitHub
//     answers them: GET /repos/{o}/{r}/collaborators/{u} is 204 for any access, read and triage
//     included, and .../permission names the level; pull requests (and their commits),
//     branches and commit statuses of those repositories;
//   - the user login flow: /login/oauth/authorize, /login/oauth/access_token and GET /user
//     (oauth.go), for a user the test chooses with OAuthAs;
//   - secondary and primary rate-limit answers on demand (RateLimitNext, PrimaryRateLimitNext);
//   - webhook deliveries signed as GitHub signs them (Deliver, WebhookHeader), with payload
//     builders in GitHub's shapes (PushPayload, PullRequestPayload, CommentPayload,
//     InstallationPayload).
//
// Unlike GitHub it requires authentication on every endpoint, also for public repositories.
package githubtest

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"hash/fnv"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// APIVersion is the X-GitHub-Api-Version the stand-in accepts (a request may also omit it).
const APIVersion = "2022-11-28"

// Rate limit an installation token (and the App's JWT) gets per hour, as on github.com.
const rateLimitPerHour = 5000

const docsURL = "https://docs.github.com/rest"

// Repo is a repository the stand-in knows.
type Repo struct {
	FullName      string // "owner/name"
	Private       bool
	DefaultBranch string // "main" if empty
	CloneURL      string // "https://github.com/{FullName}.git" if empty
}

// PR is a pull request of a repository.
type PR struct {
	Number  int
	Title   string // "Pull request #{Number}" if empty
	State   string // "open" if empty
	User    string // the author's login
	HeadSHA string
	HeadRef string
	// HeadRepo is the full name of the repository the head lives in; empty means the base
	// repository itself.
	HeadRepo string
	// HeadRepoDeleted makes head.repo null, as GitHub shows a pull request whose fork is gone.
	HeadRepoDeleted bool
	BaseRef         string // the base repository's default branch if empty
	// Commits are the pull request's commits, oldest first, as GET .../pulls/{n}/commits
	// lists them; empty means HeadSHA alone, committed at PRCreatedAt.
	Commits []Commit
}

// Commit is a commit of a pull request. Date is its committer date: what git records, which
// the pusher chooses, not when it was pushed (GitHub keeps no push times).
type Commit struct {
	SHA  string
	Date time.Time
}

// PRCreatedAt is when every pull request of the stand-in was opened, and the committer date of
// a pull request's head when the test gives no commits.
var PRCreatedAt = time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)

// Status is a commit status as it was created.
type Status struct {
	ID          int64
	State       string
	TargetURL   string
	Description string
	Context     string
	CreatedAt   time.Time
}

// Server is the stand-in. Its exported fields are fixed at New.
type Server struct {
	URL           string // base URL of the API, like https://api.github.com
	AppID         int64
	AppSlug       string // statuses are created by "{AppSlug}[bot]"
	PrivateKeyPEM []byte // the App's private key, PKCS#1 PEM
	WebhookSecret []byte // what Deliver and WebhookHeader sign with
	// The App's OAuth client credentials for the user login flow.
	OAuthClientID     string
	OAuthClientSecret string

	srv *httptest.Server
	pub *rsa.PublicKey

	mu            sync.Mutex
	installations []*installation
	repos         map[string]*repoState // by lower-case full name
	tokens        map[string]*token
	exchanges     int
	requests      []string
	limits        []rateLimit
	used          map[string]int // requests per rate-limit bucket
	reset         time.Time
	nextID        int64
	tokenLifetime time.Duration
	oauthLogin    string                // who approves the next authorizations
	codes         map[string]*oauthCode // authorization codes not exchanged yet
	userTokens    map[string]string     // user access token → login
	userIDs       map[string]int64      // lower-case login → id, where it differs from numericID (users.go)
}

type installation struct {
	id        int64
	repos     []string // lower-case full names, in the order added
	suspended bool
}

type token struct {
	installation int64
	expires      time.Time
	// repos, if not nil, are the lower-case full names the token was scoped to (the request's
	// repositories or repository_ids); nil is every repository of the installation.
	repos []string
	// permissions are what the token may do: the installation's, or the subset asked for.
	permissions map[string]string
	revoked     bool // DELETE /installation/token
}

// live reports whether t may be used: not expired, not revoked.
func (t *token) live() bool { return t != nil && !t.revoked && time.Now().Before(t.expires) }

// installationPermissions are what the App's installations are granted; a token asks for these
// or fewer.
var installationPermissions = map[string]string{"metadata": "read", "contents": "read", "statuses": "write", "pull_requests": "read"}

// permits reports whether t grants permission at level ("read" or "write"); write implies read.
func (t *token) permits(permission, level string) bool {
	got := t.permissions[permission]
	return got == "write" || (got == "read" && level == "read")
}

// covers reports whether t may see the repository of lower-case full name k.
func (t *token) covers(k string) bool {
	return t.repos == nil || slices.Contains(t.repos, k)
}

type repoState struct {
	Repo
	installation int64
	pulls        map[int]PR
	branches     map[string]string
	statuses     map[string][]Status // by sha
	permissions  map[string]string   // lower-case login → role (AddCollaborator, SetPermission)
	// gitDir is the repository ServeGit serves ("": none); gitServed and gitRefused count
	// fetches (git.go).
	gitDir                string
	gitServed, gitRefused int
}

// rateLimit is one queued rate-limit answer: secondary (retryAfter) or primary (reset).
type rateLimit struct {
	retryAfter time.Duration
	reset      time.Time
}

var (
	keyOnce sync.Once
	key     *rsa.PrivateKey
	keyPEM  []byte
	appIDs  atomic.Int64
)

// appKey is one RSA key per process: generating a 2048-bit key takes long enough to matter
// when every test starts a server.
func appKey() (*rsa.PrivateKey, []byte) {
	keyOnce.Do(func() {
		var err error
		if key, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(fmt.Sprintf("githubtest: generate RSA key: %v", err))
		}
		keyPEM = pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	})
	return key, keyPEM
}

// New starts a stand-in with no installations; it is closed when tb's test ends.
func New(tb testing.TB) *Server {
	tb.Helper()
	k, pemBytes := appKey()
	secret := make([]byte, 20)
	rand.Read(secret)
	id := 100000 + appIDs.Add(1)
	s := &Server{
		AppID:         id,
		AppSlug:       "harmonia-ci-test",
		PrivateKeyPEM: pemBytes,
		WebhookSecret: []byte(hex.EncodeToString(secret)),
		pub:           &k.PublicKey,
		repos:         map[string]*repoState{},
		tokens:        map[string]*token{},
		used:          map[string]int{},
		reset:         time.Now().Add(time.Hour).Truncate(time.Second),
		nextID:        1000,
		tokenLifetime: time.Hour,
		codes:         map[string]*oauthCode{},
		userTokens:    map[string]string{},
	}
	client := make([]byte, 28)
	rand.Read(client)
	s.OAuthClientID = "Iv1." + hex.EncodeToString(client[:8])
	s.OAuthClientSecret = hex.EncodeToString(client[8:])

	s.srv = httptest.NewServer(s.routes())
	s.URL = s.srv.URL
	tb.Cleanup(s.srv.Close)
	return s
}

// Close stops the server (New already arranges it at the end of the test).
func (s *Server) Close() { s.srv.Close() }

// AddInstallation installs the App with access to repos (adding them to an installation that
// exists). A repository belongs to one installation.
func (s *Server) AddInstallation(id int64, repos ...Repo) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var inst *installation
	for _, in := range s.installations {
		if in.id == id {
			inst = in
		}
	}
	if inst == nil {
		inst = &installation{id: id}
		s.installations = append(s.installations, inst)
	}
	for _, r := range repos {
		r.DefaultBranch = cmpOr(r.DefaultBranch, "main")
		k := strings.ToLower(r.FullName)
		if old := s.repos[k]; old != nil {
			panic(fmt.Sprintf("githubtest: repository %s added twice", r.FullName))
		}
		s.repos[k] = &repoState{Repo: r, installation: id, permissions: map[string]string{},
			pulls: map[int]PR{}, branches: map[string]string{}, statuses: map[string][]Status{}}
		inst.repos = append(inst.repos, k)
	}
}

// SuspendInstallation suspends an installation: it stays listed, with suspended_at set, and
// GitHub refuses to create tokens for it.
func (s *Server) SuspendInstallation(id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, in := range s.installations {
		if in.id == id {
			in.suspended = true
		}
	}
}

func (s *Server) repo(fullName string) *repoState {
	r := s.repos[strings.ToLower(fullName)]
	if r == nil {
		panic(fmt.Sprintf("githubtest: no repository %s (AddInstallation first)", fullName))
	}
	return r
}

// AddCollaborator gives login push access to the repository (GitHub's "write" role); see
// SetPermission for the other roles.
func (s *Server) AddCollaborator(fullName, login string) {
	s.SetPermission(fullName, login, "write")
}

// SetPullRequest creates or replaces a pull request of the repository.
func (s *Server) SetPullRequest(fullName string, pr PR) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.repo(fullName).pulls[pr.Number] = pr
}

// SetBranch points branch at sha.
func (s *Server) SetBranch(fullName, branch, sha string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.repo(fullName).branches[branch] = sha
}

// Statuses returns the statuses created on sha, oldest first.
func (s *Server) Statuses(fullName, sha string) []Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.repo(fullName).statuses[sha])
}

// RateLimitNext makes the next n API calls answer 403 with GitHub's secondary-rate-limit body and
// Retry-After (whole seconds, rounded up).
func (s *Server) RateLimitNext(n int, retryAfter time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.limits = append(s.limits, rateLimit{retryAfter: retryAfter})
	}
}

// PrimaryRateLimitNext makes the next n API calls answer 403 as an exhausted primary rate limit:
// X-RateLimit-Remaining 0 and X-RateLimit-Reset at reset.
func (s *Server) PrimaryRateLimitNext(n int, reset time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.limits = append(s.limits, rateLimit{reset: reset})
	}
}

// Requests returns "METHOD path" of every request so far, in order (rate-limited ones too).
func (s *Server) Requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// TokenExchanges is how many installation access tokens were created.
func (s *Server) TokenExchanges() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exchanges
}

// SetTokenLifetime sets how long installation tokens created from now on are valid; GitHub's
// is one hour.
func (s *Server) SetTokenLifetime(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokenLifetime = d
}

// LiveReadTokens are the installation tokens still usable that were asked for with contents:
// read alone (read credentials), for tests that check they were revoked after use.
func (s *Server) LiveReadTokens() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for tok, t := range s.tokens {
		if t.live() && t.permissions["contents"] == "read" && t.permissions["statuses"] == "" {
			out = append(out, tok)
		}
	}
	return out
}

// revokeToken is DELETE /installation/token: the token authenticating it stops working (204).
func (s *Server) revokeToken(w http.ResponseWriter, r *http.Request, _ int64) {
	s.mu.Lock()
	if t := s.tokens[credential(r)]; t != nil {
		t.revoked = true
	}
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// ExpireTokens makes every installation token issued so far expired: further use answers 401.
func (s *Server) ExpireTokens() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.tokens {
		t.expires = time.Now().Add(-time.Second)
	}
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /app/installations", s.app(s.listInstallations))
	mux.HandleFunc("POST /app/installations/{id}/access_tokens", s.app(s.createToken))
	mux.HandleFunc("GET /repos/{owner}/{repo}/installation", s.app(s.repoInstallation))
	mux.HandleFunc("GET /installation/repositories", s.installation(s.listRepositories))
	mux.HandleFunc("DELETE /installation/token", s.installation(s.revokeToken))
	mux.HandleFunc("GET /repos/{owner}/{repo}/collaborators/{user}", s.inRepo(s.collaborator))
	mux.HandleFunc("GET /repos/{owner}/{repo}/pulls/{number}", s.inRepo(s.pull))
	mux.HandleFunc("GET /repos/{owner}/{repo}/pulls/{number}/commits", s.inRepo(s.pullCommits))
	mux.HandleFunc("GET /repos/{owner}/{repo}/branches/{branch...}", s.inRepo(s.branch))
	mux.HandleFunc("POST /repos/{owner}/{repo}/statuses/{sha}", s.inRepo(s.needs("statuses", "write", s.createStatus)))
	mux.HandleFunc("GET /repos/{owner}/{repo}/commits/{ref}/statuses", s.inRepo(s.needs("statuses", "read", s.listStatuses)))
	mux.HandleFunc("GET /repos/{owner}/{repo}/statuses/{ref}", s.inRepo(s.needs("statuses", "read", s.listStatuses)))
	s.gitRoutes(mux)
	s.oauthRoutes(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { notFound(w) })
	return s.common(mux)
}

// common logs the request, sets the headers GitHub sets on every answer and serves queued
// rate-limit answers.
func (s *Server) common(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.requests = append(s.requests, r.Method+" "+r.URL.Path)
		var limit *rateLimit
		if len(s.limits) > 0 {
			limit = &s.limits[0]
			s.limits = s.limits[1:]
		}
		bucket, perHour := s.bucket(r)
		s.used[bucket]++
		used := s.used[bucket]
		reset := s.reset
		s.mu.Unlock()

		h := w.Header()
		h.Set("X-GitHub-Request-Id", requestID())
		h.Set("X-GitHub-Media-Type", "github.v3; format=json")
		h.Set("X-GitHub-Api-Version-Selected", APIVersion)
		h.Set("X-RateLimit-Limit", strconv.Itoa(perHour))
		h.Set("X-RateLimit-Remaining", strconv.Itoa(max(perHour-used, 0)))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(reset.Unix(), 10))
		h.Set("X-RateLimit-Used", strconv.Itoa(used))
		h.Set("X-RateLimit-Resource", "core")
		switch {
		case r.UserAgent() == "":
			writeJSON(w, http.StatusForbidden, map[string]string{"message": "Request forbidden by administrative rules. " +
				"Please make sure your request has a User-Agent header (https://docs.github.com/en/rest/overview/resources-in-the-rest-api#user-agent-required). " +
				"Check https://developer.github.com for other possible causes."})
		case r.Header.Get("X-GitHub-Api-Version") != "" && r.Header.Get("X-GitHub-Api-Version") != APIVersion:
			writeError(w, http.StatusBadRequest, fmt.Sprintf("API version %s is not supported.", r.Header.Get("X-GitHub-Api-Version")),
				"https://docs.github.com/rest/overview/api-versions")
		case limit != nil && limit.retryAfter > 0:
			h.Set("Retry-After", strconv.Itoa(int(math.Ceil(limit.retryAfter.Seconds()))))
			writeError(w, http.StatusForbidden, "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. "+
				"If you reach out to GitHub Support for help, please include the request ID "+h.Get("X-GitHub-Request-Id")+".",
				"https://docs.github.com/free-pro-team@latest/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits")
		case limit != nil:
			h.Set("X-RateLimit-Remaining", "0")
			h.Set("X-RateLimit-Used", strconv.Itoa(perHour))
			h.Set("X-RateLimit-Reset", strconv.FormatInt(limit.reset.Unix(), 10))
			writeError(w, http.StatusForbidden, "API rate limit exceeded for "+bucket+".",
				"https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-the-primary-rate-limit")
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// bucket names whose rate limit a request counts against, as GitHub words it in its
// rate-limit message, and that limit's size.
func (s *Server) bucket(r *http.Request) (string, int) {
	cred := credential(r)
	if t := s.tokens[cred]; t != nil {
		return "installation ID " + strconv.FormatInt(t.installation, 10), rateLimitPerHour
	}
	if strings.Count(cred, ".") == 2 {
		return "app ID " + strconv.FormatInt(s.AppID, 10), rateLimitPerHour
	}
	return "anonymous", 60
}

// credential is the token of "Authorization: Bearer X" or "Authorization: token X".
func credential(r *http.Request) string {
	scheme, cred, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	if !strings.EqualFold(scheme, "bearer") && !strings.EqualFold(scheme, "token") {
		return ""
	}
	return strings.TrimSpace(cred)
}

// app requires the App's JWT.
func (s *Server) app(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if msg := s.checkJWT(credential(r), time.Now()); msg != "" {
			writeError(w, http.StatusUnauthorized, msg, docsURL)
			return
		}
		h(w, r)
	}
}

// checkJWT returns GitHub's complaint about an App JWT, "" if it is good.
func (s *Server) checkJWT(raw string, now time.Time) string {
	const undecodable = "A JSON web token could not be decoded"
	if raw == "" {
		return "Requires authentication"
	}
	claims := jwt.MapClaims{}
	p := jwt.NewParser(jwt.WithValidMethods([]string{"RS256"}), jwt.WithoutClaimsValidation())
	if _, err := p.ParseWithClaims(raw, claims, func(*jwt.Token) (any, error) { return s.pub, nil }); err != nil {
		return undecodable
	}
	switch iss := claims["iss"].(type) {
	case float64:
		if int64(iss) != s.AppID {
			return "Integration not found"
		}
	case string:
		if iss != strconv.FormatInt(s.AppID, 10) {
			return "Integration not found"
		}
	default:
		return "'Issuer' claim ('iss') must be an Integer"
	}
	iat, ok1 := claims["iat"].(float64)
	exp, ok2 := claims["exp"].(float64)
	switch {
	case !ok1 || time.Unix(int64(iat), 0).After(now.Add(time.Minute)):
		return "'Issued at' claim ('iat') must be an Integer representing the time that the assertion was issued"
	case !ok2 || !time.Unix(int64(exp), 0).After(now):
		return "'Expiration time' claim ('exp') must be a numeric value representing the future time at which the assertion expires"
	case exp-iat > 600 || time.Unix(int64(exp), 0).After(now.Add(10*time.Minute+time.Minute)):
		return "'Expiration time' claim ('exp') is too far in the future"
	}
	return ""
}

// installation requires an installation token and passes its installation on.
func (s *Server) installation(h func(w http.ResponseWriter, r *http.Request, inst int64)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		cred := credential(r)
		s.mu.Lock()
		t := s.tokens[cred]
		valid := t.live()
		s.mu.Unlock()
		switch {
		case cred == "":
			writeError(w, http.StatusUnauthorized, "Requires authentication", docsURL)
		case !valid:
			writeError(w, http.StatusUnauthorized, "Bad credentials", docsURL)
		default:
			h(w, r, t.installation)
		}
	}
}

// inRepo requires an installation token of the installation that holds {owner}/{repo}; other
// repositories are 404, as GitHub hides what a token cannot see. h runs with s.mu held.
func (s *Server) inRepo(h func(w http.ResponseWriter, r *http.Request, repo *repoState)) http.HandlerFunc {
	return s.installation(func(w http.ResponseWriter, r *http.Request, inst int64) {
		s.mu.Lock()
		defer s.mu.Unlock()
		k := strings.ToLower(r.PathValue("owner") + "/" + r.PathValue("repo"))
		repo := s.repos[k]
		if repo == nil || repo.installation != inst || !s.tokens[credential(r)].covers(k) {
			notFound(w)
			return
		}
		h(w, r, repo)
	})
}

// needs answers 403 as GitHub does unless the request's token grants permission at level.
// It runs inside inRepo (s.mu held, the token valid).
func (s *Server) needs(permission, level string, h func(w http.ResponseWriter, r *http.Request, repo *repoState)) func(w http.ResponseWriter, r *http.Request, repo *repoState) {
	return func(w http.ResponseWriter, r *http.Request, repo *repoState) {
		if !s.tokens[credential(r)].permits(permission, level) {
			writeError(w, http.StatusForbidden, "Resource not accessible by integration", docsURL)
			return
		}
		h(w, r, repo)
	}
}

func (s *Server) installationJSON(in *installation) map[string]any {
	owner := "octo-org"
	if len(in.repos) > 0 {
		owner, _, _ = strings.Cut(s.repos[in.repos[0]].FullName, "/")
	}
	var suspendedAt, suspendedBy any
	if in.suspended {
		suspendedAt, suspendedBy = "2024-02-03T04:05:06Z", userJSON(owner)
	}
	return map[string]any{
		"id":                   in.id,
		"account":              userJSON(owner),
		"app_id":               s.AppID,
		"app_slug":             s.AppSlug,
		"target_id":            numericID(owner),
		"target_type":          "Organization",
		"repository_selection": "selected",
		"access_tokens_url":    fmt.Sprintf("%s/app/installations/%d/access_tokens", s.URL, in.id),
		"repositories_url":     s.URL + "/installation/repositories",
		"html_url":             fmt.Sprintf("https://github.com/organizations/%s/settings/installations/%d", owner, in.id),
		"permissions":          installationPermissions,
		"events":               []string{"push", "pull_request", "issue_comment"},
		"created_at":           "2024-01-02T03:04:05Z",
		"updated_at":           "2024-01-02T03:04:05Z",
		"suspended_at":         suspendedAt,
		"suspended_by":         suspendedBy,
	}
}

func (s *Server) listInstallations(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	lo, hi := s.paginate(w, r, len(s.installations))
	out := []map[string]any{}
	for _, in := range s.installations[lo:hi] {
		out = append(out, s.installationJSON(in))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) repoInstallation(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	repo := s.repos[strings.ToLower(r.PathValue("owner")+"/"+r.PathValue("repo"))]
	if repo == nil {
		notFound(w)
		return
	}
	for _, in := range s.installations {
		if in.id == repo.installation {
			writeJSON(w, http.StatusOK, s.installationJSON(in))
			return
		}
	}
	notFound(w)
}

func (s *Server) createToken(w http.ResponseWriter, r *http.Request) {
	id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
	s.mu.Lock()
	defer s.mu.Unlock()
	i := slices.IndexFunc(s.installations, func(in *installation) bool { return in.id == id })
	if i < 0 {
		notFound(w)
		return
	}
	in := s.installations[i]
	if in.suspended {
		writeError(w, http.StatusForbidden, "This installation has been suspended", docsURL)
		return
	}
	// The body is optional; with it GitHub scopes the token to some of the installation's
	// repositories (by name or id) and some of its permissions.
	var body struct {
		Repositories  []string          `json:"repositories"`
		RepositoryIDs []int64           `json:"repository_ids"`
		Permissions   map[string]string `json:"permissions"`
	}
	if r.ContentLength != 0 {
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			writeError(w, http.StatusBadRequest, "Problems parsing JSON", docsURL)
			return
		}
	}
	t := &token{installation: id, expires: time.Now().Add(s.tokenLifetime).UTC().Truncate(time.Second),
		permissions: installationPermissions}
	if body.Repositories != nil || body.RepositoryIDs != nil {
		t.repos = []string{}
		for _, k := range in.repos {
			_, name, _ := strings.Cut(k, "/")
			if slices.Contains(body.Repositories, name) || slices.Contains(body.RepositoryIDs, numericID(s.repos[k].FullName)) {
				t.repos = append(t.repos, k)
			}
		}
		if len(t.repos) != len(body.Repositories)+len(body.RepositoryIDs) {
			writeError(w, http.StatusUnprocessableEntity, "There is at least one repository that does not exist or is not accessible to the parent installation.", docsURL)
			return
		}
	}
	if body.Permissions != nil {
		t.permissions = map[string]string{}
		for p, level := range body.Permissions {
			granted := installationPermissions[p]
			if (level != "read" && level != "write") || granted == "" || (level == "write" && granted != "write") {
				writeError(w, http.StatusUnprocessableEntity, "The permissions requested are not granted to this installation.", docsURL)
				return
			}
			t.permissions[p] = level
		}
		t.permissions["metadata"] = "read" // every token may read metadata
	}
	b := make([]byte, 18)
	rand.Read(b)
	tok := "ghs_" + strings.ToUpper(hex.EncodeToString(b))[:36]
	s.tokens[tok] = t
	s.exchanges++
	out := map[string]any{
		"token":                tok,
		"expires_at":           t.expires.Format(time.RFC3339),
		"permissions":          t.permissions,
		"repository_selection": "selected",
	}
	if t.repos != nil {
		repos := []map[string]any{}
		for _, k := range t.repos {
			repos = append(repos, RepoJSON(s.repos[k].Repo))
		}
		out["repositories"] = repos
	}
	writeJSON(w, http.StatusCreated, out)
}

func (s *Server) listRepositories(w http.ResponseWriter, r *http.Request, inst int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var names []string
	for _, in := range s.installations {
		if in.id == inst {
			names = in.repos
		}
	}
	if t := s.tokens[credential(r)]; t != nil && t.repos != nil {
		names = slices.DeleteFunc(slices.Clone(names), func(k string) bool { return !t.covers(k) })
	}
	lo, hi := s.paginate(w, r, len(names))
	out := []map[string]any{}
	for _, k := range names[lo:hi] {
		out = append(out, RepoJSON(s.repos[k].Repo))
	}
	writeJSON(w, http.StatusOK, map[string]any{"total_count": len(names), "repository_selection": "selected", "repositories": out})
}

// collaborator answers as GitHub does: 204 for anyone with any access to the repository
// (read and triage too, as organisation members get through the base permission), 404 for
// others. It says nothing about write access; .../permission does.
func (s *Server) collaborator(w http.ResponseWriter, r *http.Request, repo *repoState) {
	login := strings.ToLower(r.PathValue("user"))
	owner, _, _ := strings.Cut(strings.ToLower(repo.FullName), "/")
	if perm, ok := repo.permissions[login]; (ok && perm != "none") || login == owner {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	notFound(w)
}

func (s *Server) pull(w http.ResponseWriter, r *http.Request, repo *repoState) {
	n, err := strconv.Atoi(r.PathValue("number"))
	pr, ok := repo.pulls[n]
	if err != nil || !ok {
		notFound(w)
		return
	}
	writeJSON(w, http.StatusOK, PullRequestJSON(repo.Repo, pr))
}

// pullCommitsMax is how many commits GitHub lists of a pull request at most.
const pullCommitsMax = 250

func (s *Server) pullCommits(w http.ResponseWriter, r *http.Request, repo *repoState) {
	n, err := strconv.Atoi(r.PathValue("number"))
	pr, ok := repo.pulls[n]
	if err != nil || !ok {
		notFound(w)
		return
	}
	commits := pr.Commits
	if len(commits) == 0 {
		commits = []Commit{{SHA: pr.HeadSHA, Date: PRCreatedAt}}
	}
	commits = commits[:min(len(commits), pullCommitsMax)]
	lo, hi := s.paginate(w, r, len(commits))
	out := []map[string]any{}
	for i, c := range commits[lo:hi] {
		out = append(out, commitJSON(repo.FullName, c, commits[:lo+i]))
	}
	writeJSON(w, http.StatusOK, out)
}

// commitJSON is a commit as GitHub lists it, its parent the one before it.
func commitJSON(fullName string, c Commit, before []Commit) map[string]any {
	api := "https://api.github.com/repos/" + fullName
	parents := []map[string]any{}
	if len(before) > 0 {
		p := before[len(before)-1].SHA
		parents = append(parents, map[string]any{"sha": p, "url": api + "/commits/" + p})
	}
	who := map[string]any{"name": "Octo Cat", "email": "octocat@example.com", "date": c.Date.UTC().Format(time.RFC3339)}
	return map[string]any{
		"sha":     c.SHA,
		"node_id": "C_" + c.SHA[:min(len(c.SHA), 12)],
		"commit": map[string]any{
			"author":        who,
			"committer":     who,
			"message":       "change",
			"tree":          map[string]any{"sha": strings.Repeat("e", 40), "url": api + "/git/trees/" + strings.Repeat("e", 40)},
			"url":           api + "/git/commits/" + c.SHA,
			"comment_count": 0,
		},
		"url":          api + "/commits/" + c.SHA,
		"html_url":     "https://github.com/" + fullName + "/commit/" + c.SHA,
		"comments_url": api + "/commits/" + c.SHA + "/comments",
		"author":       nil,
		"committer":    nil,
		"parents":      parents,
	}
}

func (s *Server) branch(w http.ResponseWriter, r *http.Request, repo *repoState) {
	name := r.PathValue("branch")
	sha, ok := repo.branches[name]
	if !ok {
		writeError(w, http.StatusNotFound, "Branch not found", "https://docs.github.com/rest/branches/branches#get-a-branch")
		return
	}
	api := s.URL + "/repos/" + repo.FullName
	writeJSON(w, http.StatusOK, map[string]any{
		"name": name,
		"commit": map[string]any{
			"sha":      sha,
			"node_id":  "C_" + sha[:16],
			"url":      api + "/commits/" + sha,
			"html_url": "https://github.com/" + repo.FullName + "/commit/" + sha,
		},
		"_links":         map[string]string{"self": api + "/branches/" + name, "html": "https://github.com/" + repo.FullName + "/tree/" + name},
		"protected":      false,
		"protection_url": api + "/branches/" + name + "/protection",
	})
}

// maxStatuses is GitHub's limit of statuses per sha and context.
const maxStatuses = 1000

func (s *Server) createStatus(w http.ResponseWriter, r *http.Request, repo *repoState) {
	sha := r.PathValue("sha")
	var in struct {
		State       string  `json:"state"`
		TargetURL   *string `json:"target_url"`
		Description *string `json:"description"`
		Context     *string `json:"context"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		writeError(w, http.StatusBadRequest, "Problems parsing JSON", docsURL)
		return
	}
	st := Status{State: in.State, TargetURL: deref(in.TargetURL), Description: deref(in.Description),
		Context: cmpOr(deref(in.Context), "default"), CreatedAt: time.Now().UTC().Truncate(time.Second)}
	n := 0
	for _, old := range repo.statuses[sha] {
		if old.Context == st.Context {
			n++
		}
	}
	switch {
	case !isSHA(sha):
		validationFailed(w, "sha", "No commit found for SHA: "+sha)
	case !slices.Contains([]string{"error", "failure", "pending", "success"}, st.State):
		validationFailed(w, "state", "state is not included in the list")
	case len([]rune(st.Description)) > 140:
		validationFailed(w, "description", "description is too long (maximum is 140 characters)")
	case n >= maxStatuses:
		validationFailed(w, "context", "This SHA and context has reached the maximum number of statuses.")
	default:
		s.nextID++
		st.ID = s.nextID
		repo.statuses[sha] = append(repo.statuses[sha], st)
		w.Header().Set("Location", s.URL+"/repos/"+repo.FullName+"/statuses/"+sha)
		writeJSON(w, http.StatusCreated, s.statusJSON(repo, sha, st))
	}
}

func (s *Server) listStatuses(w http.ResponseWriter, r *http.Request, repo *repoState) {
	sha := r.PathValue("ref")
	if b, ok := repo.branches[sha]; ok {
		sha = b
	}
	all := repo.statuses[sha]
	lo, hi := s.paginate(w, r, len(all))
	out := []map[string]any{}
	for i := lo; i < hi; i++ {
		out = append(out, s.statusJSON(repo, sha, all[len(all)-1-i])) // newest first
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) statusJSON(repo *repoState, sha string, st Status) map[string]any {
	return map[string]any{
		"url":         s.URL + "/repos/" + repo.FullName + "/statuses/" + sha,
		"avatar_url":  "https://avatars.githubusercontent.com/in/" + strconv.FormatInt(s.AppID, 10) + "?v=4",
		"id":          st.ID,
		"node_id":     "SC_" + strconv.FormatInt(st.ID, 10),
		"state":       st.State,
		"description": nilIfEmpty(st.Description),
		"target_url":  nilIfEmpty(st.TargetURL),
		"context":     st.Context,
		"created_at":  st.CreatedAt.Format(time.RFC3339),
		"updated_at":  st.CreatedAt.Format(time.RFC3339),
		"creator":     userJSON(s.AppSlug + "[bot]"),
	}
}

// paginate reads per_page (default 30, at most 100) and page (from 1), sets the Link header as
// GitHub writes it (prev, next, last, first; absolute URLs keeping the other parameters) and
// returns the slice bounds of the page among n items.
func (s *Server) paginate(w http.ResponseWriter, r *http.Request, n int) (lo, hi int) {
	q := r.URL.Query()
	per := 30
	if v, err := strconv.Atoi(q.Get("per_page")); err == nil && v > 0 {
		per = min(v, 100)
	}
	page := 1
	if v, err := strconv.Atoi(q.Get("page")); err == nil && v > 0 {
		page = v
	}
	last := max((n+per-1)/per, 1)
	var links []string
	link := func(p int, rel string) {
		links = append(links, fmt.Sprintf(`<%s>; rel="%s"`, s.pageURL(r, p), rel))
	}
	if page > 1 {
		link(min(page-1, last), "prev")
	}
	if page < last {
		link(page+1, "next")
		link(last, "last")
	}
	if page > 1 {
		link(1, "first")
	}
	if links != nil {
		w.Header().Set("Link", strings.Join(links, ", "))
	}
	lo = min((page-1)*per, n)
	return lo, min(lo+per, n)
}

// pageURL is the request's URL with page set to p, other parameters kept in their order.
func (s *Server) pageURL(r *http.Request, p int) string {
	var params []string
	for kv := range strings.SplitSeq(r.URL.RawQuery, "&") {
		if kv != "" && !strings.HasPrefix(kv, "page=") {
			params = append(params, kv)
		}
	}
	params = append(params, "page="+strconv.Itoa(p))
	return s.URL + r.URL.EscapedPath() + "?" + strings.Join(params, "&")
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// writeError writes GitHub's error body.
func writeError(w http.ResponseWriter, code int, msg, doc string) {
	writeJSON(w, code, map[string]string{"message": msg, "documentation_url": doc, "status": strconv.Itoa(code)})
}

func notFound(w http.ResponseWriter) {
	writeError(w, http.StatusNotFound, "Not Found", docsURL)
}

func validationFailed(w http.ResponseWriter, field, msg string) {
	writeJSON(w, http.StatusUnprocessableEntity, map[string]any{
		"message":           "Validation Failed",
		"errors":            []map[string]string{{"resource": "Status", "code": "custom", "field": field, "message": msg}},
		"documentation_url": "https://docs.github.com/rest/commits/statuses#create-a-commit-status",
		"status":            "422",
	})
}

func requestID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return strings.ToUpper(hex.EncodeToString(b[:2]) + ":" + hex.EncodeToString(b[2:5]) + ":" + hex.EncodeToString(b[5:]))
}

func isSHA(s string) bool {
	if len(s) != 40 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

// numericID is a stable made-up id for a name, so the same user or repository has the same id
// in every payload.
func numericID(name string) int64 {
	h := fnv.New32a()
	h.Write([]byte(strings.ToLower(name)))
	return int64(h.Sum32()%90000000) + 1000000
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
