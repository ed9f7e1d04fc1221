package webui

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// testForgeURL is the web address of the Gitea forge "gitea" a test UI knows.
const testForgeURL = "https://gitea.test"

// newTestUI returns a UI on a fresh database (no notifier: pages only), with one forge, a
// Gitea named "gitea" at testForgeURL, and the database's pool for fixtures.
func newTestUI(t *testing.T) (*UI, *pgxpool.Pool) {
	t.Helper()
	pool := dbtest.NewPool(t)
	g, err := forge.NewGitea(forge.GiteaConfig{Name: "gitea", URL: testForgeURL, Token: "token", WebhookSecret: []byte("secret")})
	if err != nil {
		t.Fatalf("gitea forge: %v", err)
	}
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	u, err := New(Config{Pool: pool, Forges: forge.Set{"gitea": g}, Logger: logger})
	if err != nil {
		t.Fatalf("new UI: %v", err)
	}
	return u, pool
}

// testMux is a mux with every route of u registered.
func testMux(u *UI) *http.ServeMux {
	mux := http.NewServeMux()
	u.Register(access.NewRoutes(mux, nil))
	return mux
}

// get serves GET path through h and returns the status code and body.
func get(t *testing.T, h http.Handler, path string) (code int, body string) {
	t.Helper()
	req := httptest.NewRequestWithContext(t.Context(), http.MethodGet, path, nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	b, err := io.ReadAll(rec.Result().Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", path, err)
	}
	return rec.Code, string(b)
}
