package substitute

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"

	"golang.org/x/sync/errgroup"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// Closure looks up paths and, recursively, their references, skipping every path that have
// reports valid (already in the local store): neither it nor its references are looked up, as
// a valid path's closure is valid. have is called with sorted batches of full store paths and
// returns the valid ones among them; a nil have treats every path as missing.
//
// The result holds every path looked up, each after all of its references that are in the
// result (self-references aside), which is the order a store accepts them in; ties go in
// store path order, so the result depends only on the caches' contents. Lookups run Parallel
// at a time. A path no cache supplies fails the whole closure with Lookup's error, saying
// which path referenced it.
func (f *Fetcher) Closure(ctx context.Context, paths []string, have func(ctx context.Context, paths []string) (valid []string, err error)) ([]*Found, error) {
	if err := f.check(); err != nil {
		return nil, fmt.Errorf("closure: %w", err)
	}
	seen := map[string]bool{}
	var frontier []string
	for _, p := range paths {
		if _, err := nix.ParseStorePath(p); err != nil {
			return nil, fmt.Errorf("closure: %w", err)
		}
		if !seen[p] {
			seen[p] = true
			frontier = append(frontier, p)
		}
	}
	neededBy := map[string]string{} // reference → the first path found to refer to it
	found := map[string]*Found{}
	refs := map[string][]string{} // found path → its references as full paths, without itself
	for len(frontier) > 0 {
		todo, err := missing(ctx, have, frontier)
		if err != nil {
			return nil, fmt.Errorf("closure: %w", err)
		}
		results, err := f.lookupAll(ctx, todo, neededBy)
		if err != nil {
			return nil, fmt.Errorf("closure: %w", err)
		}
		frontier = nil
		for i, p := range todo {
			found[p] = results[i]
			for _, base := range results[i].Info.References {
				sp, err := nix.ParseStorePathBase(base)
				if err != nil {
					return nil, fmt.Errorf("closure: references of %s: %w", p, err)
				}
				r := sp.String()
				if r == p {
					continue
				}
				refs[p] = append(refs[p], r)
				if !seen[r] {
					seen[r] = true
					neededBy[r] = p
					frontier = append(frontier, r)
				}
			}
		}
	}
	out, err := order(found, refs)
	if err != nil {
		return nil, fmt.Errorf("closure: %w", err)
	}
	return out, nil
}

// missing returns, sorted, the paths have does not report valid.
func missing(ctx context.Context, have func(context.Context, []string) ([]string, error), paths []string) ([]string, error) {
	paths = slices.Sorted(slices.Values(paths))
	if have == nil {
		return paths, nil
	}
	valid, err := have(ctx, slices.Clone(paths))
	if err != nil {
		return nil, fmt.Errorf("query valid paths: %w", err)
	}
	isValid := map[string]bool{}
	for _, v := range valid {
		isValid[v] = true
	}
	return slices.DeleteFunc(paths, func(p string) bool { return isValid[p] }), nil
}

// lookupAll looks up paths concurrently and returns their results in the same order, or the
// error of the first path (in order) that failed.
func (f *Fetcher) lookupAll(ctx context.Context, paths []string, neededBy map[string]string) ([]*Found, error) {
	results := make([]*Found, len(paths))
	errs := make([]error, len(paths))
	var g errgroup.Group
	g.SetLimit(max(cmp.Or(f.Parallel, ParallelDefault), 1))
	for i, p := range paths {
		g.Go(func() error {
			results[i], errs[i] = f.Lookup(ctx, p)
			return nil
		})
	}
	_ = g.Wait()
	if err := ctx.Err(); err != nil {
		return nil, context.Cause(ctx)
	}
	failed := 0
	var first error
	for i, err := range errs {
		if err == nil {
			continue
		}
		if failed++; first == nil {
			first = err
			if by, ok := neededBy[paths[i]]; ok {
				first = fmt.Errorf("%s references %s: %w", by, paths[i], err)
			}
		}
	}
	if failed > 1 {
		first = fmt.Errorf("%w (and %d more failed lookups)", first, failed-1)
	}
	return results, first
}

// order sorts found so that each path comes after its references (refs, full paths), visiting
// paths and references in sorted order so that the result is deterministic.
func order(found map[string]*Found, refs map[string][]string) ([]*Found, error) {
	const (
		visiting = 1
		done     = 2
	)
	state := map[string]int{}
	out := make([]*Found, 0, len(found))
	var visit func(p string) error
	visit = func(p string) error {
		switch state[p] {
		case done:
			return nil
		case visiting:
			return fmt.Errorf("reference cycle through %s", p)
		}
		state[p] = visiting
		for _, r := range slices.Sorted(slices.Values(refs[p])) {
			if found[r] == nil {
				continue // valid in the local store already
			}
			if err := visit(r); err != nil {
				return err
			}
		}
		state[p] = done
		out = append(out, found[p])
		return nil
	}
	for _, p := range slices.Sorted(maps.Keys(found)) {
		if err := visit(p); err != nil {
			return nil, err
		}
	}
	return out, nil
}
