package build_test

import (
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
)

// The tests of the build package run against a real PostgreSQL (one database per test).
func TestMain(m *testing.M) { dbtest.Main(m) }
