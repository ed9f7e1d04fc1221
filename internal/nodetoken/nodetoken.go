// Package nodetoken is how a node proves to the signer who it is and in which roles it may act.
//
// A node token names a node and its roles and carries an HMAC-SHA256 of both, keyed by the
// cluster secret:
//
//	hci1:<node id>:<role>,<role>:<base64url mac>
//
// Only signer nodes hold the cluster secret (and the operator who issues tokens with
// `harmonia-ci node-token`); builders and evaluators hold only their own token. A token therefore
// cannot be stretched to another node id or another role, and the database — which every node
// can write — plays no part in checking it.
package nodetoken

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// prefix starts every token; the version lets the format change without ambiguity.
const prefix = "hci1"

// MinSecretLen is the shortest cluster secret accepted, in bytes.
const MinSecretLen = 16

// Identity is who a valid token speaks for.
type Identity struct {
	NodeID string
	Roles  []string // sorted
}

// Has reports whether the identity may act in role.
func (id Identity) Has(role string) bool { return slices.Contains(id.Roles, role) }

// ErrInvalid is the error of a token that is malformed or not signed by the cluster secret.
var ErrInvalid = errors.New("invalid node token")

var (
	nodeIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)
	rolePattern   = regexp.MustCompile(`^[a-z]{1,32}$`)
)

// Key signs and verifies node tokens. It is derived from the cluster secret, so the same secret
// can key other things (the local store's upload URLs) without one forging the other.
type Key struct{ mac, ticket []byte }

// NewKey derives the token key from the cluster secret.
func NewKey(secret string) (*Key, error) {
	if len(secret) < MinSecretLen {
		return nil, fmt.Errorf("cluster secret is %d bytes, want at least %d", len(secret), MinSecretLen)
	}
	return &Key{mac: Derive(secret, "node token"), ticket: Derive(secret, "evaluation ticket")}, nil
}

// Derive returns a 32-byte key for purpose from the cluster secret.
func Derive(secret, purpose string) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("harmonia-ci " + purpose))
	return m.Sum(nil)
}

// Issue returns the token of node id in roles.
func (k *Key) Issue(id Identity) (string, error) {
	roles, err := normalise(id)
	if err != nil {
		return "", err
	}
	body := prefix + ":" + id.NodeID + ":" + strings.Join(roles, ",")
	return body + ":" + base64.RawURLEncoding.EncodeToString(k.sum(body)), nil
}

// Verify returns the identity token speaks for, or an error wrapping ErrInvalid.
func (k *Key) Verify(token string) (Identity, error) {
	id, body, mac, err := parse(token)
	if err != nil {
		return Identity{}, err
	}
	if !hmac.Equal(mac, k.sum(body)) {
		return Identity{}, fmt.Errorf("%w: not signed by this cluster's secret", ErrInvalid)
	}
	return id, nil
}

// Parse returns the identity a token claims without checking its signature: a node reads its
// own token with it, to check it names this node.
func Parse(token string) (Identity, error) {
	id, _, _, err := parse(token)
	return id, err
}

func parse(token string) (Identity, string, []byte, error) {
	parts := strings.Split(token, ":")
	if len(parts) != 4 || parts[0] != prefix {
		return Identity{}, "", nil, fmt.Errorf("%w: want %s:<node id>:<roles>:<mac>", ErrInvalid, prefix)
	}
	id := Identity{NodeID: parts[1], Roles: strings.Split(parts[2], ",")}
	roles, err := normalise(id)
	if err != nil {
		return Identity{}, "", nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if !slices.Equal(roles, id.Roles) {
		return Identity{}, "", nil, fmt.Errorf("%w: roles are not sorted and unique", ErrInvalid)
	}
	mac, err := base64.RawURLEncoding.DecodeString(parts[3])
	if err != nil || len(mac) != sha256.Size {
		return Identity{}, "", nil, fmt.Errorf("%w: malformed mac", ErrInvalid)
	}
	return id, strings.Join(parts[:3], ":"), mac, nil
}

func normalise(id Identity) ([]string, error) {
	if !nodeIDPattern.MatchString(id.NodeID) {
		return nil, fmt.Errorf("node id %q: letters, digits, '.', '_', '-'; at most 63 characters", id.NodeID)
	}
	if len(id.Roles) == 0 {
		return nil, errors.New("no roles")
	}
	for _, r := range id.Roles {
		if !rolePattern.MatchString(r) {
			return nil, fmt.Errorf("role %q: lowercase letters only", r)
		}
	}
	roles := slices.Sorted(slices.Values(id.Roles))
	return slices.Compact(roles), nil
}

func (k *Key) sum(body string) []byte {
	m := hmac.New(sha256.New, k.mac)
	m.Write([]byte(body))
	return m.Sum(nil)
}
