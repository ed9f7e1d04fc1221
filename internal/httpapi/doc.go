// Package httpapi holds the error type and plumbing every HTTP handler of the node shares:
// handlers that return an Error instead of writing it (HandlerFunc, Handle), JSON answers that
// are never cached (WriteJSON), bearer tokens compared by their hashes (BearerToken, TokenHash),
// and the bound on a request's database work (WithDBTimeout). It owns no routes; the servers
// that do (web, webui, webhook, the object store and the signer) build on it.
package httpapi
