package web

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
)

// HTTPError is an error whose Msg is safe to show the client. Any other error a handler returns
// becomes a bare 500; its details go to the log only.
type HTTPError struct {
	Code int
	Msg  string
	Err  error // logged, never sent
}

func (e *HTTPError) Error() string {
	if e.Err != nil {
		return e.Msg + ": " + e.Err.Error()
	}
	return e.Msg
}

func (e *HTTPError) Unwrap() error { return e.Err }

// handlerFunc is a handler that returns its error instead of writing it.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

// wrap turns a handlerFunc into an http.Handler with uniform JSON errors.
func (s *Server) wrap(h handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := h(w, r)
		if err == nil {
			return
		}
		var he *HTTPError
		if !errors.As(err, &he) {
			he = &HTTPError{Code: http.StatusInternalServerError, Msg: "internal error", Err: err}
		}
		level := slog.LevelInfo
		if he.Code >= 500 {
			level = slog.LevelError
		}
		s.logger.Log(r.Context(), level, "request failed", "method", r.Method, "path", r.URL.Path, "status", he.Code, "error", he.Error())
		writeJSON(w, he.Code, map[string]string{"error": he.Msg})
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
