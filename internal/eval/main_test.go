package eval_test

import (
	"os"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
)

// The integration tests of this package run against a private PostgreSQL (one per test
// binary, a fresh database per test), real Nix and real git.
func TestMain(m *testing.M) {
	dbtest.Main(m, func() {
		if gateDirPath != "" {
			os.RemoveAll(gateDirPath)
		}
	})
}
