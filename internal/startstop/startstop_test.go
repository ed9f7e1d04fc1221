package startstop_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/startstop"
)

// TestLaunch: of many concurrent Starts one prepares and runs; a failed prepare starts
// nothing; after Stop the service can start again.
func TestLaunch(t *testing.T) {
	t.Parallel()
	var b startstop.Base
	var prepared, running atomic.Int64
	start := func() (bool, error) {
		return b.Launch(context.Background(), func() (func(context.Context), error) {
			prepared.Add(1)
			return func(ctx context.Context) {
				running.Add(1)
				defer running.Add(-1)
				<-ctx.Done()
			}, nil
		})
	}
	var wg sync.WaitGroup
	var started atomic.Int64
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := start()
			if err != nil {
				t.Errorf("Launch: %v", err)
			}
			if ok {
				started.Add(1)
			}
		}()
	}
	wg.Wait()
	if started.Load() != 1 || prepared.Load() != 1 {
		t.Errorf("%d started, %d prepared of 8 concurrent Starts, want 1 and 1", started.Load(), prepared.Load())
	}
	b.Stop()
	if running.Load() != 0 {
		t.Errorf("%d loops running after Stop, want 0", running.Load())
	}

	errPrepare := errors.New("prepare failed")
	ok, err := b.Launch(context.Background(), func() (func(context.Context), error) { return nil, errPrepare })
	if ok || !errors.Is(err, errPrepare) {
		t.Errorf("Launch with a failing prepare = %v, %v; want false, %v", ok, err, errPrepare)
	}

	if ok, err := start(); !ok || err != nil {
		t.Errorf("Launch after Stop = %v, %v; want true, nil", ok, err)
	}
	b.Stop()
	if prepared.Load() != 2 {
		t.Errorf("prepared %d times, want 2", prepared.Load())
	}
}
