package forge

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// checkHMAC compares a hex HMAC-SHA256 of body under secret with got, in constant time. An
// empty secret never matches: a forge without a webhook secret accepts no delivery.
func checkHMAC(secret, body []byte, got, header string) error {
	if len(secret) == 0 {
		return fmt.Errorf("%w: no webhook secret configured", ErrSignature)
	}
	if got == "" {
		return fmt.Errorf("%w: no %s header", ErrSignature, header)
	}
	want, err := hex.DecodeString(strings.TrimSpace(got))
	if err != nil {
		return fmt.Errorf("%w: %s is not hex", ErrSignature, header)
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	if !hmac.Equal(mac.Sum(nil), want) {
		return fmt.Errorf("%w: %s does not match", ErrSignature, header)
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
