package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/spf13/cobra"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// newKeygen creates a binary cache signing key in Nix's format, so the same files work with
// harmonia-ci's signer and with Nix's own secret-key-files / trusted-public-keys.
func newKeygen() *cobra.Command {
	var name, secretFile, publicFile string
	var force bool
	cmd := &cobra.Command{
		Use:   "keygen --name NAME --secret-key-file PATH [--public-key-file PATH]",
		Short: "Generate a Nix binary cache signing key pair",
		Long: "Generate an ed25519 signing key in Nix's format. The secret key is written to\n" +
			"--secret-key-file (mode 0600); the public key, for trusted-public-keys, is printed\n" +
			"and, with --public-key-file, also written there (mode 0644). Existing files are\n" +
			"never overwritten without --force.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if name == "" {
				return errors.New("--name is required (conventionally the cache host name plus a generation, e.g. cache.example.org-1)")
			}
			if secretFile == "" {
				return errors.New("--secret-key-file is required: the secret key is never printed")
			}
			if publicFile == secretFile {
				return errors.New("--public-key-file must differ from --secret-key-file")
			}
			// Check both targets before writing either, so a refusal leaves nothing half done.
			if !force {
				for flag, path := range map[string]string{"--secret-key-file": secretFile, "--public-key-file": publicFile} {
					if path == "" {
						continue
					}
					if _, err := os.Lstat(path); err == nil {
						return fmt.Errorf("%s: %s already exists (use --force to replace it)", flag, path)
					} else if !errors.Is(err, fs.ErrNotExist) {
						return fmt.Errorf("%s: %w", flag, err)
					}
				}
			}
			key, err := nix.GenerateKey(name)
			if err != nil {
				return fmt.Errorf("--name: %w", err)
			}
			if err := key.WriteFile(secretFile, force); err != nil {
				return fmt.Errorf("--secret-key-file: %w", err)
			}
			if publicFile != "" {
				if err := key.Public().WriteFile(publicFile, force); err != nil {
					return fmt.Errorf("--public-key-file: %w", err)
				}
			}
			fmt.Fprintln(cmd.OutOrStdout(), key.Public().String())
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "key name, e.g. cache.example.org-1 (no ':' or whitespace)")
	f.StringVar(&secretFile, "secret-key-file", "", "where to write the secret key (required)")
	f.StringVar(&publicFile, "public-key-file", "", "also write the public key here")
	f.BoolVar(&force, "force", false, "replace existing key files")
	return cmd
}
