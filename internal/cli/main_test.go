package cli

import (
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
)

// The commands that read the database run against a private PostgreSQL (a fresh database per
// test).
func TestMain(m *testing.M) { dbtest.Main(m) }
