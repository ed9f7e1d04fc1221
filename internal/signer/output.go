package signer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nodetoken"
	"github.com/harmonia-ci/harmonia-ci/internal/signerapi"
)

// output is a validated Output.
type output struct {
	path     nix.StorePath
	narHash  string
	narSum   [sha256.Size]byte
	narSize  int64
	fileSum  [sha256.Size]byte
	fileSize int64
	refs     []string // full store paths, as given
	deriver  string   // basename or ""
	ca       string   // narinfo CA field, "" for input-addressed outputs
	narKey   string   // nar/<nix32>.nar.zst
	infoKey  string   // <hash>.narinfo
}

// refBases returns the references as the basenames a narinfo lists.
func (o output) refBases() []string {
	b := make([]string, len(o.refs))
	for i, r := range o.refs {
		b[i] = strings.TrimPrefix(r, nix.StoreDir+"/")
	}
	return b
}

func fullPath(p string) (string, error) {
	if strings.HasPrefix(p, "/") {
		sp, err := nix.ParseStorePath(p)
		return sp.String(), err
	}
	sp, err := nix.ParseStorePathBase(p)
	return sp.String(), err
}

func parseOutputs(field string, outs []signerapi.Output) ([]output, error) {
	res := make([]output, len(outs))
	seen := map[string]bool{}
	for i, o := range outs {
		p, err := parseOutput(o)
		if err != nil {
			return nil, badRequest("%s[%d].%v", field, i, err)
		}
		if seen[p.path.String()] {
			return nil, badRequest("%s[%d]: %s is listed twice", field, i, p.path)
		}
		seen[p.path.String()] = true
		res[i] = p
	}
	return res, nil
}

func parseOutput(o signerapi.Output) (output, error) {
	var p output
	var err error
	if p.path, err = nix.ParseStorePath(o.StorePath); err != nil {
		return p, fmt.Errorf("store_path: %w", err)
	}
	if p.narSum, err = nix.ParseSHA256(o.NarHash); err != nil {
		return p, fmt.Errorf("nar_hash: %w", err)
	}
	p.narHash = nix.FormatSHA256(p.narSum)
	if o.NarSize <= 0 {
		return p, fmt.Errorf("nar_size: must be positive, got %d", o.NarSize)
	}
	p.narSize = o.NarSize
	if p.fileSum, err = nix.ParseSHA256(o.FileHash); err != nil {
		return p, fmt.Errorf("file_hash: %w", err)
	}
	if o.FileSize <= 0 {
		return p, fmt.Errorf("file_size: must be positive, got %d", o.FileSize)
	}
	p.fileSize = o.FileSize
	for j, r := range o.References {
		full, err := fullPath(r)
		if err != nil {
			return p, fmt.Errorf("references[%d]: %w", j, err)
		}
		p.refs = append(p.refs, full)
	}
	if o.Deriver != "" {
		d, err := fullPath(o.Deriver)
		if err != nil {
			return p, fmt.Errorf("deriver: %w", err)
		}
		p.deriver = strings.TrimPrefix(d, nix.StoreDir+"/")
	}
	p.narKey = nix.NarURL(nix.FormatSHA256(p.fileSum))
	p.infoKey = p.path.Hash + ".narinfo"
	for _, k := range []string{p.narKey, p.infoKey} {
		if err := blob.ValidKey(k); err != nil {
			return p, fmt.Errorf("store_path: %w", err)
		}
	}
	return p, nil
}

// head reports whether key is in the store with exactly size bytes (size < 0: any size).
func (s *Server) head(ctx context.Context, key string, size int64) (bool, error) {
	info, err := s.cfg.Store.Head(ctx, key)
	if errors.Is(err, blob.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, unavailable("blob store unavailable", err)
	}
	return size < 0 || info.Size == size, nil
}

// checkUploaded answers 400 unless every output's NAR is in the store with its declared size.
func (s *Server) checkUploaded(ctx context.Context, field string, outs []output) error {
	return eachOutput(ctx, outs, func(ctx context.Context, i int, o output) error {
		have, err := s.head(ctx, o.narKey, o.fileSize)
		if err != nil {
			return err
		}
		if !have {
			return badRequest("%s[%d]: nar not uploaded (%s with %d bytes)", field, i, o.narKey, o.fileSize)
		}
		return nil
	})
}

// slots presigns the NAR uploads the store lacks.
func (s *Server) slots(ctx context.Context, outs []output) ([]signerapi.OutputSlot, error) {
	res := make([]signerapi.OutputSlot, len(outs))
	err := eachOutput(ctx, outs, func(ctx context.Context, i int, o output) error {
		slot := signerapi.OutputSlot{StorePath: o.path.String()}
		have, err := s.head(ctx, o.narKey, o.fileSize)
		if err != nil {
			return err
		}
		if have {
			slot.Skipped = true
		} else if slot.Upload, err = s.presign(ctx, o.narKey, o.fileSize, o.fileSum[:]); err != nil {
			return err
		} else {
			s.metrics.narGranted(o.fileSize)
		}
		res[i] = slot
		return nil
	})
	return res, err
}

