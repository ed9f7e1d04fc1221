package gc

import "context"

// SetAfterMark runs f between the mark and the sweep of c's collections.
func (c *Collector) SetAfterMark(f func(ctx context.Context)) { c.afterMark = f }
