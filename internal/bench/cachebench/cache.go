// Package cachebench is `harmonia-ci bench cache`: the cache role against nginx on the same blob
// directory, and the upload pipeline against nix copy.
package cachebench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/bench"
	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/cache"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// CacheOptions configures `harmonia-ci bench cache`.
type CacheOptions struct {
	Duration    int // seconds per wrk run; default 10
	Connections int // wrk connections; default 32
	Threads     int // wrk threads; default 2
	Rounds      int // wrk runs per server and per kind, and pipeline runs per side; best kept; default 2
	NarMB       int // NAR size of the large path, in MB; default 64
	Closure     int // small store paths besides the large one; default 50
	ClosureMB   int // total content of the small paths, in MB; default 192
	Seed        uint64
	Logger      *slog.Logger
}

// CacheReport is what the benchmark measured. MB is 10^6 bytes.
type CacheReport struct {
	Date        string `json:"date"`
	Machine     string `json:"machine"`
	Nginx       string `json:"nginx"`
	Wrk         string `json:"wrk"`
	Nix         string `json:"nix"`
	Duration    int    `json:"duration_seconds"`
	Connections int    `json:"connections"`
	Threads     int    `json:"threads"`
	Rounds      int    `json:"rounds"`

	Narinfos        int     `json:"narinfos"`
	CacheNarinfoRPS float64 `json:"cache_narinfo_requests_per_second"`
	NginxNarinfoRPS float64 `json:"nginx_narinfo_requests_per_second"`
	NarinfoRatio    float64 `json:"narinfo_ratio"`
	// The cache role with its visibility check on a database that has a private project, so
	// every path is looked up (and kept for the check's TTL) rather than taking the all-public
	// fast path; the benchmark's paths belong to no project, so they are public.
	VisibleNarinfoRPS   float64 `json:"cache_visibility_narinfo_requests_per_second"`
	VisibleNarinfoRatio float64 `json:"visibility_narinfo_ratio"`
	Database            string  `json:"database,omitempty"`
	NarFileMB           float64 `json:"nar_file_mb"` // the large path's .nar.zst
	CacheNarMBps        float64 `json:"cache_nar_mb_per_second"`
	NginxNarMBps        float64 `json:"nginx_nar_mb_per_second"`
	NarRatio            float64 `json:"nar_ratio"`
	ClosurePaths        int     `json:"closure_paths"`
	ClosureNarMB        float64 `json:"closure_nar_mb"`
	PipelineSeconds     float64 `json:"pipeline_seconds"`
	PipelineMBps        float64 `json:"pipeline_mb_per_second"` // NAR bytes per second
	PipelineFileMB      float64 `json:"pipeline_file_mb"`
	NixCopySeconds      float64 `json:"nix_copy_seconds"`
	NixCopyMBps         float64 `json:"nix_copy_mb_per_second"`
	NixCopyFileMB       float64 `json:"nix_copy_file_mb"`
	PipelineRatio       float64 `json:"pipeline_ratio"`
	PipelineWorkers     int     `json:"pipeline_workers"`
	WrkSocketErrors     string  `json:"wrk_socket_errors,omitempty"`
	NarinfoRequestPath  string  `json:"narinfo_requests"`
}

func (o *CacheOptions) defaults() {
	o.Duration = bench.Positive(o.Duration, 10)
	o.Connections = bench.Positive(o.Connections, 32)
	o.Threads = bench.Positive(o.Threads, 2)
	if o.Threads > o.Connections {
		o.Threads = o.Connections
	}
	o.Rounds = bench.Positive(o.Rounds, 2)
	o.NarMB = bench.Positive(o.NarMB, 64)
	o.Closure = bench.Positive(o.Closure, 50)
	o.ClosureMB = bench.Positive(o.ClosureMB, 192)
	o.Seed = bench.Seed(o.Seed)
	o.Logger = bench.Logger(o.Logger)
}

// nginxBin is nginx, or Debian's /usr/sbin/nginx when /usr/sbin is not on PATH.
var nginxBin = "nginx"

