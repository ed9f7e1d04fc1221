package blob

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// Derivations are the binary cache's .drv objects, kept in PostgreSQL (table drv_objects) rather
// than in the blob store: a narinfo and an uncompressed NAR per .drv, as Nix reads them,
//
//	<hash>.narinfo       the narinfo the signer signed, as stored
//	nar/<narhash>.nar    the NAR of the .drv file, rendered from its contents
//
// An evaluation publishes thousands of .drv files of a few KiB at once; a row costs a fraction of
// the two files (or S3 objects) each would take. Only the signer writes them (Put), cache nodes
// serve them (NarInfo, NAR) and the garbage collector sweeps them (List, Delete) as it sweeps the
// blob store.
type Derivations struct {
	db db.DBTX
}

// NewDerivations returns the .drv objects in q (a pool, or a transaction to work within).
func NewDerivations(q db.DBTX) *Derivations { return &Derivations{db: q} }

// Derivation is one .drv object to store.
type Derivation struct {
	StorePath string // /nix/store/<hash>-<name>.drv
	NarInfo   []byte // signed, rendered with URL DrvNARKey(NarHash) and Compression none
	Text      []byte // the .drv file
	NarHash   [32]byte
	NarSize   int64
	// Hash is the derivation's hash for the derivations that use it (nix.DrvHash.Sum), which
	// the signer computed while it checked the derivation's outputs.
	Hash [32]byte
}

// DrvInfo describes a stored .drv object: the keys it serves and their sizes.
type DrvInfo struct {
	Hash        string // the store path's hash part
	NarKey      string // nar/<narhash>.nar
	NarInfoSize int64
	NarSize     int64
	Created     time.Time
}

// NarInfoKey is the key the .drv's narinfo is served under.
func (d DrvInfo) NarInfoKey() string { return d.Hash + ".narinfo" }

// DrvNARKey is the key of an uncompressed NAR whose sha256 is narHash: how Nix names a NAR it
// stores without compression (its file hash is its NAR hash).
func DrvNARKey(narHash [32]byte) string { return "nar/" + nix.EncodeBase32(narHash[:]) + ".nar" }

// IsPlainNAR reports whether key names an uncompressed NAR (nar/<hash>.nar): a .drv object's.
func IsPlainNAR(key string) bool {
	return strings.HasPrefix(key, "nar/") && strings.HasSuffix(key, ".nar")
}

