package bench

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// pollInterval is how often WaitFor and WaitUntil look again: short against the seconds a
// benchmark's phase takes, long enough not to load the database it polls.
const pollInterval = 20 * time.Millisecond

// WaitFor polls cond until it holds, a node reports on stopped that it stopped, or ctx ends.
func WaitFor(ctx context.Context, stopped <-chan error, cond func() (bool, error)) error {
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-stopped:
			return errors.Join(errors.New("node stopped"), err)
		case <-time.After(pollInterval):
		}
	}
}

// WaitUntil polls cond until it holds, limit passes, or ctx ends.
func WaitUntil(ctx context.Context, limit time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(limit)
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pollInterval):
		}
	}
}
