package builder

import "context"

// SetFreeSpaceFunc replaces the statfs of b's store GC, so tests report the free space they
// need; call it before Start.
func (b *Builder) SetFreeSpaceFunc(f func(dir string) (int64, error)) { b.gc.freeFunc = f }

// CollectGarbage is the builder's free-space check run now, in the foreground: it waits for a
// collection already running, and does not wait out the pause after one that could not free
// MinFree. It reports whether it collected.
func (b *Builder) CollectGarbage(ctx context.Context) (bool, error) { return b.gc.collectNow(ctx) }
