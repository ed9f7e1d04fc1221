package config

import (
	"os"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// checkSecretFile refuses a secret file that other users can read, with the fix; its group may
// read it (see nix.CheckSecretMode, the one rule for every secret file). A file it cannot stat
// is left to the read that follows, which says why.
func checkSecretFile(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return nil
	}
	return nix.CheckSecretMode(path, fi.Mode())
}