// needTool checks that name is installed; nginx may be off PATH in /usr/sbin (see nginxBin).
func needTool(name, hint string) error {
	err := bench.NeedTool(name, hint)
	if err != nil && name == "nginx" {
		if fi, serr := os.Stat("/usr/sbin/nginx"); serr == nil && fi.Mode()&0o111 != 0 {
			nginxBin = "/usr/sbin/nginx"
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("bench cache: %w", err)
	}
	return nil
}

// Cache runs the binary cache benchmark: the cache role and nginx serve the same local blob
// directory to wrk (narinfo requests/s, then the large NAR's MB/s), and the upload pipeline
// (CompressNAR of a closure into .nar.zst files plus signed narinfos) is timed against
// `nix copy --to file://DIR?compression=zstd` on the same store paths.
func Cache(ctx context.Context, o CacheOptions) (CacheReport, error) {
	o.defaults()
	r := CacheReport{
		Date:     time.Now().UTC().Format(time.RFC3339),
		Machine:  bench.Machine(),
		Duration: o.Duration, Connections: o.Connections, Threads: o.Threads, Rounds: o.Rounds,
		NarinfoRequestPath: "cycling through every narinfo",
	}
	if err := checkTools(&r); err != nil {
		return r, err
	}
	tmp, err := os.MkdirTemp("", "hci-bench-cache-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(tmp)

	// 1. Real store paths: one large, o.Closure small.
	o.Logger.Info("generating store paths", "large_mb", o.NarMB, "small", o.Closure, "small_mb", o.ClosureMB)
	paths, err := makeStorePaths(ctx, filepath.Join(tmp, "src"), o)
	if err != nil {
		return r, err
	}
	defer func() {
		args := append([]string{"--delete"}, paths...)
		if out, err := exec.Command("nix-store", args...).CombinedOutput(); err != nil {
			o.Logger.Warn("could not delete the benchmark's store paths", "err", err, "output", string(out))
		}
	}()
	r.ClosurePaths = len(paths)

	key, err := nix.GenerateKey("bench-cache-1")
	if err != nil {
		return r, err
	}
	storeDir := filepath.Join(tmp, "store")
	pub, err := publish(ctx, storeDir, paths, key, runtime.NumCPU())
	if err != nil {
		return r, err
	}
	r.Narinfos = len(pub.narinfos)
	r.NarFileMB = float64(pub.largeFileSize) / 1e6

	// 2 and 3. The two servers, measured by wrk.
	if err := measureServing(ctx, o, tmp, storeDir, pub, &r); err != nil {
		return r, err
	}
	// 4. The upload pipeline against nix copy.
	if err := measureUpload(ctx, o, tmp, paths, key, pub, &r); err != nil {
		return r, err
	}
	return r, nil
}

// checkTools fails unless the tools the benchmark runs are installed, and puts their versions
// in r.
func checkTools(r *CacheReport) error {
	for _, t := range []struct{ name, hint string }{
		{"nginx", "Debian package nginx; scripts/deps.sh bench installs it"},
		{"wrk", "Debian package wrk; scripts/deps.sh bench installs it"},
		{"nix-store", "Debian package nix-bin; scripts/deps.sh installs it"},
		{"nix", "Debian package nix-bin; scripts/deps.sh installs it"},
	} {
		if err := needTool(t.name, t.hint); err != nil {
			return err
		}
	}
	r.Nginx = strings.TrimPrefix(bench.ToolVersion(nginxBin, "-v"), "nginx version: ")
	r.Wrk, _, _ = strings.Cut(bench.ToolVersion("wrk", "-v"), " [")
	r.Nix = bench.ToolVersion("nix-store", "--version")
	return nil
}

// serveCache serves storeDir through the cache role on a loopback port, with vis as its
// visibility check (nil: none).
func serveCache(storeDir string, vis *cache.Visibility) (url string, stop func(), err error) {
	local, err := blob.NewLocal(storeDir, "", []byte("bench-cache-secret-0123456789"))
	if err != nil {
		return "", nil, err
	}
	mux := http.NewServeMux()
	// Quiet: wrk resets connections mid-body when a run ends, which the cache role logs; a
	// failed request shows up in wrk's non-2xx count instead. Narinfos are kept in memory
	// (cache.DefaultNarinfoCacheBytes).
	cache.New(cache.Config{Store: local, Logger: slog.New(slog.DiscardHandler), NarinfoCacheBytes: cache.DefaultNarinfoCacheBytes, Visibility: vis}).Register(access.NewRoutes(mux, nil))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		local.Close()
		return "", nil, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close(); _ = local.Close() }, nil
}

// measureServing serves storeDir through the cache role and nginx, checks they serve the same
// bytes, and runs wrk against each, alternating servers; the best round of each is kept.
func measureServing(ctx context.Context, o CacheOptions, tmp, storeDir string, pub published, r *CacheReport) error {
	cacheURL, stopCache, err := serveCache(storeDir, nil)
	if err != nil {
		return err
	}
	defer stopCache()
	vis, closeDB, err := privateVisibility(ctx, o, r)
	if err != nil {
		return err
	}
	defer closeDB()
	visURL, stopVis, err := serveCache(storeDir, vis)
	if err != nil {
		return err
	}
	defer stopVis()
	nginxURL, stopNginx, err := startNginx(ctx, filepath.Join(tmp, "nginx"), storeDir)
	if err != nil {
		return err
	}
	defer stopNginx()

	// Both must serve the same bytes before either is measured.
	for _, p := range []string{"/" + pub.narinfos[0], "/" + pub.largeNar} {
		b, err := httpGet(ctx, nginxURL+p)
		if err != nil {
			return fmt.Errorf("bench cache: nginx: %w", err)
		}
		for _, u := range []string{cacheURL, visURL} {
			a, err := httpGet(ctx, u+p)
			if err != nil {
				return fmt.Errorf("bench cache: cache role: %w", err)
			}
			if !bytes.Equal(a, b) {
				return fmt.Errorf("bench cache: cache role (%s) and nginx serve different bytes for %s", u, p)
			}
		}
	}

	script := filepath.Join(tmp, "narinfos.lua")
	if err := writeWrkScript(script, pub.narinfos); err != nil {
		return err
	}
	var sockErrs []string
	run := func(kind, base, path, script string) (wrkResult, error) {
		o.Logger.Info("wrk", "kind", kind, "url", base+path, "seconds", o.Duration)
		res, err := runWrk(ctx, o, base+path, script)
		if err != nil {
			return res, fmt.Errorf("bench cache: wrk %s %s: %w", kind, base, err)
		}
		if res.socketErrors != "" {
			sockErrs = append(sockErrs, kind+": "+res.socketErrors)
		}
		return res, nil
	}
	type narinfoServer struct {
		base string
		rps  *float64
	}
	servers := []narinfoServer{{cacheURL, &r.CacheNarinfoRPS}, {visURL, &r.VisibleNarinfoRPS}, {nginxURL, &r.NginxNarinfoRPS}}
	for round := range o.Rounds {
		// Each round starts with another server, so a machine that gets busier or quieter
		// during the run favours none of them.
		for i := range servers {
			s := servers[(round+i)%len(servers)]
			res, err := run("narinfo", s.base, "/", script)
			if err != nil {
				return err
			}
			*s.rps = max(*s.rps, res.requestsPerSec)
		}
		for _, s := range []struct {
			base string
			mbps *float64
		}{{cacheURL, &r.CacheNarMBps}, {nginxURL, &r.NginxNarMBps}} {
			res, err := run("nar", s.base, "/"+pub.largeNar, "")
			if err != nil {
				return err
			}
			*s.mbps = max(*s.mbps, res.bytesPerSec/1e6)
		}
	}
	r.WrkSocketErrors = strings.Join(sockErrs, "; ")
	r.NarinfoRatio = r.CacheNarinfoRPS / r.NginxNarinfoRPS
	r.VisibleNarinfoRatio = r.VisibleNarinfoRPS / r.NginxNarinfoRPS
	r.NarRatio = r.CacheNarMBps / r.NginxNarMBps
	return nil
}

// privateVisibility starts a private PostgreSQL with one private project, and returns a
// visibility check on it: with a private project about, every narinfo is looked up. The
// server's directory is a temporary one of its own (its parent must be searchable by the
// postgres user the embedded server runs as under root).
func privateVisibility(ctx context.Context, o CacheOptions, r *CacheReport) (*cache.Visibility, func(), error) {
	dir, err := os.MkdirTemp("", "hci-bench-cache-pg-")
	if err != nil {
		return nil, nil, err
	}
	d, err := bench.OpenDatabase(ctx, bench.DatabaseOptions{Dir: dir, App: "harmonia-ci bench cache", PoolConns: 8, Logger: o.Logger})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("bench cache: database: %w", err)
	}
	closeAll := func() { d.Close(); _ = os.RemoveAll(dir) }
	if _, err := d.Pool.Exec(ctx, sqlPrivateProject, "bench-cache-private"); err != nil {
		closeAll()
		return nil, nil, fmt.Errorf("bench cache: private project: %w", err)
	}
	r.Database = d.Version
	return &cache.Visibility{DB: d.Pool}, closeAll, nil
}

