package builder

import (
	"net/http"
	"strings"

	"github.com/harmonia-ci/harmonia-ci/internal/substitute"
)

// cacheAuth sends the node's token to the cluster's cache nodes, with which they serve it
// private projects' paths, and to nothing else: upstream substituters never see it.
type cacheAuth struct {
	base  http.RoundTripper
	token string
	b     *Builder
}

func (a *cacheAuth) RoundTrip(r *http.Request) (*http.Response, error) {
	if a.isClusterCache(r.URL.String()) {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+a.token)
	}
	return a.base.RoundTrip(r)
}

// isClusterCache reports whether u is under one of the cluster's caches as last read.
func (a *cacheAuth) isClusterCache(u string) bool {
	a.b.sourcesMu.Lock()
	defer a.b.sourcesMu.Unlock()
	for _, c := range a.b.sources.caches {
		if strings.HasPrefix(u, strings.TrimSuffix(c, "/")+"/") {
			return true
		}
	}
	return false
}

// withCacheAuth gives the builder's store a client that authenticates to the cluster's caches.
func (b *Builder) withCacheAuth() {
	if b.cfg.CacheToken == "" || b.cfg.Store.HTTP != nil {
		return
	}
	b.cfg.Store.HTTP = &http.Client{Transport: &cacheAuth{base: substitute.DefaultTransport, token: b.cfg.CacheToken, b: b}}
}
