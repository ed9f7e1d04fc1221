package gc

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/errgroup"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// maxNarInfo bounds a narinfo read; real ones are a few hundred bytes to a few KiB.
const maxNarInfo = 1 << 20

// liveSet is the mark: the cache objects something live points at. A store path (by hash part)
// is live when the database keeps it or a live narinfo refers to it: a narinfo's references must
// stay substitutable, so the runtime closure of every live output stays. A live path keeps its
// narinfo, its NAR (the narinfo's URL), its listing and its realisations.
type liveSet struct {
	store   blob.Store
	drvs    *blob.Derivations
	inDB    map[string]bool // hash parts of the .drv objects the listing found in the database
	workers int
	logger  *slog.Logger

	mu         sync.Mutex
	hashes     map[string]bool // store path hash parts marked live
	keys       map[string]bool // objects marked live besides those derived from hashes
	unresolved []string        // database paths without a narinfo when marked

	reads atomic.Int64 // narinfos read
}

func newLiveSet(store blob.Store, drvs *blob.Derivations, inDB map[string]bool, workers int, logger *slog.Logger) *liveSet {
	return &liveSet{store: store, drvs: drvs, inDB: inDB, workers: workers, logger: logger,
		hashes: map[string]bool{}, keys: map[string]bool{}}
}

// isLive reports whether key must be kept.
func (s *liveSet) isLive(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys[key] {
		return true
	}
	switch kind := kindOf(key); kind {
	case kindNarInfo, kindListing:
		h, _, _ := strings.Cut(key, ".")
		return s.hashes[h]
	case kindRealisation:
		// realisations/<drv hash>!<output>.doi
		h, _, _ := strings.Cut(strings.TrimPrefix(key, "realisations/"), "!")
		return s.hashes[h]
	case kindCacheInfo:
		return true
	}
	return false
}

func (s *liveSet) addKey(key string) {
	s.mu.Lock()
	s.keys[key] = true
	s.mu.Unlock()
}

// mark marks the paths with hash parts hashes live and follows their narinfos' references.
// exists, if not nil, says which narinfos the listing saw: the others are not read. fromDB
// records the database's paths that had no narinfo, for the recheck.
func (s *liveSet) mark(ctx context.Context, hashes []string, exists map[string]bool, fromDB bool) error {
	frontier := s.claim(hashes)
	for len(frontier) > 0 {
		var (
			next    []string
			nextMu  sync.Mutex
			missing []string
		)
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(s.workers)
		for _, h := range frontier {
			if exists != nil && !exists[h] {
				if fromDB {
					nextMu.Lock()
					missing = append(missing, h)
					nextMu.Unlock()
				}
				continue
			}
			g.Go(func() error {
				ni, err := s.readNarInfo(gctx, h)
				if err != nil {
					return err
				}
				if ni == nil {
					if fromDB {
						nextMu.Lock()
						missing = append(missing, h)
						nextMu.Unlock()
					}
					return nil
				}
				if blob.ValidKey(ni.URL) == nil {
					s.addKey(ni.URL)
				}
				var refs []string
				for _, r := range ni.References {
					if len(r) >= 32 {
						refs = append(refs, r[:32])
					}
				}
				nextMu.Lock()
				next = append(next, refs...)
				nextMu.Unlock()
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
		s.mu.Lock()
		s.unresolved = append(s.unresolved, missing...)
		s.mu.Unlock()
		// References are not database paths: one without a narinfo is served upstream.
		frontier, fromDB = s.claim(next), false
	}
	return nil
}

// claim marks hashes live and returns those not marked before.
func (s *liveSet) claim(hashes []string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var fresh []string
	for _, h := range hashes {
		if !s.hashes[h] {
			s.hashes[h] = true
			fresh = append(fresh, h)
		}
	}
	return fresh
}

// takeUnresolved returns the database paths that had no narinfo and forgets them; the recheck
// reads them again, since a builder may have published one since.
func (s *liveSet) takeUnresolved() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.unresolved
	s.unresolved = nil
	return u
}

// keepUnresolved puts hashes back for the next round's recheck.
func (s *liveSet) keepUnresolved(hashes []string) {
	s.mu.Lock()
	s.unresolved = append(s.unresolved, hashes...)
	s.mu.Unlock()
}

// recheck reads the narinfos of hashes (already live) again and follows what they now point at.
func (s *liveSet) recheck(ctx context.Context, hashes []string) error {
	s.mu.Lock()
	for _, h := range hashes {
		delete(s.hashes, h)
	}
	s.mu.Unlock()
	return s.mark(ctx, hashes, nil, true)
}

// readNarInfo returns the narinfo of hash part h, nil if the cache has none: from the database
// for the .drv objects the listing found there, else from the blob store, then the database (a
// .drv published since the listing). One that does not parse is kept (its hash is live) but not
// followed, with a warning.
func (s *liveSet) readNarInfo(ctx context.Context, h string) (*nix.NarInfo, error) {
	var data []byte
	var err error
	if !s.inDB[h] {
		data, err = s.readBlob(ctx, h+".narinfo")
	}
	if s.inDB[h] || errors.Is(err, blob.ErrNotFound) {
		data, _, err = s.drvs.NarInfo(ctx, h)
	}
	if errors.Is(err, blob.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	s.reads.Add(1)
	ni, err := nix.ParseNarInfo(data)
	if err != nil {
		s.logger.Warn("a narinfo does not parse; keeping it without following its references",
			"key", h+".narinfo", "error", err)
		return nil, nil
	}
	return ni, nil
}

// readBlob reads a narinfo from the blob store.
func (s *liveSet) readBlob(ctx context.Context, key string) ([]byte, error) {
	r, _, err := s.store.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(io.LimitReader(r, maxNarInfo))
}
