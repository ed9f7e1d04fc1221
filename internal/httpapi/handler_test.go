package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestUnavailableIs503(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		code int
	}{
		{"deadline", fmt.Errorf("read cluster status: %w", context.DeadlineExceeded), http.StatusServiceUnavailable},
		{"refused", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, http.StatusServiceUnavailable},
		{"server shutting down", &pgconn.PgError{Code: "57P01"}, http.StatusServiceUnavailable},
		{"statement failed", &pgconn.PgError{Code: "23505"}, http.StatusInternalServerError},
		{"wrong password", &pgconn.PgError{Code: "28P01"}, http.StatusInternalServerError},
		{"other", errors.New("boom"), http.StatusInternalServerError},
		{"explicit", &Error{Code: http.StatusConflict, Msg: "busy", Err: context.DeadlineExceeded}, http.StatusConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := Handle(slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})), func(http.ResponseWriter, *http.Request) error { return tc.err })
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
			if w.Code != tc.code {
				t.Fatalf("status %d, want %d; body %s", w.Code, tc.code, w.Body)
			}
			if tc.code == http.StatusInternalServerError && w.Body.String() != "{\n  \"error\": \"internal error\"\n}\n" {
				t.Errorf("body %q leaks more than \"internal error\"", w.Body)
			}
		})
	}
}
