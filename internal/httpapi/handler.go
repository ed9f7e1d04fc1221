package httpapi

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
)

// HandlerFunc is a handler that returns its error instead of writing it.
type HandlerFunc func(w http.ResponseWriter, r *http.Request) error

// Handle turns h into an http.Handler that answers errors uniformly: JSON {"error": Msg} with
// the Error's code and Header, or a bare 500 for any other error, whose details go to
// logger only. A database that could not be reached or did not answer in time
// (db.Unavailable) is a 503 "database unavailable" rather than a 500.
func Handle(logger *slog.Logger, h HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := h(w, r)
		if err == nil {
			return
		}
		var he *Error
		if !errors.As(err, &he) {
			he = &Error{Code: http.StatusInternalServerError, Msg: "internal error", Err: err}
			if db.Unavailable(err) && r.Context().Err() == nil {
				he = &Error{Code: http.StatusServiceUnavailable, Msg: "database unavailable", Err: err}
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
