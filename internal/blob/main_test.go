package blob_test

import (
	"os"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/blobtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	blobtest.Cleanup()
	os.Exit(code)
}
