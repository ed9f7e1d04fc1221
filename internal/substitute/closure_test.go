package substitute

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// fakeStore is a have function over a fixed set of valid paths that records what it is asked.
type fakeStore struct {
	valid map[string]bool
	mu    sync.Mutex
	asked []string
}

func (s *fakeStore) have(_ context.Context, paths []string) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked = append(s.asked, paths...)
	var valid []string
	for _, p := range paths {
		if s.valid[p] {
			valid = append(valid, p)
		}
	}
	return valid, nil
}

// TestClosureSkipsValidPaths checks against a cache written by real Nix that Closure looks up
// exactly the paths the local store lacks (a valid path's references included), each once,
// returns them references first, and asks the store about each path at most once.
func TestClosureSkipsValidPaths(t *testing.T) {
	c := realCaches(t)
	tests := []struct {
		name     string
		roots    []string
		valid    []string
		parallel int
		want     []string // returned and looked up, in any order
	}{
		{name: "empty store", roots: []string{c.drv}, want: c.closure},
		{name: "empty store, one lookup at a time", roots: []string{c.drv}, parallel: 1, want: c.closure},
		{name: "leaves valid", roots: []string{c.drv}, valid: []string{c.leaf, c.tree}, want: []string{c.drv, c.top, c.mid}},
		// top is valid, so its closure is too: mid and leaf are not even asked about.
		{name: "inner path valid", roots: []string{c.drv}, valid: []string{c.top}, want: []string{c.drv}},
		{name: "root valid", roots: []string{c.drv}, valid: []string{c.drv}},
		{name: "several roots", roots: []string{c.mid, c.top, c.mid}, valid: []string{c.tree}, want: []string{c.top, c.mid, c.leaf}},
		{name: "no roots"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newCacheServer(t, http.FileServer(http.Dir(c.dirs["zstd"])))
			store := &fakeStore{valid: map[string]bool{}}
			for _, p := range tt.valid {
				store.valid[p] = true
			}
			f := &Fetcher{Caches: []string{srv.URL}, Keys: []nix.PublicKey{c.key.Public()}, Parallel: tt.parallel}
			found, err := f.Closure(context.Background(), tt.roots, store.have)
			if err != nil {
				t.Fatal(err)
			}
			want := slices.Sorted(slices.Values(tt.want))
			if got := slices.Sorted(slices.Values(paths(found))); !slices.Equal(got, want) {
				t.Errorf("Closure = %v, want %v", got, want)
			}
			checkOrder(t, found, c.refs)
			if got, want := srv.asked(), hashParts(t, tt.want...); !slices.Equal(got, want) {
				t.Errorf("narinfos asked for = %v, want %v", got, want)
			}
			asked := slices.Sorted(slices.Values(store.asked))
			if len(slices.Compact(slices.Clone(asked))) != len(asked) {
				t.Errorf("store asked about %v, some more than once", asked)
			}
			again, err := f.Closure(context.Background(), tt.roots, store.have)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(paths(again), paths(found)) {
				t.Errorf("second Closure = %v, first %v: not deterministic", paths(again), paths(found))
			}
		})
	}
}

// TestClosureMissingPath checks that a path no cache has fails the closure with ErrNotFound,
// naming the path and, for a reference, the path that needs it.
func TestClosureMissingPath(t *testing.T) {
	c := realCaches(t)
	tests := []struct {
		name    string
		hidden  []string
		wantErr []string
	}{
		{name: "root", hidden: []string{c.drv}, wantErr: []string{"look up " + c.drv}},
		{name: "reference", hidden: []string{c.mid}, wantErr: []string{c.top + " references " + c.mid, "look up " + c.mid}},
		{name: "two references", hidden: []string{c.mid, c.tree}, wantErr: []string{"references", "(and 1 more failed lookups)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			first := newCacheServer(t, http.NotFoundHandler())
			second := newCacheServer(t, http.FileServer(http.Dir(c.dirs["none"])), tt.hidden...)
			f := &Fetcher{Caches: []string{first.URL, second.URL}, Keys: []nix.PublicKey{c.key.Public()}}
			found, err := f.Closure(context.Background(), []string{c.drv}, nil)
			if err == nil {
				t.Fatalf("Closure = %v, want an error", paths(found))
			}
			t.Logf("error: %v", err)
			if !errors.Is(err, ErrNotFound) {
				t.Errorf("Closure error = %v, want ErrNotFound", err)
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Closure error = %v, want it to contain %q", err, want)
				}
			}
		})
	}
}