// measureUpload times the upload pipeline against nix copy on paths, alternating, each into a
// fresh directory; the best round of each is kept.
func measureUpload(ctx context.Context, o CacheOptions, tmp string, paths []string, key nix.SecretKey, pub published, r *CacheReport) error {
	r.PipelineWorkers = runtime.NumCPU()
	r.ClosureNarMB = float64(pub.narBytes) / 1e6
	for i := range o.Rounds {
		dir := filepath.Join(tmp, fmt.Sprintf("pipeline-%d", i))
		o.Logger.Info("upload pipeline", "paths", len(paths), "nar_mb", r.ClosureNarMB)
		start := time.Now()
		p, err := publish(ctx, dir, paths, key, r.PipelineWorkers)
		if err != nil {
			return err
		}
		if s := time.Since(start).Seconds(); r.PipelineSeconds == 0 || s < r.PipelineSeconds {
			r.PipelineSeconds, r.PipelineFileMB = s, float64(p.fileBytes)/1e6
		}
		_ = os.RemoveAll(dir)

		dir = filepath.Join(tmp, fmt.Sprintf("nixcopy-%d", i))
		o.Logger.Info("nix copy", "paths", len(paths))
		s, size, err := nixCopy(ctx, dir, paths)
		if err != nil {
			return err
		}
		if r.NixCopySeconds == 0 || s < r.NixCopySeconds {
			r.NixCopySeconds, r.NixCopyFileMB = s, float64(size)/1e6
		}
		_ = os.RemoveAll(dir)
	}
	r.PipelineMBps = r.ClosureNarMB / r.PipelineSeconds
	r.NixCopyMBps = r.ClosureNarMB / r.NixCopySeconds
	r.PipelineRatio = r.PipelineMBps / r.NixCopyMBps
	return nil
}

