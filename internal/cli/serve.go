package cli

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/node"
)

func newServe(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "serve",
		Short: "Run a node with the configured roles",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load(cmd)
			if err != nil {
				return err
			}
			return runNode(cfg)
		},
	}
}

func newUp(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "up",
		Short: "Run a single-node cluster: every role, the embedded database, generated tokens",
		Long: `up runs the whole system on this machine: all roles on one node and, unless a database
URL is configured, a private PostgreSQL in the state directory. Tokens that are not configured
are generated once into the state directory (admin-token, cluster-secret; mode 0600).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.load(cmd)
			if err != nil {
				return err
			}
			if err := prepareSingleNode(cfg); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "harmonia-ci up: http://%s  (state: %s; admin token in %s; cache public key in %s)\n",
				cfg.Listen, cfg.StateDir, filepath.Join(cfg.StateDir, "admin-token"), filepath.Join(cfg.StateDir, "signing-key.pub"))
			return runNode(cfg)
		},
	}
}

func runNode(cfg *config.Config) error {
	logger := newLogger(cfg, os.Stderr)
	ctx, force, stop := signalContext()
	defer stop()
	return node.Run(ctx, cfg, logger, node.Options{Version: version(), Force: force})
}

// ensureSigningKey returns the path of the state directory's signing key, creating the key (and
// signing-key.pub, for Nix clients' trusted-public-keys) on first use, 0600 whatever the umask.
// An existing key that other users can read is refused rather than used.
func ensureSigningKey(stateDir, nodeID string) (string, error) {
	path := filepath.Join(stateDir, "signing-key")
	if fi, err := os.Stat(path); err == nil {
		if err := nix.CheckSecretMode(path, fi.Mode()); err != nil {
			return "", fmt.Errorf("signing key: %w", err)
		}
		return path, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("signing key: %w", err)
	}
	key, err := nix.GenerateKey(nodeID + "-1")
	if err != nil {
		return "", fmt.Errorf("generate signing key: %w", err)
	}
	// O_EXCL: a key another process wrote meanwhile is never replaced.
	if err := key.WriteFile(path, false); err != nil {
		return "", fmt.Errorf("write signing key: %w", err)
	}
	if err := key.Public().WriteFile(path+".pub", true); err != nil {
		return "", fmt.Errorf("write signing key: %w", err)
	}
	return path, nil
}

// ensureToken returns the token in path, creating it with a random value on first use. An
// existing token file that other users can read is refused rather than used.
func ensureToken(path string) (string, error) {
	token, found, err := readToken(path)
	if err != nil || token != "" {
		return token, err
	}
	if found {
		// Empty: nothing can rely on it. Replace it as if it were missing.
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("replace empty token %s: %w", path, err)
		}
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate token: %w", err)
	}
	token = hex.EncodeToString(b)
	err = createSecretFile(path, []byte(token+"\n"))
	if errors.Is(err, fs.ErrExist) {
		// Another process created it first: every user of the state directory takes its token.
		token, _, err = readToken(path)
		return token, err
	}
	if err != nil {
		return "", fmt.Errorf("write token %s: %w", path, err)
	}
	return token, nil
}
