package builder

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// The node's token goes to the cluster's cache nodes and to nothing else: not to upstream, not
// to a host that merely starts like a cache's.
func TestCacheAuthOnlyToClusterCaches(t *testing.T) {
	t.Parallel()
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Authorization")
	}))
	t.Cleanup(srv.Close)
	b := &Builder{cfg: Config{CacheToken: "hci1:builder-1:builder:mac"}}
	b.sources.caches = []string{srv.URL + "/cluster"}
	b.withCacheAuth()
	client := b.cfg.Store.HTTP
	if client == nil {
		t.Fatal("no client")
	}
	for _, c := range []struct{ path, want string }{
		{"/cluster/x.narinfo", "Bearer hci1:builder-1:builder:mac"},
		{"/clusterevil/x.narinfo", ""},
		{"/upstream/x.narinfo", ""},
	} {
		resp, err := client.Get(srv.URL + c.path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if auth := <-got; auth != c.want {
			t.Errorf("%s: Authorization %q, want %q", c.path, auth, c.want)
		}
	}
}