// makeStorePaths writes the benchmark's content under src and adds it with nix-store --add:
// a large path of o.NarMB and o.Closure small ones sharing o.ClosureMB, each a mix of random
// bytes (incompressible, like binaries' compressed sections) and word text (compressible).
func makeStorePaths(ctx context.Context, src string, o CacheOptions) ([]string, error) {
	rng := rand.New(rand.NewChaCha8([32]byte{byte(o.Seed), byte(o.Seed >> 8), byte(o.Seed >> 16), byte(o.Seed >> 24),
		byte(o.Seed >> 32), byte(o.Seed >> 40), byte(o.Seed >> 48), byte(o.Seed >> 56)}))
	words := make([]string, 512)
	for i := range words {
		b := make([]byte, 2+rng.IntN(9))
		for j := range b {
			b[j] = 'a' + byte(rng.IntN(26))
		}
		words[i] = string(b)
	}
	dirs := []string{filepath.Join(src, "hci-bench-large")}
	if err := writeContent(dirs[0], int64(o.NarMB)*1e6, 8, rng, words); err != nil {
		return nil, err
	}
	avg := int64(o.ClosureMB) * 1e6 / int64(o.Closure)
	for i := range o.Closure {
		d := filepath.Join(src, fmt.Sprintf("hci-bench-small-%03d", i))
		size := avg/5 + rng.Int64N(avg*8/5+1) // 0.2 to 1.8 × the average
		if err := writeContent(d, size, 1+rng.IntN(40), rng, words); err != nil {
			return nil, err
		}
		dirs = append(dirs, d)
	}
	cmd := exec.CommandContext(ctx, "nix-store", append([]string{"--add"}, dirs...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("bench cache: nix-store --add: %w\n%s", err, stderr.String())
	}
	paths := strings.Fields(string(out))
	if len(paths) != len(dirs) {
		return nil, fmt.Errorf("bench cache: nix-store --add printed %d paths for %d directories", len(paths), len(dirs))
	}
	if err := os.RemoveAll(src); err != nil {
		return nil, err
	}
	return paths, nil
}

// writeContent fills dir with about size bytes: 40 % random bytes in lib/, 60 % text in
// share/, and nfiles small text files.
func writeContent(dir string, size int64, nfiles int, rng *rand.Rand, words []string) error {
	for _, sub := range []string{"lib", "share/doc"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return err
		}
	}
	random := make([]byte, size*4/10)
	for i := 0; i+8 <= len(random); i += 8 {
		v := rng.Uint64()
		for j := range 8 {
			random[i+j] = byte(v >> (8 * j))
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "lib", "libbench.so"), random, 0o755); err != nil {
		return err
	}
	text := func(n int64) []byte {
		b := make([]byte, 0, n+16)
		for int64(len(b)) < n {
			b = append(b, words[rng.IntN(len(words))]...)
			if rng.IntN(12) == 0 {
				b = append(b, '\n')
			} else {
				b = append(b, ' ')
			}
		}
		return b[:n]
	}
	if err := os.WriteFile(filepath.Join(dir, "share", "doc", "manual.txt"), text(size*6/10), 0o644); err != nil {
		return err
	}
	for i := range nfiles {
		if err := os.WriteFile(filepath.Join(dir, "share", fmt.Sprintf("file-%02d.txt", i)), text(int64(200+rng.IntN(4000))), 0o644); err != nil {
			return err
		}
	}
	return nil
}