func (s *Server) presign(ctx context.Context, key string, size int64, sum []byte) (*signerapi.Upload, error) {
	u, err := s.cfg.Store.PresignPut(ctx, key, size, sum, blob.ContentTypeFor(key), s.cfg.URLExpiry)
	if err != nil {
		return nil, internal("presigning failed", err)
	}
	return &signerapi.Upload{URL: u.URL, Method: u.Method, Headers: u.Headers, Expires: u.Expires}, nil
}

// syncKeysMax is the most objects syncObjects makes durable one by one; past it one flush of
// the whole store costs less.
const syncKeysMax = 32

// syncObjects makes the objects keys durable, once they are all written.
func (s *Server) syncObjects(ctx context.Context, keys []string) error {
	syncer, ok := s.cfg.Store.(blob.Syncer)
	if !ok {
		return nil
	}
	var err error
	if len(keys) <= syncKeysMax {
		err = syncer.SyncKeys(ctx, keys)
	} else {
		err = syncer.Sync(ctx)
	}
	if err != nil {
		return unavailable("blob store sync failed", err)
	}
	return nil
}

// sync makes every object written so far durable.
func (s *Server) sync(ctx context.Context) error {
	if syncer, ok := s.cfg.Store.(blob.Syncer); ok {
		if err := syncer.Sync(ctx); err != nil {
			return unavailable("blob store sync failed", err)
		}
	}
	return nil
}

// eachOutput runs fn for every output, several at once: a batch of .drv files is hundreds of
// small objects, and each blob store round trip (an fsync, an S3 request) is latency-bound.
func eachOutput(ctx context.Context, outs []output, fn func(ctx context.Context, i int, o output) error) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i, o := range outs {
		g.Go(func() error { return fn(gctx, i, o) })
	}
	return g.Wait()
}

type publishResult int

const (
	written publishResult = iota
	skipped
	conflict
	// rewritten: a trusted build replaced a quarantined output's narinfo that had another NAR.
	rewritten
)

// canonical is the NAR hash and size the cache serves for a path.
type canonical struct {
	path    string
	narHash string
	narSize int64
}

// publishAll writes the narinfos of outs (their NARs are in the store), then makes them durable.
// The narinfos of the paths in replace (quarantined outputs a trusted job built) are rewritten
// if their NAR differs. New narinfos are marked quarantined if quarantine (an untrusted job's).
func (s *Server) publishAll(ctx context.Context, outs []output, replace map[string]bool, quarantine bool) ([]canonical, signerapi.PublishResponse, error) {
	var resp signerapi.PublishResponse
	canon := make([]canonical, len(outs))
	results := make([]publishResult, len(outs))
	err := eachOutput(ctx, outs, func(ctx context.Context, i int, o output) error {
		var err error
		canon[i], results[i], err = s.publish(ctx, o, replace[o.path.String()], quarantine)
		return err
	})
	if err != nil {
		return nil, resp, err
	}
	s.metrics.published(results)
	for _, r := range results {
		switch r {
		case written, rewritten:
			resp.Written++
		case skipped:
			resp.Skipped++
		case conflict:
			resp.Conflicts++
		}
	}
	keys := make([]string, len(outs))
	for i, o := range outs {
		keys[i] = o.infoKey
	}
	return canon, resp, s.syncObjects(ctx, keys)
}

