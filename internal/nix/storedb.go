package nix

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	_ "modernc.org/sqlite" // pure Go, so the binaries stay static and need no libsqlite3
)

// storeDBPath is where Nix keeps its database, relative to the store's root.
const storeDBPath = "nix/var/nix/db/db.sqlite"

// storeDBChunk bounds the paths one query looks up.
const storeDBChunk = 500

// StoreDB reads a local Nix store's SQLite database directly: asking nix-store or the daemon
// about thousands of paths costs a process or a round trip per batch, a query costs
// microseconds.
type StoreDB struct {
	db   *sql.DB
	path string
}

// OpenStoreDB opens the database of the store rooted at storeRoot read-only: "" for the
// system store (/nix/var/nix/db/db.sqlite), or the directory of a chroot store.
func OpenStoreDB(storeRoot string) (*StoreDB, error) {
	if storeRoot == "" {
		storeRoot = "/"
	}
	root, err := filepath.Abs(storeRoot)
	if err != nil {
		return nil, fmt.Errorf("open store db: %w", err)
	}
	path := filepath.Join(root, storeDBPath)
	// SQLite would report a missing file only at the first query, and less clearly.
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("open store db: %w", err)
	}
	// mode=ro: we must never write to Nix's database. Nix writes concurrently (WAL), and a
	// checkpoint briefly locks out readers, so wait for locks instead of failing with
	// SQLITE_BUSY. The file: URI form is needed for mode=ro to reach SQLite; url.URL
	// escapes any '?' or '#' in the path.
	dsn := (&url.URL{
		Scheme:   "file",
		Path:     path,
		RawQuery: "mode=ro&_pragma=busy_timeout(10000)",
	}).String()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open store db %s: %w", path, err)
	}
	if err := db.Ping(); err != nil {
		db.Close()
		return nil, fmt.Errorf("open store db %s: %w", path, err)
	}
	return &StoreDB{db: db, path: path}, nil
}

// Close closes the database.
func (s *StoreDB) Close() error { return s.db.Close() }

// PathInfo is what Nix's database records about a valid store path.
type PathInfo struct {
	Path       string
	NarHash    string // "sha256:<nix32>" (converted from the database's base16)
	NarSize    int64
	References []string // full store paths, sorted
	Deriver    string   // full path or ""
}

// PathInfos returns the infos of those paths that are valid; missing ones are absent from the
// map. Malformed paths are an error rather than "missing", since they indicate a caller bug.
func (s *StoreDB) PathInfos(ctx context.Context, paths []string) (map[string]PathInfo, error) {
	for _, p := range paths {
		if _, err := ParseStorePath(p); err != nil {
			return nil, fmt.Errorf("query store db: %w", err)
		}
	}
	paths = sortedSet(paths)
	infos := make(map[string]PathInfo, len(paths))
	// One read transaction gives every chunk the same snapshot, so a path and its references
	// cannot be seen half-registered or half-deleted by a concurrent Nix.
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("query store db %s: %w", s.path, err)
	}
	defer tx.Rollback()
	for chunk := range slices.Chunk(paths, storeDBChunk) {
		if err := queryPathInfos(ctx, tx, chunk, infos); err != nil {
			return nil, fmt.Errorf("query store db %s: %w", s.path, err)
		}
	}
	return infos, nil
}

// queryPathInfos adds the valid paths among chunk to infos.
func queryPathInfos(ctx context.Context, tx *sql.Tx, chunk []string, infos map[string]PathInfo) error {
	list, err := json.Marshal(chunk)
	if err != nil {
		return err
	}
	rows, err := tx.QueryContext(ctx, sqlStorePathInfos, string(list))
	if err != nil {
		return err
	}
	byID := map[int64]string{}
	for rows.Next() {
		var (
			id         int64
			path, hash string
			narSize    sql.NullInt64
			deriver    sql.NullString
		)
		if err := rows.Scan(&id, &path, &hash, &narSize, &deriver); err != nil {
			rows.Close()
			return err
		}
		narHash, err := dbNarHash(hash)
		if err != nil {
			rows.Close()
			return fmt.Errorf("%s: %w", path, err)
		}
		byID[id] = path
		infos[path] = PathInfo{
			Path:       path,
			NarHash:    narHash,
			NarSize:    narSize.Int64,
			References: []string{},
			Deriver:    deriver.String,
		}
	}
	if err := rows.Close(); err != nil {
		return err
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(byID) == 0 {
		return nil
	}

	ids := make([]int64, 0, len(byID))
	for id := range byID {
		ids = append(ids, id)
	}
	if list, err = json.Marshal(ids); err != nil {
		return err
	}
	rows, err = tx.QueryContext(ctx, sqlStoreReferences, string(list))
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			referrer int64
			ref      string
		)
		if err := rows.Scan(&referrer, &ref); err != nil {
			return err
		}
		info := infos[byID[referrer]]
		info.References = append(info.References, ref)
		infos[byID[referrer]] = info
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, p := range byID {
		slices.Sort(infos[p].References)
	}
	return nil
}

// dbNarHash converts the database's "sha256:<base16>" to the "sha256:<nix32>" spelling that
// narinfos and fingerprints use. Nix reads any spelling there, so nix32 is accepted as well.
func dbNarHash(h string) (string, error) {
	rest, ok := strings.CutPrefix(h, "sha256:")
	if !ok {
		return "", fmt.Errorf("unsupported nar hash %q", h)
	}
	if len(rest) == sha256Nix32Len {
		if _, err := ParseSHA256(h); err != nil {
			return "", err
		}
		return h, nil
	}
	b, err := hex.DecodeString(rest)
	if err != nil || len(b) != sha256.Size {
		return "", fmt.Errorf("invalid nar hash %q", h)
	}
	return FormatSHA256([sha256.Size]byte(b)), nil
}
