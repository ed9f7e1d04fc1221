// Package session is the web UI's login state: a sessions table (web_sessions) with one row
// per login, a cookie that names the row, signed with HMAC-SHA256 under the [auth] secret, and
// the CSRF token derived from the cookie. A cookie is valid while its signature checks and its
// row exists and has not expired: logging out deletes the row, so a copied cookie stops working
// then, and rotating the secret logs everyone out.
//
// Who is logged in is the forge's numeric user id (Session.UserID), never the login: a login
// can be renamed and then taken by someone else.
//
// A cookie value is base64url(JSON {id, forge, uid, login, expires}) "." base64url(mac), where
// mac is HMAC-SHA256(secret, purpose NUL payload); the purpose keeps a value signed for one use
// (the OAuth state cookie) from being accepted for another (the session).
package session

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
)

// CookieName holds the session where the UI is served over plain HTTP (a UI tried out on
// http://localhost); over HTTPS the cookie is HostCookieName.
const CookieName = "harmonia_session"

// HostPrefix is the prefix of every cookie name where the UI is served over HTTPS: the browser
// then accepts the cookie only with Secure, Path=/ and no Domain, so no sibling host or plain
// HTTP page can set or shadow it.
const HostPrefix = "__Host-"

// HostCookieName is CookieName over HTTPS.
const HostCookieName = HostPrefix + CookieName

// Lifetime is how long a login lasts.
const Lifetime = 24 * time.Hour

// MinSecret is the shortest secret New accepts.
const MinSecret = 32

// CSRFField is the form field, and CSRFHeader the header, that carry the CSRF token.
const (
	CSRFField  = "csrf"
	CSRFHeader = "X-CSRF-Token"
)

// Purposes a value is signed for.
const (
	purposeSession = "session"
	purposeCSRF    = "csrf"
)

// ErrInvalid is a cookie value that is malformed, tampered with, signed with another secret, or
// expired: treat it as absent.
var ErrInvalid = errors.New("invalid or expired signed value")

// Session is who is logged in.
type Session struct {
	// ID names the session's row; random per login, so two logins of one user differ (and so
	// do their CSRF tokens).
	ID    string `json:"id"`
	Forge string `json:"forge"` // the [[forges]] name the login came from
	// UserID is the forge's numeric id of the user: what permissions compare.
	UserID int64 `json:"uid"`
	// Login is the user's login when they logged in: for display, and for the forge's
	// permission API, which takes logins.
	Login   string    `json:"login"`
	Expires time.Time `json:"expires"`
}

// Config configures a Manager.
type Config struct {
	// Secret signs the cookies: at least MinSecret bytes.
	Secret []byte
	// DB holds the sessions (web_sessions).
	DB db.DBTX
	// TrustedOrigins are origins besides the request's own host that may POST (the public URL
	// behind a proxy that rewrites Host), as "https://ci.example.com".
	TrustedOrigins []string
	// HTTPS says the UI is served over HTTPS (frontend.public_url is https): every cookie is
	// then Secure, Path=/ and named with HostPrefix.
	HTTPS bool
}

// Manager signs and checks cookies with one secret, and keeps the sessions in the database.
type Manager struct {
	secret  []byte
	db      db.DBTX
	https   bool
	now     func() time.Time
	origins *http.CrossOriginProtection
}

// New returns a Manager for cfg.
func New(cfg Config) (*Manager, error) {
	if len(cfg.Secret) < MinSecret {
		return nil, fmt.Errorf("session secret: %d bytes, want at least %d", len(cfg.Secret), MinSecret)
	}
	if cfg.DB == nil {
		return nil, errors.New("session: no database")
	}
	cop := http.NewCrossOriginProtection()
	for _, o := range cfg.TrustedOrigins {
		if err := cop.AddTrustedOrigin(o); err != nil {
			return nil, fmt.Errorf("session: trusted origin: %w", err)
		}
	}
	return &Manager{secret: append([]byte(nil), cfg.Secret...), db: cfg.DB, https: cfg.HTTPS, now: time.Now, origins: cop}, nil
}

// HTTPS reports whether cookies are __Host- prefixed (Config.HTTPS).
func (m *Manager) HTTPS() bool { return m.https }