// TestClosureHaveError checks that a failing store query fails the closure.
func TestClosureHaveError(t *testing.T) {
	key, err := nix.GenerateKey("test-1")
	if err != nil {
		t.Fatal(err)
	}
	srv := newCacheServer(t, http.NotFoundHandler())
	errDaemon := errors.New("daemon gone")
	f := &Fetcher{Caches: []string{srv.URL}, Keys: []nix.PublicKey{key.Public()}}
	_, err = f.Closure(context.Background(), []string{"/nix/store/" + strings.Repeat("a", 32) + "-x"},
		func(context.Context, []string) ([]string, error) { return nil, errDaemon })
	if !errors.Is(err, errDaemon) {
		t.Errorf("Closure error = %v, want %v", err, errDaemon)
	}
	if got := srv.asked(); len(got) != 0 {
		t.Errorf("narinfos asked for = %v, want none", got)
	}
}

// TestClosureOrder serves signed narinfos for made-up graphs whose hash order differs from
// their dependency order, and checks Closure's exact order.
func TestClosureOrder(t *testing.T) {
	key, err := nix.GenerateKey("test-1")
	if err != nil {
		t.Fatal(err)
	}
	// sp returns a store path whose hash part repeats c, so that paths sort by c.
	sp := func(c, name string) string { return nix.StoreDir + "/" + strings.Repeat(c, 32) + "-" + name }
	var (
		top   = sp("0", "top")
		left  = sp("1", "left")
		right = sp("2", "right")
		other = sp("3", "other")
		base  = sp("z", "base")
	)
	tests := []struct {
		name    string
		graph   map[string][]string // path → references (full paths)
		roots   []string
		want    []string
		wantErr string
	}{
		{
			name:  "diamond with self-reference",
			graph: map[string][]string{top: {right, left, top}, left: {base}, right: {base}, base: nil, other: nil},
			roots: []string{other, top},
			want:  []string{base, left, right, top, other},
		},
		{
			name:  "chain against hash order",
			graph: map[string][]string{top: {left}, left: {right}, right: {other}, other: {base}, base: nil},
			roots: []string{top},
			want:  []string{base, other, right, left, top},
		},
		{
			name:    "cycle",
			graph:   map[string][]string{top: {left}, left: {top}},
			roots:   []string{top},
			wantErr: "reference cycle",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := map[string][]byte{}
			for p, refs := range tt.graph {
				var bases []string
				for _, r := range refs {
					bases = append(bases, strings.TrimPrefix(r, nix.StoreDir+"/"))
				}
				ni := &nix.NarInfo{StorePath: p, URL: "nar/x.nar", Compression: "none",
					NarHash: nix.FormatSHA256([32]byte{}), NarSize: 8, References: bases}
				if err := ni.Sign(key); err != nil {
					t.Fatal(err)
				}
				text, err := ni.MarshalText()
				if err != nil {
					t.Fatal(err)
				}
				files["/"+hashPart(t, p)+".narinfo"] = text
			}
			srv := newCacheServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if b, ok := files[r.URL.Path]; ok {
					w.Write(b)
					return
				}
				http.NotFound(w, r)
			}))
			f := &Fetcher{Caches: []string{srv.URL}, Keys: []nix.PublicKey{key.Public()}}
			found, err := f.Closure(context.Background(), tt.roots, nil)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Closure error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := paths(found); !slices.Equal(got, tt.want) {
				t.Errorf("Closure = %v, want %v", got, tt.want)
			}
		})
	}
}