// publish writes o's signed narinfo unless one exists, marked quarantined if quarantine: the
// mark is in the object itself, so no cache node serves it to everyone in the moment before
// the database says it is quarantined. An existing narinfo is rewritten only when replace (a
// quarantined output, built now by a trusted job): with the same NarHash it is skipped, with
// another it is a conflict (a non-reproducible build; the cache keeps the first), or, when
// replace, rewritten with o's. It returns what the cache now serves for the path.
func (s *Server) publish(ctx context.Context, o output, replace, quarantine bool) (canonical, publishResult, error) {
	mine := canonical{path: o.path.String(), narHash: o.narHash, narSize: o.narSize}
	existing, err := s.readNarInfo(ctx, o.infoKey)
	if err != nil {
		return mine, 0, err
	}
	rewrite := replace && existing != nil && existing.StorePath == mine.path && existing.NarHash != o.narHash
	if existing == nil || rewrite {
		ni := &nix.NarInfo{
			StorePath: mine.path, URL: o.narKey, Compression: "zstd",
			FileHash: nix.FormatSHA256(o.fileSum), FileSize: o.fileSize,
			NarHash: o.narHash, NarSize: o.narSize,
			References: o.refBases(), Deriver: o.deriver, CA: o.ca, Quarantined: quarantine,
		}
		if err := ni.Sign(s.cfg.Key); err != nil {
			return mine, 0, badRequest("%s: %v", mine.path, err)
		}
		text, err := ni.MarshalText()
		if err != nil {
			return mine, 0, badRequest("%s: %v", mine.path, err)
		}
		sum := sha256.Sum256(text)
		err = s.cfg.Store.Put(ctx, o.infoKey, bytes.NewReader(text), int64(len(text)),
			blob.PutOptions{ContentType: blob.ContentTypeFor(o.infoKey), SHA256: sum[:], IfAbsent: !rewrite})
		if err == nil && rewrite {
			s.logger.Warn("non-reproducible build: a trusted build replaces the quarantined pull-request build's NAR",
				"path", mine.path, "quarantined_nar_hash", existing.NarHash, "trusted_nar_hash", o.narHash)
			s.refs.put(mine.path, o.refs)
			return mine, rewritten, nil
		}
		if err == nil {
			s.refs.put(mine.path, o.refs)
			return mine, written, nil
		}
		if !errors.Is(err, blob.ErrExists) {
			return mine, 0, unavailable("writing the narinfo failed", err)
		}
		// Another signer wrote it meanwhile: compare with what won.
		if existing, err = s.readNarInfo(ctx, o.infoKey); err != nil || existing == nil {
			return mine, 0, unavailable("reading the narinfo failed", err)
		}
	}
	if existing.StorePath != mine.path {
		// Another path with the same hash part: never overwrite it.
		s.logger.Error("narinfo names another store path; not rewriting it",
			"key", o.infoKey, "existing", existing.StorePath, "path", mine.path)
		return canonical{}, conflict, nil
	}
	if existing.NarHash == o.narHash {
		return mine, skipped, nil
	}
	s.logger.Warn("non-reproducible build: the cache keeps the first NAR",
		"path", mine.path, "cached_nar_hash", existing.NarHash, "new_nar_hash", o.narHash)
	return canonical{path: mine.path, narHash: existing.NarHash, narSize: existing.NarSize}, conflict, nil
}

// readNarInfo returns the narinfo at key, nil if there is none. One that does not parse is
// reported as an error: it is never overwritten blindly.
func (s *Server) readNarInfo(ctx context.Context, key string) (*nix.NarInfo, error) {
	r, _, err := s.cfg.Store.Get(ctx, key)
	if errors.Is(err, blob.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, unavailable("blob store unavailable", err)
	}
	defer r.Close()
	data, err := io.ReadAll(io.LimitReader(r, 1<<20))
	if err != nil {
		return nil, unavailable("blob store unavailable", err)
	}
	ni, err := nix.ParseNarInfo(data)
	if err != nil {
		return nil, internal("existing narinfo does not parse", fmt.Errorf("%s: %w", key, err))
	}
	return ni, nil
}

// queueRecordHashes queues on b the statement setting the canonical NAR hash of drvPath's
// output rows still without one (the first writer wins), quarantined unless trusted. A trusted
// job's outputs that were quarantined are released first: the canonical hash becomes the one
// the cache now serves, and a quarantined build that differs is recorded as non-reproducible.
func queueRecordHashes(b *pgx.Batch, drvPath string, cs []canonical, trusted bool) {
	var paths, hashes []string
	var sizes []int64
	for _, c := range cs {
		if c.path == "" {
			continue
		}
		paths, hashes, sizes = append(paths, c.path), append(hashes, c.narHash), append(sizes, c.narSize)
	}
	if len(paths) == 0 {
		return
	}
	if trusted {
		b.Queue(sqlReleaseQuarantine, paths, hashes, sizes)
	}
	b.Queue(sqlRecordNarHashes, paths, hashes, sizes, drvPath, !trusted)
}

func (s *Server) handleCacheLookup(ctx context.Context, _ nodetoken.Identity, body io.Reader) (any, error) {
	var req signerapi.CacheLookupRequest
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	if len(req.StorePaths) > signerapi.MaxLookup {
		return nil, badRequest("store_paths: at most %d per request, got %d", signerapi.MaxLookup, len(req.StorePaths))
	}
	keys := make([]string, len(req.StorePaths))
	for i, p := range req.StorePaths {
		sp, err := nix.ParseStorePath(p)
		if err != nil {
			return nil, badRequest("store_paths[%d]: %v", i, err)
		}
		keys[i] = sp.Hash + ".narinfo"
	}
	present := make([]bool, len(keys))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i, k := range keys {
		g.Go(func() error {
			have, err := s.head(gctx, k, -1)
			present[i] = have
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	resp := signerapi.CacheLookupResponse{Present: []string{}}
	for i, p := range req.StorePaths {
		if present[i] {
			resp.Present = append(resp.Present, p)
		}
	}
	return resp, nil
}
