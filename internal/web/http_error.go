package web

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
)

// HTTPError is an error whose Msg is safe to show the client. Any other error a handler returns
// becomes a bare 500; its details go to the log only.
type HTTPError struct {
	Code int
	Msg  string
	Err  error // logged, never sent
	// Header is added to the response (Retry-After, or a Cache-Control in place of no-store).
	Header http.Header
}

func (e *HTTPError) Error() string {
	if e.Err != nil {
		return e.Msg + ": " + e.Err.Error()
	}
	return e.Msg
}

func (e *HTTPError) Unwrap() error { return e.Err }

// Errorf returns an HTTPError with code and a formatted message for the client.
func Errorf(code int, format string, args ...any) *HTTPError {
	return &HTTPError{Code: code, Msg: sprintf(format, args...)}
}

// HandlerFunc is a handler that returns its error instead of writing it.
type HandlerFunc func(w http.ResponseWriter, r *http.Request) error

// Handle turns h into an http.Handler that answers errors uniformly: JSON {"error": Msg} with
// the HTTPError's code and Header, or a bare 500 for any other error, whose details go to
// logger only. A database that could not be reached or did not answer in time
// (db.Unavailable) is a 503 "database unavailable" rather than a 500.
func Handle(logger *slog.Logger, h HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := h(w, r)
		if err == nil {
			return
		}
		var he *HTTPError
		if !errors.As(err, &he) {
			he = &HTTPError{Code: http.StatusInternalServerError, Msg: "internal error", Err: err}
			if db.Unavailable(err) && r.Context().Err() == nil {
				he = &HTTPError{Code: http.StatusServiceUnavailable, Msg: "database unavailable", Err: err}
			}
		}
		level := slog.LevelInfo
		switch {
		case he.Code >= 500:
			level = slog.LevelError
		case he.Code == http.StatusNotFound && he.Err == nil:
			level = slog.LevelDebug // routine: a cache miss, a probe
		}
		logger.Log(r.Context(), level, "request failed", "method", r.Method, "path", r.URL.Path, "status", he.Code, "error", he.Error())
		hdr := w.Header()
		hdr.Set("Content-Type", "application/json")
		hdr.Set("Cache-Control", "no-store")
		for k, vs := range he.Header {
			hdr.Del(k)
			for _, v := range vs {
				hdr.Add(k, v)
			}
		}
		writeJSONBody(w, he.Code, map[string]string{"error": he.Msg})
	})
}

// wrap is Handle with the server's logger.
func (s *Server) wrap(h HandlerFunc) http.Handler { return Handle(s.logger, h) }

// WriteJSON writes v as the JSON body of a response that must not be cached.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	writeJSONBody(w, code, v)
}

// writeJSONBody sends the status and v as indented JSON.
func writeJSONBody(w http.ResponseWriter, code int, v any) {
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeJSON(w http.ResponseWriter, code int, v any) { WriteJSON(w, code, v) }

// BearerToken returns the token of an "Authorization: Bearer <token>" header.
func BearerToken(r *http.Request) (string, bool) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// TokenHash is the sha256 of a token. Tokens are compared by their hashes in constant time, so
// neither the content nor the length of the expected token leaks through timing.
type TokenHash [sha256.Size]byte

// HashToken returns the hash of token.
func HashToken(token string) TokenHash { return sha256.Sum256([]byte(token)) }

// Matches reports whether token hashes to h.
func (h TokenHash) Matches(token string) bool {
	got := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(got[:], h[:]) == 1
}

// Unauthorized is the answer to a request without valid credentials; it asks for a bearer token.
func Unauthorized(w http.ResponseWriter, msg string) *HTTPError {
	w.Header().Set("WWW-Authenticate", `Bearer realm="harmonia-ci"`)
	return &HTTPError{Code: http.StatusUnauthorized, Msg: msg}
}

func sprintf(format string, args ...any) string {
	if len(args) == 0 {
		return format
	}
	return fmt.Sprintf(format, args...)
}
