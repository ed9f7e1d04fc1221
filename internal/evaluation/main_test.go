package evaluation_test

import (
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
)

// The database tests run against a private PostgreSQL (a fresh database per test).
func TestMain(m *testing.M) { dbtest.Main(m) }
