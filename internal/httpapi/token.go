package httpapi

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
)

// BearerToken returns the token of an "Authorization: Bearer <token>" header.
func BearerToken(r *http.Request) (string, bool) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// TokenHash is the sha256 of a token. Tokens are compared by their hashes in constant time, so
// neither the content nor the length of the expected token leaks through timing.
type TokenHash [sha256.Size]byte

// HashToken returns the hash of token.
func HashToken(token string) TokenHash { return sha256.Sum256([]byte(token)) }

// Matches reports whether token hashes to h.
func (h TokenHash) Matches(token string) bool {
	got := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(got[:], h[:]) == 1
}

// NewToken is a fresh random secret: prefix (which names its kind, for secret scanners and for
// people) and 32 random bytes in URL-safe base64.
func NewToken(prefix string) (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("new token: %w", err)
	}
	return prefix + base64.RawURLEncoding.EncodeToString(b), nil
}