// Put stores objs in one statement and reports which were new; an object whose hash part is
// stored already is left as it is (a .drv's store path follows from its contents, so it is the
// same object).
func (d *Derivations) Put(ctx context.Context, objs []Derivation) ([]bool, error) {
	n := len(objs)
	hashes, paths, narHashes, infos := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	sizes, texts, drvHashes := make([]int64, n), make([][]byte, n), make([][]byte, n)
	index := make(map[string]int, n)
	for i, o := range objs {
		sp, err := nix.ParseStorePath(o.StorePath)
		if err != nil {
			return nil, fmt.Errorf("put derivations: %w", err)
		}
		if o.NarSize <= 0 || len(o.NarInfo) == 0 {
			return nil, fmt.Errorf("put derivations: %s: no narinfo or NAR size", o.StorePath)
		}
		hashes[i], paths[i], infos[i] = sp.Hash, sp.String(), string(o.NarInfo)
		narHashes[i], sizes[i], texts[i] = nix.EncodeBase32(o.NarHash[:]), o.NarSize, o.Text
		drvHashes[i] = o.Hash[:]
		index[sp.Hash] = i
	}
	written := make([]bool, n)
	if n == 0 {
		return written, nil
	}
	rows, err := d.db.Query(ctx, sqlPutDrvs, hashes, paths, narHashes, sizes, infos, texts, drvHashes)
	if err != nil {
		return nil, fmt.Errorf("put derivations: %w", err)
	}
	var h string
	var inserted bool
	_, err = pgx.ForEachRow(rows, []any{&h, &inserted}, func() error {
		written[index[h]] = inserted
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("put derivations: %w", err)
	}
	return written, nil
}

// Hashes are the derivation hashes of the stored .drv objects at paths (those stored; a path
// not stored is absent): what a derivation that uses them needs to check its own output paths
// (nix.Derivation.CheckOutputs). A .drv stored before the signer recorded hashes has its hash
// computed from the stored texts below it, their output paths checked on the way.
func (d *Derivations) Hashes(ctx context.Context, paths []string) (map[string]nix.DrvHash, error) {
	out := map[string]nix.DrvHash{}
	pending := map[string]*nix.Derivation{} // stored without a hash
	ask := paths
	for len(ask) > 0 {
		rows, err := d.db.Query(ctx, sqlDrvHashes, ask)
		if err != nil {
			return nil, fmt.Errorf("derivation hashes: %w", err)
		}
		var p string
		var text, sum []byte
		var next []string
		_, err = pgx.ForEachRow(rows, []any{&p, &text, &sum}, func() error {
			drv, err := nix.ParseDerivation(text)
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			if len(sum) == 32 {
				out[p] = nix.DrvHash{Sum: [32]byte(sum), Outputs: drv.OutputNames()}
				return nil
			}
			pending[p] = drv
			for in := range drv.InputDrvs {
				if _, ok := out[in]; !ok && pending[in] == nil {
					next = append(next, in)
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("derivation hashes: %w", err)
		}
		ask = next
	}
	var hash func(string) (nix.DrvHash, error)
	hash = func(p string) (nix.DrvHash, error) {
		if h, ok := out[p]; ok {
			return h, nil
		}
		drv := pending[p]
		if drv == nil {
			return nix.DrvHash{}, fmt.Errorf("%s is not in the cache", p)
		}
		if err := drv.CheckOutputs(p, hash); err != nil {
			return nix.DrvHash{}, err
		}
		h, err := drv.Hash(p, hash)
		if err == nil {
			out[p] = h
		}
		return h, err
	}
	for p := range pending {
		if _, err := hash(p); err != nil {
			return nil, fmt.Errorf("derivation hashes: %w", err)
		}
	}
	asked := make(map[string]nix.DrvHash, len(paths))
	for _, p := range paths {
		if h, ok := out[p]; ok {
			asked[p] = h
		}
	}
	return asked, nil
}

// NarInfo returns the narinfo of the .drv with hash part hash; ErrNotFound if there is none.
func (d *Derivations) NarInfo(ctx context.Context, hash string) ([]byte, Info, error) {
	var body string
	var created time.Time
	err := d.db.QueryRow(ctx, sqlDrvNarInfo, hash).Scan(&body, &created)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, Info{}, ErrNotFound
	}
	if err != nil {
		return nil, Info{}, fmt.Errorf("read .drv narinfo %s: %w", hash, err)
	}
	key := hash + ".narinfo"
	return []byte(body), Info{Key: key, Size: int64(len(body)), ModTime: created, ContentType: ContentTypeFor(key)}, nil
}

// NAR returns the NAR under key (nar/<narhash>.nar); ErrNotFound if no .drv has it.
func (d *Derivations) NAR(ctx context.Context, key string) ([]byte, Info, error) {
	h, ok := strings.CutSuffix(strings.TrimPrefix(key, "nar/"), ".nar")
	if !ok || !IsPlainNAR(key) || !isNix32(h, 52) {
		return nil, Info{}, ErrNotFound
	}
	var text []byte
	var created time.Time
	err := d.db.QueryRow(ctx, sqlDrvNAR, h).Scan(&text, &created)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, Info{}, ErrNotFound
	}
	if err != nil {
		return nil, Info{}, fmt.Errorf("read .drv NAR %s: %w", key, err)
	}
	nar := nix.FileNAR(text, false)
	return nar, Info{Key: key, Size: int64(len(nar)), ModTime: created, ContentType: ContentTypeFor(key)}, nil
}

// Has returns those of hashes (store path hash parts) that are stored.
func (d *Derivations) Has(ctx context.Context, hashes []string) ([]string, error) {
	rows, err := d.db.Query(ctx, sqlDrvsHave, hashes)
	if err != nil {
		return nil, fmt.Errorf("look up derivations: %w", err)
	}
	have, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("look up derivations: %w", err)
	}
	return have, nil
}

// List calls fn for every stored .drv object.
func (d *Derivations) List(ctx context.Context, fn func(DrvInfo) error) error {
	rows, err := d.db.Query(ctx, sqlListDrvs)
	if err != nil {
		return fmt.Errorf("list derivations: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var di DrvInfo
		var narHash string
		if err := rows.Scan(&di.Hash, &narHash, &di.NarInfoSize, &di.NarSize, &di.Created); err != nil {
			return fmt.Errorf("list derivations: %w", err)
		}
		di.NarKey = "nar/" + narHash + ".nar"
		if err := fn(di); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("list derivations: %w", err)
	}
	return nil
}

// Delete removes the .drv objects with hash parts hashes (narinfo and NAR) and returns those it
// deleted.
func (d *Derivations) Delete(ctx context.Context, hashes []string) ([]string, error) {
	rows, err := d.db.Query(ctx, sqlDeleteDrvs, hashes)
	if err != nil {
		return nil, fmt.Errorf("delete derivations: %w", err)
	}
	deleted, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("delete derivations: %w", err)
	}
	return deleted, nil
}
