package builder_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/builder"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

// TestStoreGCThreshold: the builder collects its store's garbage only when the free space is
// below min_free, and never with min_free 0; each check measures the store's file system.
func TestStoreGCThreshold(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	tests := []struct {
		name      string
		minFree   int64
		free      int64 // what the free-space check reports
		collected bool
	}{
		{name: "off", minFree: 0, free: 0},
		{name: "at min_free", minFree: 1 << 30, free: 1 << 30},
		{name: "below min_free", minFree: 1 << 30, free: 1<<30 - 1, collected: true},
	}
	for i, tt := range tests {
		reg := prometheus.NewRegistry()
		var mu sync.Mutex
		var dirs []string
		node := h.startBuilderWith(fmt.Sprintf("builder-%d", i), builder.Config{MinFree: tt.minFree, MaxFree: 2 << 30, Registerer: reg},
			func(b *builder.Builder) {
				b.SetFreeSpaceFunc(func(dir string) (int64, error) {
					mu.Lock()
					dirs = append(dirs, dir)
					mu.Unlock()
					return tt.free, nil
				})
			})
		garbage := addGarbage(t, node.store, 1<<20)

		ran, err := node.builder.CollectGarbage(h.ctx())
		if err != nil || ran != tt.collected {
			t.Errorf("%s: CollectGarbage = %v, %v; want %v", tt.name, ran, err, tt.collected)
		}
		if _, ok := pathInfos(t, node.store, []string{garbage})[garbage]; ok == tt.collected {
			t.Errorf("%s: garbage %s valid after the check: %v", tt.name, garbage, ok)
		}
		m := gcMetrics(t, reg)
		switch {
		case tt.collected && (m.runs["short"] < 1 || m.runs["error"] != 0 || m.freed < 1<<19):
			t.Errorf("%s: metrics %+v, want collections that left the store short of min_free and freed the 1 MiB of garbage", tt.name, m)
		case !tt.collected && m.runs["ok"]+m.runs["short"]+m.runs["error"] != 0:
			t.Errorf("%s: metrics %+v, want no collection", tt.name, m)
		}
		if m.free != float64(tt.free) {
			t.Errorf("%s: harmonia_ci_builder_store_free_bytes = %v, want %d", tt.name, m.free, tt.free)
		}
		mu.Lock()
		want := filepath.Join(node.store, "nix/store")
		for _, d := range dirs {
			if d != want {
				t.Errorf("%s: free space measured in %s, want %s", tt.name, d, want)
			}
		}
		mu.Unlock()
	}
}