// Name is the name a cookie called base has: HostPrefix+base over HTTPS, base otherwise.
func (m *Manager) Name(base string) string {
	if m.https {
		return HostPrefix + base
	}
	return base
}

func (m *Manager) mac(purpose string, payload []byte) []byte {
	h := hmac.New(sha256.New, m.secret)
	h.Write([]byte(purpose))
	h.Write([]byte{0})
	h.Write(payload)
	return h.Sum(nil)
}

var b64 = base64.RawURLEncoding

// Sign encodes v as JSON and signs it for purpose.
func (m *Manager) Sign(purpose string, v any) (string, error) {
	payload, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("sign %s: %w", purpose, err)
	}
	return b64.EncodeToString(payload) + "." + b64.EncodeToString(m.mac(purpose, payload)), nil
}

// Verify checks value's signature for purpose in constant time and decodes it into v. Any
// failure is ErrInvalid.
func (m *Manager) Verify(purpose, value string, v any) error {
	p, s, ok := strings.Cut(value, ".")
	if !ok {
		return ErrInvalid
	}
	payload, err1 := b64.DecodeString(p)
	sig, err2 := b64.DecodeString(s)
	if err1 != nil || err2 != nil {
		return ErrInvalid
	}
	if subtle.ConstantTimeCompare(sig, m.mac(purpose, payload)) != 1 {
		return ErrInvalid
	}
	if err := json.Unmarshal(payload, v); err != nil {
		return ErrInvalid
	}
	return nil
}

// Encode signs s as a cookie value.
func (m *Manager) Encode(s Session) (string, error) {
	s.Expires = s.Expires.UTC().Truncate(time.Second)
	return m.Sign(purposeSession, s)
}

// Decode checks a cookie value's signature and contents, not its row: ErrInvalid if it is
// malformed, not signed with this secret, incomplete or expired.
func (m *Manager) Decode(value string) (Session, error) {
	var s Session
	if err := m.Verify(purposeSession, value, &s); err != nil {
		return Session{}, err
	}
	if s.ID == "" || s.Forge == "" || s.UserID <= 0 || s.Login == "" || !m.now().Before(s.Expires) {
		return Session{}, ErrInvalid
	}
	return s, nil
}

// Login records a session for the forge's user (its id, and its login for display), valid
// for Lifetime, and sets its cookie. Expired sessions are deleted on the way.
func (m *Manager) Login(ctx context.Context, w http.ResponseWriter, r *http.Request, forge string, userID int64, login string) (Session, error) {
	if forge == "" || userID <= 0 || login == "" {
		return Session{}, fmt.Errorf("login: forge %q, user %d, login %q: incomplete", forge, userID, login)
	}
	s := Session{ID: Random(24), Forge: forge, UserID: userID, Login: login}
	if err := m.db.QueryRow(ctx, sqlSessionCreate, s.ID, forge, userID, login, Lifetime.Seconds()).Scan(&s.Expires); err != nil {
		return Session{}, fmt.Errorf("login: record the session: %w", err)
	}
	v, err := m.Encode(s)
	if err != nil {
		return Session{}, err
	}
	http.SetCookie(w, m.Cookie(r, m.Name(CookieName), v, s.Expires))
	return s, nil
}

// Logout deletes the request's session, if it has a valid one (a copied cookie is refused
// from then on), and clears the cookie.
func (m *Manager) Logout(ctx context.Context, w http.ResponseWriter, r *http.Request) error {
	c := m.Cookie(r, m.Name(CookieName), "", time.Time{})
	c.MaxAge = -1
	http.SetCookie(w, c)
	s, ok := m.cookieSession(r)
	if !ok {
		return nil
	}
	if _, err := m.db.Exec(ctx, sqlSessionDelete, s.ID); err != nil {
		return fmt.Errorf("logout: delete the session: %w", err)
	}
	return nil
}

// cookieSession is the request's session cookie, decoded but not checked against its row.
func (m *Manager) cookieSession(r *http.Request) (Session, bool) {
	c, err := r.Cookie(m.Name(CookieName))
	if err != nil {
		return Session{}, false
	}
	s, err := m.Decode(c.Value)
	return s, err == nil
}

