// Package upstream asks the configured upstream binary caches ([substituters]) about store
// paths, as Nix would: a narinfo for the path, signed by a trusted key. The evaluator uses it to
// skip builds upstream has; the signer to accept references to paths upstream serves.
package upstream

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

// Caches asks upstream binary caches (the configured substituters) whether they hold store
// paths, as Nix would: a narinfo for the path, signed by a trusted key.
type Caches struct {
	URLs []string
	Keys []nix.PublicKey
	HTTP *http.Client // default: 30 s timeout
}

// NewUpstream parses the configured trusted keys; it returns nil when there are no URLs.
func New(urls, keys []string) (*Caches, error) {
	if len(urls) == 0 {
		return nil, nil
	}
	u := &Caches{URLs: urls}
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
func (u *Caches) Have(ctx context.Context, paths []string) ([]string, error) {
	client := u.client()
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

func (u *Caches) holds(ctx context.Context, client *http.Client, base string, sp nix.StorePath) bool {
	return u.fetch(ctx, client, base, sp) != nil
}

// NarInfo returns the narinfo of path from the first upstream that serves one signed by a
// trusted key, nil when none does. An unreachable upstream counts as not serving it.
func (u *Caches) NarInfo(ctx context.Context, path string) (*nix.NarInfo, error) {
	sp, err := nix.ParseStorePath(path)
	if err != nil {
		return nil, fmt.Errorf("upstream narinfo: %w", err)
	}
	for _, base := range u.URLs {
		if ni := u.fetch(ctx, u.client(), strings.TrimRight(base, "/"), sp); ni != nil {
			return ni, nil
		}
	}
	return nil, ctx.Err()
}

func (u *Caches) client() *http.Client {
	if u.HTTP != nil {
		return u.HTTP
	}
	return &http.Client{Timeout: 30 * time.Second}
}

func (u *Caches) fetch(ctx context.Context, client *http.Client, base string, sp nix.StorePath) *nix.NarInfo {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/"+sp.Hash+".narinfo", nil)
	if err != nil {
		return nil
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil
	}
	ni, err := nix.ParseNarInfo(b)
	if err != nil || ni.StorePath != sp.String() {
		return nil
	}
	for _, k := range u.Keys {
		if ni.Verify(k) {
			return ni
		}
	}
	return nil
}
