package node_test

import (
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }
