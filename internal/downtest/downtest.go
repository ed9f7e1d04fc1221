// Package downtest stands in, for tests, for a server that is down.
package downtest

import (
	"errors"
	"net"
	"sync"
	"testing"
)

// URL returns the base URL ("http://host:port") of a listener that closes every
// connection it accepts before a byte is read: a server that is down. A closed port would do
// the same until another test's server is given it, and then "down" answers 404.
func URL(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err == nil {
				c.Close()
			}
		}
	}()
	tb.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return "http://" + ln.Addr().String()
}