type published struct {
	narinfos      []string // keys: <hash>.narinfo
	largeNar      string   // key of the first path's NAR
	largeFileSize int64
	narBytes      int64
	fileBytes     int64
}

// publish is the upload pipeline as a builder runs it, into a local blob directory: per path,
// CompressNAR streamed into a temporary file, renamed to nar/<filehash>.nar.zst, then the
// signed narinfo; workers paths at once. Nothing is fsynced (neither does nix copy to file://).
func publish(ctx context.Context, dir string, paths []string, key nix.SecretKey, workers int) (published, error) {
	var p published
	if err := os.MkdirAll(filepath.Join(dir, "nar"), 0o755); err != nil {
		return p, err
	}
	info := fmt.Sprintf("StoreDir: %s\nWantMassQuery: 1\nPriority: %d\n", nix.StoreDir, cache.DefaultPriority)
	if err := os.WriteFile(filepath.Join(dir, "nix-cache-info"), []byte(info), 0o644); err != nil {
		return p, err
	}
	type result struct {
		narinfo, nar string
		sizes        nix.Sizes
		err          error
	}
	results := make([]result, len(paths))
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				res := &results[i]
				res.narinfo, res.nar, res.sizes, res.err = publishOne(ctx, dir, paths[i], key)
			}
		})
	}
	for i := range paths {
		next <- i
	}
	close(next)
	wg.Wait()
	for i, res := range results {
		if res.err != nil {
			return p, res.err
		}
		p.narinfos = append(p.narinfos, res.narinfo)
		p.narBytes += res.sizes.NarSize
		p.fileBytes += res.sizes.FileSize
		if i == 0 {
			p.largeNar, p.largeFileSize = res.nar, res.sizes.FileSize
		}
	}
	return p, nil
}

