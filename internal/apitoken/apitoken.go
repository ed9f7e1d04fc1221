// Package apitoken is the HTTP API's bearer tokens: a user's personal tokens, minted in the web
// UI, which are that user; and machine tokens, minted by an admin on the command line, which are
// either admin or read a set of projects. Only a token's sha256 is stored. The binary cache's
// tokens are another kind (package cache): neither is accepted where the other is expected.
package apitoken

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

// Prefix begins every API token, so that secret scanners and people recognise one.
const Prefix = "hci_"

// MaxName bounds a token's name.
const MaxName = 100

// Identity is who a live token is.
type Identity struct {
	ID   int64
	Name string
	// Forge, Login and UserID are a personal token's user; empty for a machine token.
	Forge, Login string
	UserID       int64
	// Admin is a machine token minted --admin.
	Admin bool
	// Repos are the repositories ("forge/full name") a machine token reads.
	Repos []string
	// LastUsed is when the token was last used, to the minute; nil: never.
	LastUsed *time.Time
}

// Machine reports whether the token has no user.
func (i Identity) Machine() bool { return i.UserID == 0 }

// Lookup is the live token token: ok false for anything else (not an API token, unknown,
// revoked or expired).
func Lookup(ctx context.Context, conn db.DBTX, token string) (Identity, bool, error) {
	var id Identity
	if !strings.HasPrefix(token, Prefix) {
		return id, false, nil
	}
	h := httpapi.HashToken(token)
	err := conn.QueryRow(ctx, sqlLookup, h[:]).Scan(&id.ID, &id.Name, &id.Forge, &id.UserID, &id.Login, &id.Admin, &id.Repos, &id.LastUsed)
	if errors.Is(err, pgx.ErrNoRows) {
		return Identity{}, false, nil
	}
	if err != nil {
		return Identity{}, false, fmt.Errorf("api token: %w", err)
	}
	return id, true, nil
}

// TouchEvery is how often a token's last use is written.
const TouchEvery = time.Minute

// Touch records that token id was used now, if it was not within TouchEvery.
func Touch(ctx context.Context, conn db.DBTX, id int64) error {
	if _, err := conn.Exec(ctx, sqlTouch, id); err != nil {
		return fmt.Errorf("api token %d: last use: %w", id, err)
	}
	return nil
}

// ErrTooMany is MintUser's error when the user has maxLive live tokens.
var ErrTooMany = errors.New("too many live api tokens")

// CheckName checks a token's name: one line of printable characters, at most MaxName bytes.
func CheckName(name string) error {
	if name == "" || len(name) > MaxName || strings.ContainsFunc(name, func(c rune) bool { return c < ' ' || c == 0x7f }) {
		return fmt.Errorf("a token's name is one line of 1 to %d printable bytes", MaxName)
	}
	return nil
}

// Minted is a token just minted: the only time the token itself is known.
type Minted struct {
	ID        int64
	Token     string
	ExpiresAt time.Time
}

// MintUser mints a personal token of user userID of forge (login: what the forge's permission
// API is asked with), valid days; ErrTooMany when they have maxLive live tokens.
func MintUser(ctx context.Context, conn db.DBTX, forge string, userID int64, login, name string, days, maxLive int) (Minted, error) {
	if err := CheckName(name); err != nil {
		return Minted{}, err
	}
	token, err := httpapi.NewToken(Prefix)
	if err != nil {
		return Minted{}, err
	}
	h := httpapi.HashToken(token)
	m := Minted{Token: token}
	err = conn.QueryRow(ctx, sqlInsertUser, h[:], name, days, forge, userID, login, maxLive).Scan(&m.ID, &m.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Minted{}, ErrTooMany
	}
	if err != nil {
		return Minted{}, fmt.Errorf("mint api token: %w", err)
	}
	return m, nil
}

// MintMachine mints a machine token valid until expires: admin, or reading projects (every one
// must exist).
func MintMachine(ctx context.Context, conn db.DBTX, name string, expires time.Time, admin bool, projects []string) (Minted, error) {
	if err := CheckName(name); err != nil {
		return Minted{}, err
	}
	if admin == (len(projects) > 0) {
		return Minted{}, errors.New("a machine token is either admin or reads projects")
	}
	token, err := httpapi.NewToken(Prefix)
	if err != nil {
		return Minted{}, err
	}
	h := httpapi.HashToken(token)
	m := Minted{Token: token, ExpiresAt: expires}
	err = conn.QueryRow(ctx, sqlInsertMachine, h[:], name, expires, admin, projects).Scan(&m.ID)
	if errors.Is(err, pgx.ErrNoRows) {
		return Minted{}, fmt.Errorf("mint api token: a project of %s does not exist", strings.Join(projects, ", "))
	}
	if err != nil {
		return Minted{}, fmt.Errorf("mint api token: %w", err)
	}
	return m, nil
}

// Info is a token as listed: never the token itself.
type Info struct {
	ID   int64  `json:"id"`
	Name string `json:"name"`
	// Owner is a personal token's user ("forge:login"); "" for a machine token.
	Owner      string     `json:"owner,omitempty"`
	Admin      bool       `json:"admin,omitempty"`
	Projects   []string   `json:"projects,omitempty"`
	ExpiresAt  time.Time  `json:"expires_at"`
	RevokedAt  *time.Time `json:"revoked_at,omitempty"`
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	Live       bool       `json:"live"`
}

// List is the tokens of user userID of forge, newest first, at most limit; forge "" lists
// everyone's.
func List(ctx context.Context, conn db.DBTX, forge string, userID int64, limit int) ([]Info, error) {
	rows, err := conn.Query(ctx, sqlList, forge, userID, limit)
	if err != nil {
		return nil, fmt.Errorf("api tokens: %w", err)
	}
	var t Info
	out := []Info{}
	_, err = pgx.ForEachRow(rows, []any{&t.ID, &t.Name, &t.Owner, &t.Admin, &t.Projects, &t.ExpiresAt, &t.RevokedAt,
		&t.LastUsedAt, &t.CreatedAt, &t.Live}, func() error {
		out = append(out, t)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("api tokens: %w", err)
	}
	return out, nil
}

// ErrNoToken is Revoke's error for a token that is not live (or not the user's).
var ErrNoToken = errors.New("no such live api token")

// Revoke revokes token id, if it is user userID of forge's (forge "": anyone's). It takes effect
// at the token's next request.
func Revoke(ctx context.Context, conn db.DBTX, id int64, forge string, userID int64) error {
	tag, err := conn.Exec(ctx, sqlRevoke, id, forge, userID)
	if err != nil {
		return fmt.Errorf("revoke api token %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("revoke api token %d: %w", id, ErrNoToken)
	}
	return nil
}
