package cli

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

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

// readToken returns the trimmed token in path and whether the file exists.
func readToken(path string) (string, bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read token %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", true, fmt.Errorf("read token %s: %w", path, err)
	}
	if err := nix.CheckSecretMode(path, fi.Mode()); err != nil {
		return "", true, fmt.Errorf("token: %w", err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return "", true, fmt.Errorf("read token %s: %w", path, err)
	}
	return strings.TrimSpace(string(data)), true, nil
}

// createSecretFile creates path holding data, mode 0600, failing with fs.ErrExist if it exists.
// The data is written to a new file (O_CREATE|O_EXCL, 0600, which a umask can only narrow) that
// is then linked into place, so a concurrent reader never sees a partly written secret.
func createSecretFile(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Link(f.Name(), path)
}