// TestStoreGCKeepsRunningJobs: a collection while a job runs takes the garbage of the store
// (a path nothing roots) but neither the job's inputs nor its outputs before
// they are uploaded; once the job is over, what it left is garbage too.
func TestStoreGCKeepsRunningJobs(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	fifoDir := t.TempDir()
	fifo := filepath.Join(fifoDir, "go")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	expr := sh(h.salt) + fmt.Sprintf(`let
  src = builtins.toFile "src-%s" "source\n";
  dep = sh "dep" "echo dep > $out";
in {
  inherit dep;
  blocked = sh "blocked" "echo waiting; read -r v < %s; read -r d < ${dep}; read -r s < ${src}; echo \"$v $d $s\" > $out";
}`, h.salt, fifo)
	drvs := h.instantiate(expr, "dep", "blocked")
	h.enqueue(drvs["dep"], drvs["blocked"])
	src := ""
	for _, p := range pathInfos(t, h.src, []string{drvs["blocked"]})[drvs["blocked"]].References {
		if strings.HasSuffix(p, "-src-"+h.salt) {
			src = p
		}
	}
	if src == "" {
		t.Fatalf("%s does not refer to its input source", drvs["blocked"])
	}
	dep, out := h.outputs(drvs["dep"])["out"], h.outputs(drvs["blocked"])["out"]
	// The .drv files never reach the builder's store: the derivation goes to the daemon over
	// the connection.
	needed := []string{src, dep}

	// Free space is always short: every check after a job ended collects, besides the test's.
	reg := prometheus.NewRegistry()
	node := h.startBuilderWith("builder-1", builder.Config{
		Store:   builder.Store{SandboxPaths: []string{fifoDir}},
		Limits:  builder.BuildLimits{Timeout: 5 * time.Minute},
		MinFree: 1 << 30, MaxFree: 2 << 30, Registerer: reg,
	}, func(b *builder.Builder) { b.SetFreeSpaceFunc(func(string) (int64, error) { return 0, nil }) })
	collect := func(when string) {
		t.Helper()
		if ran, err := node.builder.CollectGarbage(h.ctx()); !ran || err != nil {
			t.Fatalf("%s: CollectGarbage = %v, %v; want a collection", when, ran, err)
		}
	}
	checkValid := func(when string, paths ...string) {
		t.Helper()
		valid := pathInfos(t, node.store, paths)
		for _, p := range paths {
			if _, ok := valid[p]; !ok {
				t.Errorf("%s: %s was collected", when, p)
			}
		}
	}

	// While the build runs, blocked on the fifo.
	j := h.waitStatus(drvs["blocked"], status.JobBuilding)
	waittest.For(t, jobWait, func() bool {
		tail, ok := h.tail(j.ID)
		return ok && strings.Contains(tail, "waiting")
	}, "the build of job %d to run", j.ID)
	if !rooted(t, node.store, out) {
		t.Errorf("the output %s is not rooted while its build runs", out)
	}
	garbage := addGarbage(t, node.store, 1<<20)
	collect("while the build runs")
	checkValid("while the build runs", needed...)
	if _, ok := pathInfos(t, node.store, []string{garbage})[garbage]; ok {
		t.Errorf("while the build runs: the garbage %s was not collected", garbage)
	}

	// Built, not uploaded yet: the row lock holds the job before it is marked uploading.
	tx, err := h.pool.Begin(h.ctx())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(h.ctx(), `SELECT 1 FROM build_jobs WHERE id = $1 FOR NO KEY UPDATE`, j.ID); err != nil {
		t.Fatal(err)
	}
	writeFifo(t, fifo, "go\n")
	waittest.For(t, jobWait, func() bool {
		var n int
		if err := h.pool.QueryRow(context.Background(), `
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%status = ''uploading''%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}, "the builder to mark job %d uploading", j.ID)
	collect("before the upload")
	checkValid("before the upload", append(needed, out)...)
	if err := tx.Rollback(h.ctx()); err != nil {
		t.Fatal(err)
	}

	h.waitStatus(drvs["blocked"], status.JobSucceeded)
	if code, info := h.narInfo(out); code != 200 || !strings.Contains(info, "StorePath: "+out) {
		t.Errorf("narinfo of %s: %d %q", out, code, info)
	}
	waittest.For(t, 10*time.Second, func() bool { return len(h.handledResults(j.ID)) > 0 }, "the handler of job %d to return", j.ID)
	collect("after the job")
	if left := pathInfos(t, node.store, append(needed, out)); len(left) != 0 {
		t.Errorf("after the job: %d of its paths were not collected", len(left))
	}

	m := gcMetrics(t, reg)
	if m.runs["short"] < 3 || m.runs["error"] != 0 || m.freed < 1<<19 || m.free != 0 {
		t.Errorf("metrics %+v, want at least the test's 3 collections, each short of min_free, and the garbage freed", m)
	}
	if logs := h.logs.String(); !strings.Contains(logs, "garbage collection could not free min_free") {
		t.Errorf("no warning that the store stays short of min_free")
	}
}

// TestRestartClearsStaleRoots: the roots a builder that died left in its store are removed when
// a builder of the same node starts on it, and their paths are garbage; other nodes' roots stay.
func TestRestartClearsStaleRoots(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	root := t.TempDir()
	dead := builder.Store{Root: root}
	tests := []struct {
		name string // as Builder.handle names a job's roots
		kept bool
	}{
		{name: "builder-1-job-7-drv"},
		{name: "builder-1-job-7"},
		{name: "builder-1-job-7-out"},
		{name: "builder-10-job-3", kept: true}, // another node's, on a shared store
	}
	paths := map[string]string{}
	for _, tt := range tests {
		paths[tt.name] = addGarbage(t, root, 1<<10)
		if _, err := dead.AddRoots(tt.name, []string{paths[tt.name]}); err != nil {
			t.Fatal(err)
		}
	}

	node := h.startBuilderWith("builder-1", builder.Config{Store: builder.Store{Root: root}, MinFree: 1 << 30, MaxFree: 2 << 30},
		func(b *builder.Builder) { b.SetFreeSpaceFunc(func(string) (int64, error) { return 0, nil }) })
	for _, tt := range tests {
		if got := rooted(t, root, paths[tt.name]); got != tt.kept {
			t.Errorf("root %s after the restart: rooted %v, want %v", tt.name, got, tt.kept)
		}
	}
	if ran, err := node.builder.CollectGarbage(h.ctx()); !ran || err != nil {
		t.Fatalf("CollectGarbage = %v, %v", ran, err)
	}
	for _, tt := range tests {
		if _, ok := pathInfos(t, root, []string{paths[tt.name]})[paths[tt.name]]; ok != tt.kept {
			t.Errorf("the path of root %s after a collection: valid %v, want %v", tt.name, ok, tt.kept)
		}
	}
}

// addGarbage adds a file of size random bytes to the store at root, rooted by nothing.
func addGarbage(t *testing.T, root string, size int) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "garbage")
	if err := os.WriteFile(file, []byte(rand.Text()+strings.Repeat("x", size)), 0o644); err != nil {
		t.Fatal(err)
	}
	return nixRun(t, "nix-store", "--store", root, "--option", "build-users-group", "", "--add", file)
}

// rooted reports whether a GC root of the builders in the store at root points at p.
func rooted(t *testing.T, root, p string) bool {
	t.Helper()
	dir := filepath.Join(root, "nix/var/nix/gcroots/harmonia-ci")
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range entries {
		if target, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && target == p {
			return true
		}
	}
	return false
}

// writeFifo writes s to the fifo once a reader has opened it.
func writeFifo(t *testing.T, fifo, s string) {
	t.Helper()
	var f *os.File
	waittest.For(t, jobWait, func() bool {
		var err error
		f, err = os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err != nil && !errors.Is(err, syscall.ENXIO) {
			t.Fatal(err)
		}
		return err == nil
	}, "a reader of %s", fifo)
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

// storeGCMetrics are a builder's store series.
type storeGCMetrics struct {
	runs  map[string]float64 // harmonia_ci_builder_store_gc_total by result
	freed float64
	free  float64
}

func gcMetrics(t *testing.T, reg *prometheus.Registry) storeGCMetrics {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	m := storeGCMetrics{runs: map[string]float64{}}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			switch mf.GetName() {
			case "harmonia_ci_builder_store_gc_total":
				m.runs[s.GetLabel()[0].GetValue()] = s.GetCounter().GetValue()
			case "harmonia_ci_builder_store_gc_freed_bytes_total":
				m.freed = s.GetCounter().GetValue()
			case "harmonia_ci_builder_store_free_bytes":
				m.free = s.GetGauge().GetValue()
			}
		}
	}
	return m
}
