package cli

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

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
are generated once into the state directory (admin-token, cluster-token; mode 0600).`,
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
// signing-key.pub, for Nix clients' trusted-public-keys) on first use.
func ensureSigningKey(stateDir, nodeID string) (string, error) {
	path := filepath.Join(stateDir, "signing-key")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	key, err := nix.GenerateKey(nodeID + "-1")
	if err != nil {
		return "", fmt.Errorf("generate signing key: %w", err)
	}
	if err := key.WriteFile(path, false); err != nil {
		return "", fmt.Errorf("write signing key: %w", err)
	}
	if err := key.Public().WriteFile(path+".pub", true); err != nil {
		return "", fmt.Errorf("write signing key: %w", err)
	}
	return path, nil
}

// ensureToken returns the token in path, creating it with a random value on first use.
func ensureToken(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err == nil && len(strings.TrimSpace(string(data))) > 0 {
		return strings.TrimSpace(string(data)), nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("read token %s: %w", path, err)
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate token: %w", err)
	}
	token := hex.EncodeToString(b)
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write token %s: %w", path, err)
	}
	return token, nil
}
