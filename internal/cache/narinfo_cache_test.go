package cache_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/cache"
	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

// serveConfig is serve with a whole Config; its Store is wrapped in the returned recorder.
func serveConfig(t *testing.T, cfg cache.Config) (*httptest.Server, *recordingStore) {
	t.Helper()
	rec := &recordingStore{Store: cfg.Store}
	cfg.Store = rec
	mux := http.NewServeMux()
	cache.New(cfg).Register(access.NewRoutes(mux, nil))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, rec
}

// headersWithoutDate is h without the Date header, which changes by the second.
func headersWithoutDate(h http.Header) http.Header {
	h = h.Clone()
	h.Del("Date")
	return h
}

func equalHeaders(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// TestNarinfoFromMemory: a narinfo read once is answered from memory, byte-equal to the stored
// body and with the same headers as a cache that keeps nothing (the default, which asks the
// store every time); HEAD still asks the store.
func TestNarinfoFromMemory(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		store func(*testing.T) blob.Store
	}{
		{"local", newLocal},
		{"s3", newS3},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			store := c.store(t)
			fill(t, store)
			srv, rec := serveConfig(t, cache.Config{Store: store, NarinfoCacheBytes: cache.DefaultNarinfoCacheBytes})
			plain, plainRec := serveConfig(t, cache.Config{Store: store}) // keeps nothing
			stored := readStored(t, store, kNarinfo)

			var want response
			for i := range 2 {
				want = do(t, "GET", plain.URL+"/"+kNarinfo, nil)
				if want.status != 200 || !bytes.Equal(want.body, stored) {
					t.Fatalf("without memory: status %d, body %q", want.status, want.body)
				}
				if keys := plainRec.take(); !slices.Equal(keys, []string{kNarinfo}) {
					t.Errorf("without memory, GET %d: store asked for %q, want %q", i, keys, kNarinfo)
				}
			}
			for i, wantKeys := range [][]string{{kNarinfo}, nil, nil} {
				got := do(t, "GET", srv.URL+"/"+kNarinfo, nil)
				if keys := rec.take(); !slices.Equal(keys, wantKeys) {
					t.Errorf("GET %d: store asked for %q, want %q", i, keys, wantKeys)
				}
				if got.status != 200 || !bytes.Equal(got.body, stored) {
					t.Errorf("GET %d: status %d, body %q; want 200, %q", i, got.status, got.body, stored)
				}
				if g, w := headersWithoutDate(got.header), headersWithoutDate(want.header); !equalHeaders(g, w) {
					t.Errorf("GET %d: headers %v, want %v", i, g, w)
				}
			}
			head := do(t, "HEAD", srv.URL+"/"+kNarinfo, nil)
			if keys := rec.take(); !slices.Equal(keys, []string{kNarinfo}) {
				t.Errorf("HEAD: store asked for %q, want %q", keys, kNarinfo)
			}
			if g, w := headersWithoutDate(head.header), headersWithoutDate(want.header); !equalHeaders(g, w) {
				t.Errorf("HEAD: headers %v, want %v", g, w)
			}
		})
	}
}

// slowStore advances a clock while a Get runs, as a slow read would.
type slowStore struct {
	blob.Store
	clock *clock.Manual
	delay time.Duration
}

func (s *slowStore) Get(ctx context.Context, key string) (io.ReadCloser, blob.Info, error) {
	s.clock.Advance(s.delay)
	return s.Store.Get(ctx, key)
}

// TestNarinfoDeletedStopsBeingServed: a narinfo deleted from the store is 404 once the TTL
// has passed since the read that was remembered began.
func TestNarinfoDeletedStopsBeingServed(t *testing.T) {
	t.Parallel()
	const ttl = 10 * time.Second
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := newLocal(t)
	fill(t, store)
	srv, _ := serveConfig(t, cache.Config{Store: &slowStore{Store: store, clock: clk, delay: 2 * time.Second},
		NarinfoCacheBytes: cache.DefaultNarinfoCacheBytes, NarinfoCacheTTL: ttl, Clock: clk})

	if r := do(t, "GET", srv.URL+"/"+kNarinfo, nil); r.status != 200 {
		t.Fatalf("GET: status %d", r.status)
	}
	if err := store.Delete(context.Background(), kNarinfo); err != nil {
		t.Fatal(err)
	}
	// The read took 2 s: the entry lasts until 10 s after it began, 8 s from now.
	var since time.Duration
	for _, c := range []struct {
		advance time.Duration
		status  int
	}{
		{0, 200},
		{8*time.Second - time.Nanosecond, 200},
		{time.Nanosecond, 404},
		{time.Minute, 404},
	} {
		clk.Advance(c.advance)
		since += c.advance
		if r := do(t, "GET", srv.URL+"/"+kNarinfo, nil); r.status != c.status {
			t.Errorf("%v after the deletion: status %d, want %d", since, r.status, c.status)
		}
	}
}

// TestNarinfoDeletedRealClock: the same with the real clock and a short TTL, waiting with a
// deadline.
func TestNarinfoDeletedRealClock(t *testing.T) {
	t.Parallel()
	const ttl = 100 * time.Millisecond
	store := newLocal(t)
	fill(t, store)
	srv, _ := serveConfig(t, cache.Config{Store: store, NarinfoCacheBytes: cache.DefaultNarinfoCacheBytes, NarinfoCacheTTL: ttl})
	if r := do(t, "GET", srv.URL+"/"+kNarinfo, nil); r.status != 200 {
		t.Fatalf("GET: status %d", r.status)
	}
	if err := store.Delete(context.Background(), kNarinfo); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	waittest.For(t, ttl+5*time.Second, func() bool {
		return do(t, "GET", srv.URL+"/"+kNarinfo, nil).status == 404
	}, "the deleted narinfo to be 404")
	if d := time.Since(deleted); d > ttl+2*time.Second {
		t.Errorf("served for %v after the deletion; TTL %v", d, ttl)
	}
}

