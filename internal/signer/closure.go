package signer

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// refCacheSize bounds the references remembered per signer; past it the cache starts over.
const refCacheSize = 200_000

// refCache remembers the references of paths whose narinfo the signer has read or written.
// Narinfos are written once, so an entry never goes stale.
type refCache struct {
	mu  sync.Mutex
	m   map[string][]string
	max int
}

func newRefCache(max int) *refCache { return &refCache{m: map[string][]string{}, max: max} }

func (c *refCache) get(path string) ([]string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	refs, ok := c.m[path]
	return refs, ok
}

func (c *refCache) put(path string, refs []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= c.max {
		clear(c.m)
	}
	c.m[path] = refs
}

// servedRefs returns the references of path as the cache serves it, or a trusted upstream;
// ok is false when neither serves path.
func (s *Server) servedRefs(ctx context.Context, path string) (refs []string, ok bool, err error) {
	return s.servedRefsIn(ctx, s.drvs, path)
}

// servedRefsIn is servedRefs reading the .drv objects from drvs.
func (s *Server) servedRefsIn(ctx context.Context, drvs *blob.Derivations, path string) (refs []string, ok bool, err error) {
	if refs, ok := s.refs.get(path); ok {
		return refs, true, nil
	}
	sp, err := nix.ParseStorePath(path)
	if err != nil {
		return nil, false, nil
	}
	ni, err := s.readNarInfo(ctx, sp.Hash+".narinfo")
	if err != nil {
		return nil, false, err
	}
	if ni == nil && strings.HasSuffix(sp.Name, ".drv") {
		if ni, err = drvNarInfo(ctx, drvs, sp.Hash); err != nil {
			return nil, false, err
		}
	}
	if (ni == nil || ni.StorePath != path) && s.cfg.Upstream != nil {
		if ni, err = s.cfg.Upstream.NarInfo(ctx, path); err != nil {
			return nil, false, unavailable("upstream cache unavailable", err)
		}
	}
	if ni == nil || ni.StorePath != path {
		return nil, false, nil
	}
	refs = make([]string, len(ni.References))
	for i, r := range ni.References {
		refs[i] = nix.StoreDir + "/" + r
	}
	s.refs.put(path, refs)
	return refs, true, nil
}

// unservedReference returns the first reference of outs that is neither one of outs nor in the
// closure of roots that the cache (or upstream) serves: one a build with these inputs could not
// have produced, or one a client of the cache could not fetch. "" when there is none.
// The .drv objects are read from drvs.
func (s *Server) unservedReference(ctx context.Context, drvs *blob.Derivations, outs []output, roots []string) (string, error) {
	want := map[string]bool{}
	for _, o := range outs {
		for _, r := range o.refs {
			want[r] = true
		}
	}
	for _, o := range outs {
		delete(want, o.path.String())
	}
	seen := map[string]bool{}
	queue := slices.Clone(roots)
	for len(queue) > 0 && len(want) > 0 {
		p := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		if seen[p] {
			continue
		}
		seen[p] = true
		refs, ok, err := s.servedRefsIn(ctx, drvs, p)
		if err != nil {
			return "", err
		}
		if !ok {
			continue
		}
		delete(want, p)
		queue = append(queue, refs...)
	}
	if len(want) == 0 {
		return "", nil
	}
	return slices.Sorted(func(yield func(string) bool) {
		for r := range want {
			if !yield(r) {
				return
			}
		}
	})[0], nil
}

// drvNarInfo returns the narinfo of the .drv with hash part hash the database keeps, nil if none.
func drvNarInfo(ctx context.Context, drvs *blob.Derivations, hash string) (*nix.NarInfo, error) {
	body, _, err := drvs.NarInfo(ctx, hash)
	if errors.Is(err, blob.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, unavailable("database unavailable", err)
	}
	ni, err := nix.ParseNarInfo(body)
	if err != nil {
		return nil, internal("stored .drv narinfo does not parse", err)
	}
	return ni, nil
}
