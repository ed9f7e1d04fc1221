// Package session is the web UI's login state: a cookie that says who is logged in, signed with
// HMAC-SHA256 under the [auth] secret, and the CSRF token derived from it. There is no session
// table: a cookie is valid until it expires or the secret changes, so rotating the secret logs
// everyone out.
//
// A cookie value is base64url(JSON {forge, login, expires}) "." base64url(mac), where mac is
// HMAC-SHA256(secret, purpose NUL payload); the purpose keeps a value signed for one use (the
// OAuth state cookie) from being accepted for another (the session).
package session

import (
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
)

// Cookie names.
const (
	// CookieName holds the session. It is not __Host- prefixed: that prefix demands Secure,
	// and a UI on http://localhost must work too.
	CookieName = "harmonia_session"
)

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
	Forge   string    `json:"forge"` // the [[forges]] name the login came from
	Login   string    `json:"login"`
	Expires time.Time `json:"expires"`
	// Nonce is random per login, so two logins of one user in one second still differ (and
	// so do their CSRF tokens).
	Nonce string `json:"nonce,omitempty"`
}

// Manager signs and checks cookies with one secret.
type Manager struct {
	secret  []byte
	now     func() time.Time
	origins *http.CrossOriginProtection
}

// New returns a Manager for secret (at least MinSecret bytes). trustedOrigins are origins
// besides the request's own host that may POST (the public URL behind a proxy that rewrites
// Host), as "https://ci.example.com".
func New(secret []byte, trustedOrigins ...string) (*Manager, error) {
	if len(secret) < MinSecret {
		return nil, fmt.Errorf("session secret: %d bytes, want at least %d", len(secret), MinSecret)
	}
	cop := http.NewCrossOriginProtection()
	for _, o := range trustedOrigins {
		if err := cop.AddTrustedOrigin(o); err != nil {
			return nil, fmt.Errorf("session: trusted origin: %w", err)
		}
	}
	return &Manager{secret: append([]byte(nil), secret...), now: time.Now, origins: cop}, nil
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

// Decode checks a cookie value: ErrInvalid if it is malformed, not signed with this secret,
// incomplete or expired.
func (m *Manager) Decode(value string) (Session, error) {
	var s Session
	if err := m.Verify(purposeSession, value, &s); err != nil {
		return Session{}, err
	}
	if s.Forge == "" || s.Login == "" || !m.now().Before(s.Expires) {
		return Session{}, ErrInvalid
	}
	return s, nil
}

// Login sets the session cookie for login on forge, valid for Lifetime.
func (m *Manager) Login(w http.ResponseWriter, r *http.Request, forge, login string) (Session, error) {
	s := Session{Forge: forge, Login: login, Expires: m.now().Add(Lifetime), Nonce: Random(12)}
	v, err := m.Encode(s)
	if err != nil {
		return Session{}, err
	}
	http.SetCookie(w, m.Cookie(r, CookieName, v, s.Expires))
	return s, nil
}

// Logout clears the session cookie.
func (m *Manager) Logout(w http.ResponseWriter, r *http.Request) {
	c := m.Cookie(r, CookieName, "", time.Time{})
	c.MaxAge = -1
	http.SetCookie(w, c)
}

// Get returns the request's session; ok is false when there is none or it is invalid.
func (m *Manager) Get(r *http.Request) (s Session, ok bool) {
	c, err := r.Cookie(CookieName)
	if err != nil {
		return Session{}, false
	}
	s, err = m.Decode(c.Value)
	return s, err == nil
}

// Cookie is a cookie with the attributes every cookie of the UI has: Path /, HttpOnly,
// SameSite=Lax, and Secure unless the request came over plain HTTP to a loopback host.
// Path / and not /ci/: the actions are POSTs to /api/....
func (m *Manager) Cookie(r *http.Request, name, value string, expires time.Time) *http.Cookie {
	c := &http.Cookie{Name: name, Value: value, Path: "/", HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: Secure(r)}
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
// changes with every login and needs no storage.
func (m *Manager) CSRFToken(cookieValue string) string {
	if cookieValue == "" {
		return ""
	}
	return b64.EncodeToString(m.mac(purposeCSRF, []byte(cookieValue)))
}

// RequestCSRFToken is the CSRF token of the request's session cookie, "" without a valid one.
func (m *Manager) RequestCSRFToken(r *http.Request) string {
	c, err := r.Cookie(CookieName)
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
