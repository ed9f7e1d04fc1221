package eval

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// Upstream asks upstream binary caches (the configured substituters) whether they hold store
// paths, as Nix would: a narinfo for the path, signed by a trusted key.
type Upstream struct {
	URLs []string
	Keys []nix.PublicKey
	HTTP *http.Client // default: 30 s timeout
}

// NewUpstream parses the configured trusted keys; it returns nil when there are no URLs.
func NewUpstream(urls, keys []string) (*Upstream, error) {
	if len(urls) == 0 {
		return nil, nil
	}
	u := &Upstream{URLs: urls}
	for _, k := range keys {
		pk, err := nix.ParsePublicKey(k)
		if err != nil {
			return nil, fmt.Errorf("trusted public key %q: %w", k, err)
		}
		u.Keys = append(u.Keys, pk)
	}
	return u, nil
}

// Have returns the paths some upstream holds. An unreachable upstream counts as not holding
// anything (the build then happens here), as Nix treats a failing substituter.
func (u *Upstream) Have(ctx context.Context, paths []string) ([]string, error) {
	client := u.HTTP
	if client == nil {
		client = &http.Client{Timeout: 30 * time.Second}
	}
	var mu sync.Mutex
	var have []string
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for _, p := range paths {
		sp, err := nix.ParseStorePath(p)
		if err != nil {
			return nil, fmt.Errorf("upstream lookup: %w", err)
		}
		g.Go(func() error {
			for _, base := range u.URLs {
				if u.holds(gctx, client, strings.TrimRight(base, "/"), sp) {
					mu.Lock()
					have = append(have, p)
					mu.Unlock()
					return nil
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return have, nil
}

func (u *Upstream) holds(ctx context.Context, client *http.Client, base string, sp nix.StorePath) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/"+sp.Hash+".narinfo", nil)
	if err != nil {
		return false
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return false
	}
	ni, err := nix.ParseNarInfo(b)
	if err != nil || ni.StorePath != sp.String() {
		return false
	}
	for _, k := range u.Keys {
		if ni.Verify(k) {
			return true
		}
	}
	return false
}
