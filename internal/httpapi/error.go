package httpapi

import (
	"fmt"
	"net/http"
)

// Error is an error whose Msg is safe to show the client. Any other error a handler returns
// becomes a bare 500; its details go to the log only.
type Error struct {
	Code int
	Msg  string
	Err  error // logged, never sent
	// Header is added to the response (Retry-After, or a Cache-Control in place of no-store).
	Header http.Header
}

func (e *Error) Error() string {
	if e.Err != nil {
		return e.Msg + ": " + e.Err.Error()
	}
	return e.Msg
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an Error with code and a formatted message for the client.
func Errorf(code int, format string, args ...any) *Error {
	return &Error{Code: code, Msg: sprintf(format, args...)}
}

// Unauthorized is the answer to a request without valid credentials; it asks for a bearer token.
func Unauthorized(w http.ResponseWriter, msg string) *Error {
	w.Header().Set("WWW-Authenticate", `Bearer realm="harmonia-ci"`)
	return &Error{Code: http.StatusUnauthorized, Msg: msg}
}

func sprintf(format string, args ...any) string {
	if len(args) == 0 {
		return format
	}
	return fmt.Sprintf(format, args...)
}
