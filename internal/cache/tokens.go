package cache

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
)

// TokenInfo is a cache token as listed: never the token itself, which only its minting shows.
type TokenInfo struct {
	ID        int64      `json:"id"`
	Note      string     `json:"note"`
	Projects  []string   `json:"projects"`
	ExpiresAt time.Time  `json:"expires_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	// Owner is the user who minted it in the web UI ("forge:login"); "" for an admin's token.
	Owner string `json:"owner,omitempty"`
}

// MintToken stores a new read-only cache token for projects, valid until expires, and returns
// its id and the token (stored only as its hash). Every project must exist.
func MintToken(ctx context.Context, conn db.DBTX, projects []string, note string, expires time.Time) (int64, string, error) {
	if len(projects) == 0 {
		return 0, "", errors.New("cache token: no project")
	}
	token, err := NewToken()
	if err != nil {
		return 0, "", err
	}
	h := httpapi.HashToken(token)
	var id int64
	err = conn.QueryRow(ctx, sqlCacheTokenInsert, h[:], note, projects, expires).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, "", fmt.Errorf("cache token: a project of %s does not exist", strings.Join(projects, ", "))
	}
	if err != nil {
		return 0, "", fmt.Errorf("cache token: %w", err)
	}
	return id, token, nil
}

// ListTokens lists every cache token, newest first.
func ListTokens(ctx context.Context, conn db.DBTX) ([]TokenInfo, error) {
	rows, err := conn.Query(ctx, sqlCacheTokenList)
	if err != nil {
		return nil, fmt.Errorf("cache tokens: %w", err)
	}
	var t TokenInfo
	var out []TokenInfo
	_, err = pgx.ForEachRow(rows, []any{&t.ID, &t.Note, &t.Projects, &t.ExpiresAt, &t.RevokedAt, &t.CreatedAt, &t.Owner}, func() error {
		out = append(out, t)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cache tokens: %w", err)
	}
	return out, nil
}

// ErrNoToken is the error of revoking a token that does not exist or is already revoked.
var ErrNoToken = errors.New("no such live cache token")

// RevokeToken revokes token id at once (cache nodes stop honouring it on their next lookup).
func RevokeToken(ctx context.Context, conn db.DBTX, id int64) error {
	tag, err := conn.Exec(ctx, sqlCacheTokenRevoke, id)
	if err != nil {
		return fmt.Errorf("revoke cache token %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("revoke cache token %d: %w", id, ErrNoToken)
	}
	return nil
}
