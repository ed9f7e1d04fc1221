package builder_test

import (
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
)

// The tests of the builder package run against a real PostgreSQL (one database per test).
func TestMain(m *testing.M) { dbtest.Main(m) }
