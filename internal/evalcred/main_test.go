package evalcred_test

import (
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
)

// The tests run against a private PostgreSQL (one per test binary, a fresh database per test)
// and a signer in the test's process.
func TestMain(m *testing.M) { dbtest.Main(m) }
