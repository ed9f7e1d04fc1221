package blob_test

import (
	"context"
	"errors"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/blobtest"
)

// TestS3DeleteMany: one request deletes the keys it names, an absent one included, and leaves
// the others; more keys than a request takes, or an invalid one, are refused whole.
func TestS3DeleteMany(t *testing.T) {
	s, err := blob.NewS3(blobtest.StartMinIO(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, k := range []string{kNarinfo, kNarinfo2, kNar, kLog} {
		put(t, s, k, "body of "+k)
	}
	failed, err := s.DeleteMany(ctx, []string{kNarinfo, kNar, kListing})
	if err != nil || len(failed) != 0 {
		t.Fatalf("DeleteMany: failed %v, %v", failed, err)
	}
	for k, want := range map[string]bool{kNarinfo: false, kNar: false, kNarinfo2: true, kLog: true} {
		_, err := s.Head(ctx, k)
		if got := !errors.Is(err, blob.ErrNotFound); got != want {
			t.Errorf("%s present: %v, want %v (%v)", k, got, want, err)
		}
	}
	if failed, err := s.DeleteMany(ctx, []string{kLog, "../x"}); err == nil || len(failed) != 2 {
		t.Errorf("an invalid key: failed %v, %v; want both refused", failed, err)
	}
	if _, err := s.Head(ctx, kLog); err != nil {
		t.Errorf("a refused batch deleted %s: %v", kLog, err)
	}
	if _, err := s.DeleteMany(ctx, make([]string, blob.MaxBatchDelete+1)); err == nil {
		t.Error("a batch over MaxBatchDelete was accepted")
	}
}
