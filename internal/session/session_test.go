package session

import (
	"crypto/tls"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

var (
	secret      = []byte("0123456789abcdef0123456789abcdef")
	otherSecret = []byte("fedcba9876543210fedcba9876543210")
)

func newManager(t *testing.T, s []byte, origins ...string) *Manager {
	t.Helper()
	m, err := New(Config{Secret: s, DB: dbtest.NewPool(t), TrustedOrigins: origins})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestNewRefuses(t *testing.T) {
	t.Parallel()
	if _, err := New(Config{Secret: []byte("short"), DB: dbtest.NewPool(t)}); err == nil {
		t.Error("New accepted a 5-byte secret")
	}
	if _, err := New(Config{Secret: secret}); err == nil {
		t.Error("New accepted no database")
	}
}

// login logs alice (gitea user 7) in over req and returns her session and cookie.
func login(t *testing.T, m *Manager, req *http.Request) (Session, *http.Cookie) {
	t.Helper()
	w := httptest.NewRecorder()
	s, err := m.Login(t.Context(), w, req, "gitea", 7, "alice")
	if err != nil {
		t.Fatal(err)
	}
	cs := w.Result().Cookies()
	if len(cs) != 1 {
		t.Fatalf("%d cookies set, want 1", len(cs))
	}
	return s, cs[0]
}

// get is m.Get of a request carrying c.
func get(t *testing.T, m *Manager, c *http.Cookie) (Session, bool) {
	t.Helper()
	r := httptest.NewRequestWithContext(t.Context(), "GET", "http://ci.example.com/ci/", nil)
	r.AddCookie(c)
	s, ok, err := m.Get(r)
	if err != nil {
		t.Fatal(err)
	}
	return s, ok
}

// A cookie copied before logout (from another browser, a proxy's log, a stolen laptop's
// profile) is refused after it: logout deletes the session's row.
func TestCopiedCookieRefusedAfterLogout(t *testing.T) {
	t.Parallel()
	m := newManager(t, secret)
	_, copied := login(t, m, httptest.NewRequest("GET", "http://ci.example.com/", nil))
	_, other := login(t, m, httptest.NewRequest("GET", "http://ci.example.com/", nil)) // alice elsewhere
	if _, ok := get(t, m, copied); !ok {
		t.Fatal("a fresh session is refused")
	}
	w := httptest.NewRecorder()
	r := httptest.NewRequestWithContext(t.Context(), "POST", "http://ci.example.com/ci/logout", nil)
	r.AddCookie(copied)
	if err := m.Logout(t.Context(), w, r); err != nil {
		t.Fatal(err)
	}
	if c := w.Result().Cookies(); len(c) != 1 || c[0].Name != CookieName || c[0].MaxAge >= 0 || c[0].Value != "" {
		t.Errorf("logout cookies %+v, want %s cleared", c, CookieName)
	}
	if s, ok := get(t, m, copied); ok {
		t.Errorf("the copied cookie still works after logout: %+v", s)
	}
	// Logging out ends that session only: alice's login elsewhere stays.
	if _, ok := get(t, m, other); !ok {
		t.Error("logout ended another session of the same user")
	}
}

// Where the UI is served over HTTPS every cookie is __Host- prefixed: Secure, Path=/, no
// Domain, whatever the request looks like; the unprefixed name is not read.
func TestHostPrefixedCookies(t *testing.T) {
	t.Parallel()
	m, err := New(Config{Secret: secret, DB: dbtest.NewPool(t), HTTPS: true})
	if err != nil {
		t.Fatal(err)
	}
	// A plain-HTTP loopback request (a health check, a proxy that does not say) still gets
	// a Secure cookie.
	_, c := login(t, m, httptest.NewRequest("GET", "http://127.0.0.1:8080/ci/", nil))
	if c.Name != HostCookieName || !c.Secure || c.Path != "/" || c.Domain != "" || !c.HttpOnly {
		t.Errorf("cookie %s: Secure %v Path %q Domain %q HttpOnly %v; want %s, Secure, /, no Domain",
			c.Name, c.Secure, c.Path, c.Domain, c.HttpOnly, HostCookieName)
	}
	if got := m.Name("harmonia_oauth"); got != "__Host-harmonia_oauth" {
		t.Errorf("Name(harmonia_oauth) = %q", got)
	}
	if _, ok := get(t, m, c); !ok {
		t.Error("the __Host- cookie is refused")
	}
	plain := *c
	plain.Name = CookieName
	if s, ok := get(t, m, &plain); ok {
		t.Errorf("the unprefixed cookie name is read over HTTPS: %+v", s)
	}
	w := httptest.NewRecorder()
	r := httptest.NewRequestWithContext(t.Context(), "POST", "https://ci.example.com/ci/logout", nil)
	r.AddCookie(c)
	if err := m.Logout(t.Context(), w, r); err != nil {
		t.Fatal(err)
	}
	if cs := w.Result().Cookies(); len(cs) != 1 || cs[0].Name != HostCookieName || !cs[0].Secure || cs[0].Path != "/" {
		t.Errorf("logout cookies %+v, want %s cleared, Secure, Path /", cs, HostCookieName)
	}
	if _, ok := get(t, m, c); ok {
		t.Error("the __Host- cookie works after logout")
	}
}

// A session's row expires with the database's clock, whatever the cookie says.
func TestExpiredRowRefused(t *testing.T) {
	t.Parallel()
	m := newManager(t, secret)
	s, c := login(t, m, httptest.NewRequest("GET", "http://ci.example.com/", nil))
	if _, err := m.db.Exec(t.Context(), `UPDATE web_sessions SET expires_at = now() - interval '1 second' WHERE id = $1`, s.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := get(t, m, c); ok {
		t.Error("a session whose row expired is accepted")
	}
}

func TestEncodeDecode(t *testing.T) {
	t.Parallel()
	m := newManager(t, secret)
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	m.now = func() time.Time { return now }
	want := Session{ID: "x", Forge: "gitea", UserID: 7, Login: "alice", Expires: now.Add(Lifetime)}
	v, err := m.Encode(want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.Decode(v)
	if err != nil {
		t.Fatalf("Decode(Encode(s)): %v", err)
	}
	if got.ID != want.ID || got.Forge != want.Forge || got.UserID != want.UserID || got.Login != want.Login || !got.Expires.Equal(want.Expires) {
		t.Errorf("Decode = %+v, want %+v", got, want)
	}
}

func TestDecodeRefuses(t *testing.T) {
	t.Parallel()
	m := newManager(t, secret)
	now := time.Now()
	m.now = func() time.Time { return now }
	good, err := m.Encode(Session{ID: "x", Forge: "gitea", UserID: 7, Login: "alice", Expires: now.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	payload, mac, _ := strings.Cut(good, ".")
	raw, _ := base64.RawURLEncoding.DecodeString(payload)
	forged := base64.RawURLEncoding.EncodeToString([]byte(strings.Replace(string(raw), "alice", "admin", 1)))
	macBytes, _ := base64.RawURLEncoding.DecodeString(mac)
	macBytes[0] ^= 1
	expired, _ := m.Encode(Session{ID: "x", Forge: "gitea", UserID: 7, Login: "alice", Expires: now.Add(-time.Second)})
	rotated, _ := newManager(t, otherSecret).Encode(Session{ID: "x", Forge: "gitea", UserID: 7, Login: "alice", Expires: now.Add(time.Hour)})
	noLogin, _ := m.Encode(Session{ID: "x", Forge: "gitea", UserID: 7, Expires: now.Add(time.Hour)})
	noUser, _ := m.Encode(Session{ID: "x", Forge: "gitea", Login: "alice", Expires: now.Add(time.Hour)})
	noID, _ := m.Encode(Session{Forge: "gitea", UserID: 7, Login: "alice", Expires: now.Add(time.Hour)})
	// A value signed for another purpose (the OAuth state cookie) is not a session.
	otherPurpose, _ := m.Sign("oauth-state", Session{ID: "x", Forge: "gitea", UserID: 7, Login: "alice", Expires: now.Add(time.Hour)})
	for name, v := range map[string]string{
		"tampered payload":  forged + "." + mac,
		"tampered mac":      payload + "." + base64.RawURLEncoding.EncodeToString(macBytes),
		"truncated mac":     payload + "." + mac[:10],
		"no mac":            payload,
		"empty":             "",
		"not base64":        "!!!.???",
		"expired":           expired,
		"rotated secret":    rotated,
		"incomplete":        noLogin,
		"no user id":        noUser,
		"no session id":     noID,
		"other purpose":     otherPurpose,
		"mac of other user": forged + "." + mac,
	} {
		if s, err := m.Decode(v); err == nil {
			t.Errorf("%s: Decode accepted %q as %+v", name, v, s)
		}
	}
	// Once the clock passes its expiry, a good cookie is refused too.
	m.now = func() time.Time { return now.Add(2 * time.Hour) }
	if _, err := m.Decode(good); err == nil {
		t.Error("Decode accepted a cookie after its expiry")
	}
}

func TestCookieAttributes(t *testing.T) {
	t.Parallel()
	m := newManager(t, secret)
	for _, tt := range []struct {
		name   string
		req    func() *http.Request
		secure bool
	}{
		{"http localhost", func() *http.Request { return httptest.NewRequest("GET", "http://localhost:8080/ci/", nil) }, false},
		{"http 127.0.0.1", func() *http.Request { return httptest.NewRequest("GET", "http://127.0.0.1:8080/ci/", nil) }, false},
		{"http [::1]", func() *http.Request { return httptest.NewRequest("GET", "http://[::1]:8080/ci/", nil) }, false},
		{"http public host", func() *http.Request { return httptest.NewRequest("GET", "http://ci.example.com/ci/", nil) }, true},
		{"tls", func() *http.Request {
			r := httptest.NewRequest("GET", "https://localhost/ci/", nil)
			r.TLS = &tls.ConnectionState{}
			return r
		}, true},
		{"proxy says https", func() *http.Request {
			r := httptest.NewRequest("GET", "http://127.0.0.1:8080/ci/", nil)
			r.Header.Set("X-Forwarded-Proto", "https")
			return r
		}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, c := login(t, m, tt.req())
			if c.Name != CookieName || c.Path != "/" || !c.HttpOnly || c.SameSite != http.SameSiteLaxMode || c.Secure != tt.secure {
				t.Errorf("cookie %s: Path %q HttpOnly %v SameSite %v Secure %v; want /, true, Lax, %v",
					c.Name, c.Path, c.HttpOnly, c.SameSite, c.Secure, tt.secure)
			}
			if d := time.Until(s.Expires); d < Lifetime-time.Minute || d > Lifetime+time.Minute {
				t.Errorf("session expires in %s, want %s", d, Lifetime)
			}
			if c.MaxAge < int((Lifetime - time.Minute).Seconds()) {
				t.Errorf("Max-Age %d, want about %d", c.MaxAge, int(Lifetime.Seconds()))
			}
			got, ok := get(t, m, c)
			if !ok || got.Login != "alice" || got.Forge != "gitea" || got.UserID != 7 {
				t.Errorf("Get = %+v, %v", got, ok)
			}
		})
	}
}

func TestLogoutClearsCookie(t *testing.T) {
	t.Parallel()
	m := newManager(t, secret)
	w := httptest.NewRecorder()
	if err := m.Logout(t.Context(), w, httptest.NewRequest("POST", "http://localhost/ci/logout", nil)); err != nil {
		t.Fatal(err)
	}
	c := w.Result().Cookies()
	if len(c) != 1 || c[0].Name != CookieName || c[0].MaxAge >= 0 || c[0].Value != "" {
		t.Fatalf("logout cookies %+v, want %s cleared", c, CookieName)
	}
}

// post builds a logged-in form POST with the given CSRF token (none if empty) and headers.
func post(t *testing.T, m *Manager, token string, header map[string]string) *http.Request {
	t.Helper()
	_, c := login(t, m, httptest.NewRequest("GET", "http://ci.example.com/", nil))
	form := url.Values{}
	if token != "" {
		form.Set(CSRFField, token)
	}
	r := httptest.NewRequest("POST", "http://ci.example.com/api/builds/1/rebuild", strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range header {
		r.Header.Set(k, v)
	}
	r.AddCookie(c)
	return r
}

func TestCSRF(t *testing.T) {
	t.Parallel()
	m := newManager(t, secret, "https://public.example.com")
	token := func() string {
		r := post(t, m, "", nil)
		return m.RequestCSRFToken(r)
	}
	// The token is derived from the cookie: another login (another cookie) has another one.
	good := token()
	for _, tt := range []struct {
		name   string
		req    func() *http.Request
		wantOK bool
	}{
		{"form field", func() *http.Request {
			r := post(t, m, "", nil)
			return withForm(r, m.RequestCSRFToken(r))
		}, true},
		{"header", func() *http.Request {
			r := post(t, m, "", nil)
			r.Header.Set(CSRFHeader, m.RequestCSRFToken(r))
			return r
		}, true},
		{"same-origin browser", func() *http.Request {
			r := post(t, m, "", map[string]string{"Origin": "http://ci.example.com", "Sec-Fetch-Site": "same-origin"})
			return withForm(r, m.RequestCSRFToken(r))
		}, true},
		{"trusted public origin", func() *http.Request {
			r := post(t, m, "", map[string]string{"Origin": "https://public.example.com"})
			return withForm(r, m.RequestCSRFToken(r))
		}, true},
		{"missing token", func() *http.Request { return post(t, m, "", nil) }, false},
		{"wrong token", func() *http.Request { return post(t, m, "bm9wZQ", nil) }, false},
		{"token of another login", func() *http.Request {
			r := post(t, m, "", nil)
			if m.RequestCSRFToken(r) == good {
				t.Fatal("two logins share a CSRF token")
			}
			return withForm(r, good)
		}, false},
		{"cross-site Sec-Fetch-Site", func() *http.Request {
			r := post(t, m, "", map[string]string{"Sec-Fetch-Site": "cross-site"})
			return withForm(r, m.RequestCSRFToken(r))
		}, false},
		{"cross-origin Origin", func() *http.Request {
			r := post(t, m, "", map[string]string{"Origin": "https://evil.example"})
			return withForm(r, m.RequestCSRFToken(r))
		}, false},
		{"Origin null", func() *http.Request {
			r := post(t, m, "", map[string]string{"Origin": "null"})
			return withForm(r, m.RequestCSRFToken(r))
		}, false},
		{"no session", func() *http.Request {
			r := httptest.NewRequest("POST", "http://ci.example.com/api/builds/1/rebuild", nil)
			r.Header.Set(CSRFHeader, good)
			return r
		}, false},
	} {
		err := m.CheckCSRF(tt.req())
		if (err == nil) != tt.wantOK {
			t.Errorf("%s: CheckCSRF = %v, want ok %v", tt.name, err, tt.wantOK)
		}
	}
}

// withForm replaces r's body by a form carrying token.
func withForm(r *http.Request, token string) *http.Request {
	body := url.Values{CSRFField: {token}}.Encode()
	r2 := httptest.NewRequest(r.Method, r.URL.String(), strings.NewReader(body))
	r2.Header = r.Header.Clone()
	r2.Host = r.Host
	return r2
}

func TestIsLoopbackHost(t *testing.T) {
	t.Parallel()
	for host, want := range map[string]bool{
		"localhost": true, "localhost:8080": true, "app.localhost:1": true, "127.0.0.1:80": true,
		"127.1.2.3": true, "[::1]:8080": true, "::1": true,
		"ci.example.com": false, "10.0.0.1:8080": false, "localhost.example.com": false, "": false,
	} {
		if got := IsLoopbackHost(host); got != want {
			t.Errorf("IsLoopbackHost(%q) = %v, want %v", host, got, want)
		}
	}
}
