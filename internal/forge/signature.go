package forge

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"strconv"
	"strings"
)

// RepositorySecret is the webhook secret of one repository's hook: the hex HMAC-SHA256, under
// the forge's configured secret, of the repository's forge id. A repository admin who reads it
// from their hook's settings can sign deliveries for that repository only, and nothing new is
// stored: the secret is derived again for every delivery.
func RepositorySecret(forgeSecret []byte, forgeID int64) []byte {
	mac := hmac.New(sha256.New, forgeSecret)
	mac.Write([]byte("harmonia-ci webhook secret of repository " + strconv.FormatInt(forgeID, 10)))
	return []byte(hex.EncodeToString(mac.Sum(nil)))
}

// Verifier checks a delivery's signature while its body streams: the body is written to it
// (it keeps nothing but the running MAC), then Verify compares in constant time.
type Verifier struct {
	mac    hash.Hash
	want   []byte
	header string
}

// newVerifier parses the hex signature got of header, to be checked against a MAC under
// secret. An empty secret never matches: a forge without a webhook secret accepts no
// delivery.
func newVerifier(secret []byte, got, header string) (*Verifier, error) {
	if len(secret) == 0 {
		return nil, fmt.Errorf("%w: no webhook secret configured", ErrSignature)
	}
	if got == "" {
		return nil, fmt.Errorf("%w: no %s header", ErrSignature, header)
	}
	want, err := hex.DecodeString(strings.TrimSpace(got))
	if err != nil || len(want) != sha256.Size {
		return nil, fmt.Errorf("%w: %s is not a hex SHA-256", ErrSignature, header)
	}
	return &Verifier{mac: hmac.New(sha256.New, secret), want: want, header: header}, nil
}

// Write adds body bytes to the MAC; it never fails.
func (v *Verifier) Write(p []byte) (int, error) { return v.mac.Write(p) }

// Verify reports whether the bytes written carry the delivery's signature: nil, or an error
// wrapping ErrSignature.
func (v *Verifier) Verify() error {
	if !hmac.Equal(v.mac.Sum(nil), v.want) {
		return fmt.Errorf("%w: %s does not match", ErrSignature, v.header)
	}
	return nil
}

// Sign returns the hex HMAC-SHA256 of body under secret: what forges put in their signature
// headers (GitHub prefixes it with "sha256="). Tests and the webhook benchmark sign with it.
func Sign(secret, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	return hex.EncodeToString(mac.Sum(nil))
}
