package web

import (
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
)

// The tests of the web package run against a real PostgreSQL (one database per test).
func TestMain(m *testing.M) { dbtest.Main(m) }