// TestNarinfoPublishedAfterMiss: a miss is not remembered, so a narinfo written after a 404
// is served at the next request.
func TestNarinfoPublishedAfterMiss(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := newLocal(t)
	srv, _ := serveConfig(t, cache.Config{Store: store, NarinfoCacheBytes: cache.DefaultNarinfoCacheBytes, Clock: clk})
	if r := do(t, "GET", srv.URL+"/"+kNarinfo, nil); r.status != 404 || r.header.Get("Cache-Control") != "public, max-age=5" {
		t.Fatalf("before publication: status %d, Cache-Control %q; want 404, public, max-age=5", r.status, r.header.Get("Cache-Control"))
	}
	put(t, store, kNarinfo, []byte(narinfoBody))
	if r := do(t, "GET", srv.URL+"/"+kNarinfo, nil); r.status != 200 || string(r.body) != narinfoBody {
		t.Errorf("after publication: status %d, body %q; want 200, %q", r.status, r.body, narinfoBody)
	}
}

// TestNarinfoConcurrent: many clients asking for more narinfos than the memory holds, while
// some are deleted and written again, each get the stored body or a 404 (run with -race).
func TestNarinfoConcurrent(t *testing.T) {
	t.Parallel()
	const (
		narinfos = 40
		clients  = 8
		requests = 200
	)
	store := newLocal(t)
	keys := make([]string, narinfos)
	bodies := make(map[string][]byte, narinfos)
	for i := range keys {
		keys[i] = fmt.Sprintf("%031dz.narinfo", i)
		bodies[keys[i]] = fmt.Appendf(nil, "StorePath: /nix/store/%031dz-p%d\nURL: nar/x.nar.zst\n", i, i)
		put(t, store, keys[i], bodies[keys[i]])
	}
	// Room for about ten of them: evictions all the time.
	srv, _ := serveConfig(t, cache.Config{Store: store, NarinfoCacheBytes: 10 * 300, NarinfoCacheTTL: time.Millisecond})

	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() { // deletes and publishes again
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k := keys[i%narinfos]
			if err := store.Delete(context.Background(), k); err != nil {
				t.Error(err)
				return
			}
			if err := store.Put(context.Background(), k, bytes.NewReader(bodies[k]), int64(len(bodies[k])), blob.PutOptions{}); err != nil {
				t.Error(err)
				return
			}
		}
	})
	var clientsWG sync.WaitGroup
	for c := range clients {
		clientsWG.Go(func() {
			for i := range requests {
				k := keys[(c*7+i)%narinfos]
				resp, err := srv.Client().Get(srv.URL + "/" + k)
				if err != nil {
					t.Error(err)
					return
				}
				body, err := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				switch {
				case err != nil:
					t.Error(err)
				case resp.StatusCode == 200 && !bytes.Equal(body, bodies[k]):
					t.Errorf("%s: body %q, want %q", k, body, bodies[k])
				case resp.StatusCode != 200 && resp.StatusCode != 404:
					t.Errorf("%s: status %d", k, resp.StatusCode)
				}
			}
		})
	}
	clientsWG.Wait()
	close(stop)
	wg.Wait()
}

func readStored(t *testing.T, s blob.Store, key string) []byte {
	t.Helper()
	rc, _, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// discardResponse is a ResponseWriter that keeps only its header map (cleared per request), so
// a benchmark measures the cache's own work: routing, the lookup, the headers.
type discardResponse struct{ h http.Header }

func (d *discardResponse) Header() http.Header         { return d.h }
func (d *discardResponse) WriteHeader(int)             {}
func (d *discardResponse) Write(p []byte) (int, error) { return len(p), nil }

// BenchmarkNarinfo is one narinfo GET through the cache's routes, answered from memory or read
// from a local store each time (the network and net/http's own work are left out).
func BenchmarkNarinfo(b *testing.B) {
	for _, c := range []struct {
		name  string
		bytes int64
	}{{"memory", cache.DefaultNarinfoCacheBytes}, {"store", 0}} {
		b.Run(c.name, func(b *testing.B) {
			l, err := blob.NewLocal(b.TempDir(), "", testSecret)
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			if err := l.Put(context.Background(), kNarinfo, bytes.NewReader([]byte(narinfoBody)), int64(len(narinfoBody)), blob.PutOptions{}); err != nil {
				b.Fatal(err)
			}
			mux := http.NewServeMux()
			cache.New(cache.Config{Store: l, NarinfoCacheBytes: c.bytes}).Register(access.NewRoutes(mux, nil))
			req := httptest.NewRequest("GET", "/"+kNarinfo, nil)
			w := &discardResponse{h: make(http.Header)}
			b.ReportAllocs()
			for b.Loop() {
				clear(w.h)
				mux.ServeHTTP(w, req)
			}
			if got := w.h.Get("Content-Length"); got != strconv.Itoa(len(narinfoBody)) {
				b.Fatalf("Content-Length %q", got)
			}
		})
	}
}