func publishOne(ctx context.Context, dir, path string, key nix.SecretKey) (narinfoKey, narKey string, s nix.Sizes, err error) {
	sp, err := nix.ParseStorePath(path)
	if err != nil {
		return "", "", s, err
	}
	f, err := os.CreateTemp(filepath.Join(dir, "nar"), ".upload-*")
	if err != nil {
		return "", "", s, err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(f.Name())
		}
	}()
	w := bufio.NewWriterSize(f, 1<<20)
	s, err = nix.CompressNAR(ctx, path, w)
	if err == nil {
		err = w.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", "", s, err
	}
	narKey = nix.NarURL(s.FileHash)
	if err = os.Rename(f.Name(), filepath.Join(dir, filepath.FromSlash(narKey))); err != nil {
		return "", "", s, err
	}
	ni := nix.NewNarInfo(path, s, nil)
	if err = ni.Sign(key); err != nil {
		return "", "", s, err
	}
	text, err := ni.MarshalText()
	if err != nil {
		return "", "", s, err
	}
	narinfoKey = sp.Hash + ".narinfo"
	if err = blob.ValidKey(narinfoKey); err != nil {
		return "", "", s, err
	}
	return narinfoKey, narKey, s, os.WriteFile(filepath.Join(dir, narinfoKey), text, 0o644)
}

// nixCopy times `nix copy --to file://dir?compression=zstd paths...` and returns the seconds
// and the bytes of the NAR files it wrote.
func nixCopy(ctx context.Context, dir string, paths []string) (float64, int64, error) {
	args := append([]string{"--extra-experimental-features", "nix-command", "copy",
		"--option", "substituters", "", "--to", "file://" + dir + "?compression=zstd"}, paths...)
	cmd := exec.CommandContext(ctx, "nix", args...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	secs := time.Since(start).Seconds()
	if err != nil {
		return 0, 0, fmt.Errorf("bench cache: nix copy: %w\n%s", err, out)
	}
	var size int64
	n := 0
	err = filepath.WalkDir(filepath.Join(dir, "nar"), func(_ string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		size += fi.Size()
		n++
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("bench cache: nix copy wrote no NARs: %w", err)
	}
	if n != len(paths) {
		return 0, 0, fmt.Errorf("bench cache: nix copy wrote %d NARs for %d paths\n%s", n, len(paths), out)
	}
	return secs, size, nil
}

// startNginx serves root with nginx on a free loopback port, as its own process group, and
// returns its URL and an idempotent stop function.
func startNginx(ctx context.Context, prefix, root string) (string, func(), error) {
	for _, d := range []string{"tmp", "logs"} {
		if err := os.MkdirAll(filepath.Join(prefix, d), 0o755); err != nil {
			return "", nil, err
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	user := ""
	if os.Geteuid() == 0 {
		user = "user root;" // workers must read the 0700 temporary directory
	}
	workers := runtime.NumCPU()
	conf := fmt.Sprintf(`%[1]s
worker_processes %[2]d;
pid %[3]s/nginx.pid;
error_log %[3]s/logs/error.log warn;
events { worker_connections 4096; }
http {
	access_log off;
	client_body_temp_path %[3]s/tmp/body;
	proxy_temp_path %[3]s/tmp/proxy;
	fastcgi_temp_path %[3]s/tmp/fastcgi;
	uwsgi_temp_path %[3]s/tmp/uwsgi;
	scgi_temp_path %[3]s/tmp/scgi;
	sendfile on;
	tcp_nopush on;
	keepalive_requests 100000000;
	keepalive_timeout 120s;
	types {
		text/x-nix-narinfo narinfo;
		application/x-nix-nar zst;
		application/json ls;
	}
	default_type text/x-nix-cache-info;
	server {
		listen %[4]s;
		root %[5]s;
	}
}
`, user, workers, prefix, addr, root)
	confPath := filepath.Join(prefix, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return "", nil, err
	}
	cmd := exec.Command(nginxBin, "-p", prefix, "-c", confPath, "-e", filepath.Join(prefix, "logs", "error.log"), "-g", "daemon off;")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("bench cache: start nginx: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(5 * time.Second):
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				<-exited
			}
		})
	}
	url := "http://" + addr
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := httpGet(ctx, url+"/nix-cache-info"); err == nil {
			return url, stop, nil
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(prefix, "logs", "error.log"))
			return "", nil, fmt.Errorf("bench cache: nginx exited: %s%s", out.String(), log)
		case <-ctx.Done():
			stop()
			return "", nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, errors.New("bench cache: nginx did not answer within 10 s")
		}
	}
}

