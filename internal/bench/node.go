package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/node"
)

// Node is a harmonia-ci node running in this process.
type Node struct {
	ID     string
	cancel context.CancelFunc
	ready  chan struct{} // closed by node.Options.Ready
	done   chan struct{} // closed when node.Run returned
	err    error
}

// StartNode runs a node with cfg in this process and returns at once; WaitReady waits for it to
// be ready. If the node stops on its own before ctx ends, its error goes to stopped (which must
// have room or a reader).
func StartNode(ctx context.Context, cfg *config.Config, logger *slog.Logger, opts node.Options, stopped chan<- error) *Node {
	nctx, cancel := context.WithCancel(ctx)
	n := &Node{ID: cfg.Node.ID, cancel: cancel, ready: make(chan struct{}), done: make(chan struct{})}
	opts.Ready = func() { close(n.ready) }
	go func() {
		defer close(n.done)
		n.err = node.Run(nctx, cfg, logger.With("node", n.ID), opts)
		if nctx.Err() == nil {
			stopped <- fmt.Errorf("node %s: %w", n.ID, n.err)
		}
	}()
	return n
}

// WaitReady waits until every node has started all its roles and registered itself active (the
// signal node.Run gives), one of them stops, or ctx ends.
func WaitReady(ctx context.Context, nodes ...*Node) error {
	for _, n := range nodes {
		select {
		case <-n.ready:
		case <-n.done:
			return fmt.Errorf("node %s stopped before it was ready: %w", n.ID, n.err)
		case <-ctx.Done():
			return fmt.Errorf("node %s not ready: %w", n.ID, ctx.Err())
		}
	}
	return nil
}

// Stop stops the node and waits for it; a node stopped by its context returns nil.
func (n *Node) Stop() error {
	n.cancel()
	<-n.done
	if errors.Is(n.err, context.Canceled) {
		return nil
	}
	return n.err
}

// StopNodes stops nodes at once and joins their errors.
func StopNodes(nodes []*Node) error {
	for _, n := range nodes {
		n.cancel()
	}
	var errs []error
	for _, n := range nodes {
		if err := n.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", n.ID, err))
		}
	}
	return errors.Join(errs...)
}
