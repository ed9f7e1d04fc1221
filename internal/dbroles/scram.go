package dbroles

import (
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"regexp"
)

// scramIterations is PostgreSQL's default (scram_iterations).
const scramIterations = 4096

// verifierPattern is what ScramVerifier returns: SCRAM-SHA-256$iterations:salt$StoredKey:ServerKey.
var verifierPattern = regexp.MustCompile(`^SCRAM-SHA-256\$[0-9]+:[A-Za-z0-9+/=]+\$[A-Za-z0-9+/=]+:[A-Za-z0-9+/=]+$`)

// ScramVerifier computes the SCRAM-SHA-256 verifier PostgreSQL stores for password (RFC 5802
// and 7677, as PostgreSQL's own clients compute it), so that ALTER ROLE carries the verifier
// and the password itself never reaches the server or its statement log. The password is
// used as given (no SASLprep): ASCII passwords, such as generated ones, are unaffected.
func ScramVerifier(password string) (string, error) {
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return "", fmt.Errorf("scram salt: %w", err)
	}
	return scramVerifier(password, salt, scramIterations)
}

func scramVerifier(password string, salt []byte, iterations int) (string, error) {
	if password == "" {
		return "", fmt.Errorf("empty password")
	}
	salted, err := pbkdf2.Key(sha256.New, password, salt, iterations, sha256.Size)
	if err != nil {
		return "", fmt.Errorf("scram: %w", err)
	}
	clientKey := hmacSHA256(salted, "Client Key")
	storedKey := sha256.Sum256(clientKey)
	serverKey := hmacSHA256(salted, "Server Key")
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", iterations, b64(salt), b64(storedKey[:]), b64(serverKey)), nil
}

func hmacSHA256(key []byte, msg string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}