// Get returns the request's session; ok is false when there is none, it is invalid, or its row
// is gone (logged out, expired). err is a database failure (ok is false then too).
func (m *Manager) Get(r *http.Request) (s Session, ok bool, err error) {
	s, ok = m.cookieSession(r)
	if !ok {
		return Session{}, false, nil
	}
	var live bool
	err = m.db.QueryRow(r.Context(), sqlSessionLive, s.ID, s.Forge, s.UserID).Scan(&live)
	if errors.Is(err, pgx.ErrNoRows) {
		return Session{}, false, nil
	}
	if err != nil {
		return Session{}, false, fmt.Errorf("session: %w", err)
	}
	return s, live, nil
}

// Cookie is a cookie with the attributes every cookie of the UI has: Path /, HttpOnly,
// SameSite=Lax, and Secure over HTTPS or unless the request came over plain HTTP to a loopback
// host. Path / and not /ci/: the actions are POSTs to /api/.... name is the full name (Name).
func (m *Manager) Cookie(r *http.Request, name, value string, expires time.Time) *http.Cookie {
	c := &http.Cookie{Name: name, Value: value, Path: "/", HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: m.https || Secure(r)}
	if !expires.IsZero() {
		c.Expires = expires
		c.MaxAge = max(int(expires.Sub(m.now()).Seconds()), 1)
	}
	return c
}

// Secure reports whether cookies set in answer to r get the Secure attribute: always, except
// for a plain-HTTP request to localhost or a loopback address (a UI tried out on the machine
// itself). A request over TLS, or that a proxy says arrived over HTTPS (X-Forwarded-Proto), is
// always Secure.
func Secure(r *http.Request) bool {
	if r.TLS != nil || strings.EqualFold(strings.TrimSpace(firstValue(r.Header.Get("X-Forwarded-Proto"))), "https") {
		return true
	}
	return !IsLoopbackHost(r.Host)
}

// IsLoopbackHost reports whether a Host header names this machine: localhost, a name under
// .localhost, or a loopback address.
func IsLoopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if strings.EqualFold(host, "localhost") || strings.HasSuffix(strings.ToLower(host), ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func firstValue(s string) string {
	v, _, _ := strings.Cut(s, ",")
	return v
}

// CSRFToken is the CSRF token of a session cookie value: HMAC(secret, "csrf" NUL value). It
// changes with every login and needs no storage of its own.
func (m *Manager) CSRFToken(cookieValue string) string {
	if cookieValue == "" {
		return ""
	}
	return b64.EncodeToString(m.mac(purposeCSRF, []byte(cookieValue)))
}

// RequestCSRFToken is the CSRF token of the request's session cookie, "" without a valid one.
// It checks the cookie, not its row: callers check the session with Get first.
func (m *Manager) RequestCSRFToken(r *http.Request) string {
	c, err := r.Cookie(m.Name(CookieName))
	if err != nil {
		return ""
	}
	if _, err := m.Decode(c.Value); err != nil {
		return ""
	}
	return m.CSRFToken(c.Value)
}

// ErrCSRF is a state-changing request that is cross-origin or lacks the CSRF token.
var ErrCSRF = errors.New("cross-site request refused")

// CheckCSRF checks a state-changing request of a logged-in browser: it must be same-origin by
// Sec-Fetch-Site and Origin when the browser sends them, and carry the session's CSRF token in
// the form field CSRFField or the header CSRFHeader. It reads the form (the caller bounds the
// body first).
func (m *Manager) CheckCSRF(r *http.Request) error {
	if err := m.origins.Check(r); err != nil {
		return fmt.Errorf("%w: %v", ErrCSRF, err)
	}
	if o := r.Header.Get("Origin"); o == "null" {
		return fmt.Errorf("%w: Origin null", ErrCSRF)
	}
	want := m.RequestCSRFToken(r)
	if want == "" {
		return fmt.Errorf("%w: no session", ErrCSRF)
	}
	got := r.Header.Get(CSRFHeader)
	if got == "" {
		got = r.PostFormValue(CSRFField)
	}
	if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
		return fmt.Errorf("%w: missing or wrong CSRF token", ErrCSRF)
	}
	return nil
}

// Random returns n random bytes, base64url-encoded (OAuth state values).
func Random(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return b64.EncodeToString(b)
}