func httpGet(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return b, err
}

// writeWrkScript writes a wrk script whose requests cycle through every narinfo (each thread
// starting at a different offset).
func writeWrkScript(path string, narinfos []string) error {
	var b strings.Builder
	b.WriteString("local paths = {\n")
	for _, n := range narinfos {
		fmt.Fprintf(&b, "  %q,\n", "/"+n)
	}
	b.WriteString(`}
local i = math.random(#paths)
request = function()
  i = i + 1
  if i > #paths then i = 1 end
  return wrk.format("GET", paths[i])
end
`)
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

type wrkResult struct {
	requestsPerSec float64
	bytesPerSec    float64
	socketErrors   string
}

var (
	wrkRPS      = regexp.MustCompile(`(?m)^Requests/sec:\s+([0-9.]+)`)
	wrkTransfer = regexp.MustCompile(`(?m)^Transfer/sec:\s+([0-9.]+)([KMGT]?B)`)
	wrkNon2xx   = regexp.MustCompile(`(?m)Non-2xx or 3xx responses:\s+(\d+)`)
	wrkSocket   = regexp.MustCompile(`(?m)Socket errors:\s+(.*)$`)
)

func runWrk(ctx context.Context, o CacheOptions, url, script string) (wrkResult, error) {
	args := []string{"-t", strconv.Itoa(o.Threads), "-c", strconv.Itoa(o.Connections),
		"-d", strconv.Itoa(o.Duration) + "s", "--timeout", "30s"}
	if script != "" {
		args = append(args, "-s", script)
	}
	out, err := exec.CommandContext(ctx, "wrk", append(args, url)...).CombinedOutput()
	if err != nil {
		return wrkResult{}, fmt.Errorf("%w\n%s", err, out)
	}
	return parseWrk(string(out))
}

func parseWrk(out string) (wrkResult, error) {
	var r wrkResult
	if m := wrkNon2xx.FindStringSubmatch(out); m != nil {
		return r, fmt.Errorf("%s responses were not 2xx or 3xx:\n%s", m[1], out)
	}
	m := wrkRPS.FindStringSubmatch(out)
	t := wrkTransfer.FindStringSubmatch(out)
	if m == nil || t == nil {
		return r, fmt.Errorf("no Requests/sec or Transfer/sec in wrk output:\n%s", out)
	}
	r.requestsPerSec, _ = strconv.ParseFloat(m[1], 64)
	v, _ := strconv.ParseFloat(t[1], 64)
	// wrk's units are binary.
	mult := map[string]float64{"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}[t[2]]
	r.bytesPerSec = v * mult
	if s := wrkSocket.FindStringSubmatch(out); s != nil {
		r.socketErrors = strings.TrimSpace(s[1])
	}
	if r.requestsPerSec == 0 {
		return r, fmt.Errorf("no request completed:\n%s", out)
	}
	return r, nil
}
