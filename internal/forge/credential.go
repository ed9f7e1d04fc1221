package forge

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/pem"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/crypto/ssh"
)

// deployKey is the read-only deploy key of repository forgeID: an Ed25519 key whose seed is
// the HMAC-SHA256, under the forge's configured secret, of the repository's forge id. Like the
// webhook secrets (RepositorySecret) it is derived again whenever it is needed, so nothing
// secret is stored, and a key read off one repository opens no other.
func deployKey(forgeSecret []byte, forgeID int64) ed25519.PrivateKey {
	mac := hmac.New(sha256.New, forgeSecret)
	mac.Write([]byte("harmonia-ci deploy key of repository " + strconv.FormatInt(forgeID, 10)))
	return ed25519.NewKeyFromSeed(mac.Sum(nil))
}

// deployKeyTitle names the deploy keys harmonia-ci registers.
const deployKeyTitle = "harmonia-ci (read-only, evaluations)"

// authorizedKey is key's public half as an authorized_keys line, without a comment.
func authorizedKey(key ed25519.PrivateKey) (string, error) {
	pub, err := ssh.NewPublicKey(key.Public())
	if err != nil {
		return "", fmt.Errorf("deploy key: %w", err)
	}
	return strings.TrimSuffix(string(ssh.MarshalAuthorizedKey(pub)), "\n"), nil
}

// fingerprint is key's SHA256 fingerprint as ssh-keygen -l prints it (and Gitea lists it).
func fingerprint(key ed25519.PrivateKey) (string, error) {
	pub, err := ssh.NewPublicKey(key.Public())
	if err != nil {
		return "", fmt.Errorf("deploy key: %w", err)
	}
	return ssh.FingerprintSHA256(pub), nil
}

// openSSHPrivateKey is key in OpenSSH's private key format, as ssh -i reads it.
func openSSHPrivateKey(key ed25519.PrivateKey) (string, error) {
	block, err := ssh.MarshalPrivateKey(key, "")
	if err != nil {
		return "", fmt.Errorf("deploy key: %w", err)
	}
	return string(pem.EncodeToMemory(block)), nil
}
