// Package upload publishes store paths to the binary cache through the signer, under the claim
// of whoever publishes: a builder's outputs and log under its job (each path serialised as a
// NAR, hashed and compressed in one pass, PUT to a presigned URL, then signed by
// build-complete), an evaluator's .drv files (as text) and sources under its evaluation.
package upload

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/signerapi"
	"github.com/harmonia-ci/harmonia-ci/internal/signerclient"
)

// Path is one store path to publish.
type Path struct {
	StorePath  string   // /nix/store/…
	References []string // full store paths
	Deriver    string   // full path or basename; "" for none
	// NarSize is the NAR's size if known: with a Source, a NAR known to be small is compressed
	// in memory, any other goes through a temporary file (a daemon's stream cannot be restarted).
	NarSize int64
}

// NARSource writes the NAR of a store path to w: a builder's daemon connection (NarFromPath).
type NARSource func(ctx context.Context, storePath string, w io.Writer) error

// Publisher publishes store paths from one Nix store.
type Publisher struct {
	// Signer is the signer client.
	Signer *signerclient.Client
	// StoreRoot is the directory the store paths live under: "" for the system store, or a
	// chroot store's directory.
	StoreRoot string
	// Source, if set, produces the NARs of a build's outputs instead of StoreRoot's files.
	Source NARSource
	// HTTP does the PUTs; default: a client with a 10 minute timeout.
	HTTP *http.Client
	// Parallel bounds concurrent PUTs, and compressions up to one per CPU (GOMAXPROCS);
	// default 16.
	Parallel int
	// Batch bounds the sources, or the .drv files, of one upload-slots or publish call of an
	// evaluation; default 500. A build's outputs always go in one call: they complete together.
	Batch int
	// Observe, if set, is told how long each step took: "upload" (NARs hashed, compressed
	// and PUT) and "sign" (build-complete) — the builder's per-job overhead figures.
	Observe func(step string, d time.Duration)
}

// memLimit is the largest NAR compressed in memory; bigger ones go through a temporary file.
const memLimit = 4 << 20

// prepared is one path serialised, hashed and compressed.
type prepared struct {
	out  signerapi.Output
	body []byte // compressed NAR, or nil when in file
	file string
}

func (p *prepared) open() (io.ReadCloser, error) {
	if p.file != "" {
		return os.Open(p.file)
	}
	return io.NopCloser(bytes.NewReader(p.body)), nil
}

// Response totals the signer's answers.
type Response = signerapi.PublishResponse

// Log is a build log to upload with a build's outputs; it is stored zstd-compressed under Key
// (log/<drv basename>, where the cache's /log/<drv> finds it).
type Log struct {
	Key  string
	Data []byte // uncompressed
}

// preparedLog is a log compressed and hashed for its upload slot.
type preparedLog struct {
	key  string
	body []byte
	done bool
}

// PreparedBuild is a build's outputs serialised, hashed and compressed: what SendBuild uploads.
// The store is no longer needed once it exists. Close removes its temporary files.
type PreparedBuild struct {
	prep    []*prepared
	cleanup func()
	took    time.Duration
}

// Took is how long PrepareBuild took.
func (b *PreparedBuild) Took() time.Duration { return b.took }

// Close removes the temporary files of large outputs; it may be called more than once.
func (b *PreparedBuild) Close() {
	if b.cleanup != nil {
		b.cleanup()
		b.cleanup = nil
	}
}

// PrepareBuild serialises, hashes and compresses a build's outputs, the first half of a build's
// publication: a builder frees its build slot after it, before the network round trips.
func (p *Publisher) PrepareBuild(ctx context.Context, paths []Path) (*PreparedBuild, error) {
	start := time.Now()
	prep, cleanup, err := p.prepareAll(ctx, paths)
	if err != nil {
		return nil, err
	}
	return &PreparedBuild{prep: prep, cleanup: cleanup, took: time.Since(start)}, nil
}

// SendBuild uploads a prepared build and its log, then build-complete signs the outputs and
// records the success with the log. A failed or expired upload is retried with fresh slots;
// what already landed is skipped by the signer.
func (p *Publisher) SendBuild(ctx context.Context, job queue.Claim, b *PreparedBuild, log *Log) (Response, error) {
	start := time.Now().Add(-b.took)
	var pl *preparedLog
	req := signerapi.BuildCompleteRequest{Job: *wireJob(job), Outputs: make([]signerapi.Output, len(b.prep))}
	if log != nil {
		pl = &preparedLog{key: log.Key, body: nix.Compress(log.Data)}
		req.LogKey = log.Key
	}
	if err := p.uploadAll(ctx, slotClaim{job: wireJob(job)}, b.prep, pl); err != nil {
		return Response{}, err
	}
	p.observe("upload", start)
	signStart := time.Now()
	for i, pr := range b.prep {
		req.Outputs[i] = pr.out
	}
	resp, err := p.Signer.BuildComplete(ctx, req)
	if err != nil {
		return resp, fmt.Errorf("publish: build-complete: %w", err)
	}
	p.observe("sign", signStart)
	return resp, nil
}

// UploadLog uploads a failed build's log alone (a successful build's log goes with its
// outputs, see SendBuild). The caller records log.Key with the failure.
func (p *Publisher) UploadLog(ctx context.Context, job queue.Claim, log Log) error {
	pl := &preparedLog{key: log.Key, body: nix.Compress(log.Data)}
	if err := p.uploadAll(ctx, slotClaim{job: wireJob(job)}, nil, pl); err != nil {
		return fmt.Errorf("upload log %s: %w", log.Key, err)
	}
	return nil
}

// maxPublishText bounds the .drv text of one publish request, well under the signer's body limit.
const maxPublishText = 4 << 20

// PublishEval publishes an evaluation's .drv files and sources under its claim. drvs must come
// inputs first (each after the .drv files it refers to), so that every request refers only to
// what it publishes or what was published before. Sources go first, at most Batch to an
// upload-slots and publish request, each after the sources among them it refers to.
func (p *Publisher) PublishEval(ctx context.Context, eval signerapi.EvalClaim, drvs []string, sources []Path) (Response, error) {
	var total Response
	add := func(r Response) {
		total.Written += r.Written
		total.Skipped += r.Skipped
		total.Conflicts += r.Conflicts
	}
	sources = refsFirst(sources)
	for start := 0; start < len(sources); start += p.batch() {
		resp, err := p.publishSources(ctx, eval, sources[start:min(start+p.batch(), len(sources))])
		if err != nil {
			return total, err
		}
		add(resp)
	}
	req := signerapi.PublishRequest{Eval: eval}
	size := 0
	flush := func() error {
		if len(req.Derivations) == 0 {
			return nil
		}
		resp, err := p.Signer.Publish(ctx, req)
		if err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		add(resp)
		req = signerapi.PublishRequest{Eval: eval}
		size = 0
		return nil
	}
	for _, d := range drvs {
		text, err := os.ReadFile(filepath.Join(p.root(), d))
		if err != nil {
			return total, fmt.Errorf("publish %s: %w", d, err)
		}
		if len(req.Derivations) >= p.batch() || (size+len(text) > maxPublishText && len(req.Derivations) > 0) {
			if err := flush(); err != nil {
				return total, err
			}
		}
		req.Derivations = append(req.Derivations, signerapi.DerivationText{StorePath: d, Text: string(text)})
		size += len(text)
	}
	return total, flush()
}

// publishSources uploads sources and publishes them in one request.
func (p *Publisher) publishSources(ctx context.Context, eval signerapi.EvalClaim, sources []Path) (Response, error) {
	prep, cleanup, err := p.prepareAll(ctx, sources)
	if err != nil {
		return Response{}, err
	}
	defer cleanup()
	if err := p.uploadAll(ctx, slotClaim{eval: &eval}, prep, nil); err != nil {
		return Response{}, err
	}
	req := signerapi.PublishRequest{Eval: eval, Sources: make([]signerapi.Output, len(prep))}
	for i, pr := range prep {
		req.Sources[i] = pr.out
	}
	resp, err := p.Signer.Publish(ctx, req)
	if err != nil {
		return resp, fmt.Errorf("publish: %w", err)
	}
	return resp, nil
}

// refsFirst orders paths so that each comes after the paths among them it refers to (a
// builtins.toFile text naming another source); otherwise it keeps their order.
func refsFirst(paths []Path) []Path {
	index := make(map[string]int, len(paths))
	for i, p := range paths {
		index[p.StorePath] = i
	}
	done := make([]bool, len(paths))
	out := make([]Path, 0, len(paths))
	var visit func(i int)
	visit = func(i int) {
		if done[i] {
			return
		}
		done[i] = true // references form no cycles but a path's own
		for _, r := range paths[i].References {
			if j, ok := index[r]; ok {
				visit(j)
			}
		}
		out = append(out, paths[i])
	}
	for i := range paths {
		visit(i)
	}
	return out
}

func (p *Publisher) batch() int {
	if p.Batch <= 0 {
		return 500
	}
	return p.Batch
}

func (p *Publisher) parallel() int {
	if p.Parallel <= 0 {
		return 16
	}
	return p.Parallel
}

// prepareAll serialises, hashes and compresses paths; cleanup removes the temporary files of
// large ones.
func (p *Publisher) prepareAll(ctx context.Context, paths []Path) ([]*prepared, func(), error) {
	tmp, err := os.MkdirTemp("", "harmonia-upload-")
	if err != nil {
		return nil, nil, fmt.Errorf("publish: %w", err)
	}
	cleanup := func() { os.RemoveAll(tmp) }
	prep := make([]*prepared, len(paths))
	g, gctx := errgroup.WithContext(ctx)
	// Compression is CPU-bound: more at once than CPUs only adds encoders (10 MB each) that
	// evict each other's windows from the CPU caches, which measured slower.
	g.SetLimit(min(p.parallel(), runtime.GOMAXPROCS(0)))
	for i, path := range paths {
		g.Go(func() error {
			pr, err := p.prepare(gctx, path, tmp, i)
			prep[i] = pr
			return err
		})
	}
	if err := g.Wait(); err != nil {
		cleanup()
		return nil, nil, err
	}
	return prep, cleanup, nil
}

func (p *Publisher) observe(step string, since time.Time) {
	if p.Observe != nil {
		p.Observe(step, time.Since(since))
	}
}

func (p *Publisher) prepare(ctx context.Context, path Path, tmp string, i int) (*prepared, error) {
	pr := &prepared{out: signerapi.Output{StorePath: path.StorePath, References: path.References}}
	if path.Deriver != "" {
		pr.out.Deriver = filepath.Base(path.Deriver)
	}
	if pr.out.References == nil {
		pr.out.References = []string{}
	}
	write := p.Source
	if write == nil {
		fsPath := filepath.Join(p.root(), path.StorePath)
		write = func(_ context.Context, _ string, w io.Writer) error { return nix.WriteNAR(w, fsPath) }
	}
	// A file tree is tried in memory and, when too big, serialised again into a file; a
	// source's stream cannot be restarted, so only a NAR known to be small goes to memory.
	if p.Source == nil || (path.NarSize > 0 && path.NarSize <= memLimit) {
		var nar bytes.Buffer
		err := write(ctx, path.StorePath, &limitedWriter{w: &nar, left: memLimit})
		switch {
		case err == nil:
			sizes, body := compressSmall(nar.Bytes())
			pr.body = body
			pr.setSizes(sizes)
			return pr, nil
		case !errors.Is(err, errTooBig) || p.Source != nil:
			return nil, fmt.Errorf("publish %s: %w", path.StorePath, err)
		}
	}
	pr.file = filepath.Join(tmp, fmt.Sprintf("%d.nar.zst", i))
	f, err := os.Create(pr.file)
	if err != nil {
		return nil, fmt.Errorf("publish %s: %w", path.StorePath, err)
	}
	defer f.Close()
	sizes, err := nix.CompressNARFrom(ctx, func(w io.Writer) error { return write(ctx, path.StorePath, w) }, f)
	if err != nil {
		return nil, fmt.Errorf("publish %s: %w", path.StorePath, err)
	}
	pr.setSizes(sizes)
	return pr, f.Close()
}

func (p *Publisher) root() string {
	if p.StoreRoot == "" {
		return "/"
	}
	return p.StoreRoot
}

func (pr *prepared) setSizes(s nix.Sizes) {
	pr.out.NarHash, pr.out.NarSize, pr.out.FileHash, pr.out.FileSize = s.NarHash, s.NarSize, s.FileHash, s.FileSize
}

func compressSmall(nar []byte) (nix.Sizes, []byte) {
	body := nix.Compress(nar)
	return nix.Sizes{
		NarHash: nix.FormatSHA256(sha256.Sum256(nar)), NarSize: int64(len(nar)),
		FileHash: nix.FormatSHA256(sha256.Sum256(body)), FileSize: int64(len(body)),
	}, body
}

var errTooBig = errors.New("nar too big for memory")

type limitedWriter struct {
	w    io.Writer
	left int
}

func (l *limitedWriter) Write(b []byte) (int, error) {
	if len(b) > l.left {
		return 0, errTooBig
	}
	l.left -= len(b)
	return l.w.Write(b)
}

// wireJob is a job's claim as the signer's API carries it; the node is the caller's token's.
func wireJob(c queue.Claim) *signerapi.JobClaim {
	return &signerapi.JobClaim{ID: c.JobID, Attempt: c.Attempt}
}

// slotClaim is the claim upload slots are asked under, in the API's form: a build's job or an
// evaluation.
type slotClaim struct {
	job  *signerapi.JobClaim
	eval *signerapi.EvalClaim
}

// uploadAll gets slots for part and PUTs what the store lacks, retrying failed uploads with
// fresh slots (a URL may expire, a PUT may fail) up to three times.
func (p *Publisher) uploadAll(ctx context.Context, claim slotClaim, part []*prepared, log *preparedLog) error {
	parallel := p.parallel()
	todo := part
	var lastErr error
	for round := 0; round < 3 && (len(todo) > 0 || (log != nil && !log.done)); round++ {
		if round > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Duration(round) * time.Second):
			}
		}
		req := signerapi.UploadSlotsRequest{Job: claim.job, Eval: claim.eval, Outputs: make([]signerapi.Output, len(todo))}
		for i, pr := range todo {
			req.Outputs[i] = pr.out
		}
		if log != nil && !log.done {
			sum := sha256.Sum256(log.body)
			req.Log = &signerapi.LogUpload{Key: log.key, Size: int64(len(log.body)), SHA256: hex.EncodeToString(sum[:])}
		}
		slots, err := p.Signer.UploadSlots(ctx, req)
		if err != nil {
			return fmt.Errorf("publish: upload-slots: %w", err)
		}
		if len(slots.Outputs) != len(todo) {
			return fmt.Errorf("publish: upload-slots answered %d slots for %d paths", len(slots.Outputs), len(todo))
		}
		var mu sync.Mutex
		var failed []*prepared
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(parallel)
		for i, slot := range slots.Outputs {
			if slot.Skipped || slot.Upload == nil {
				continue
			}
			pr := todo[i]
			g.Go(func() error {
				if err := p.put(gctx, slot.Upload, pr); err != nil {
					if gctx.Err() != nil {
						return gctx.Err()
					}
					mu.Lock()
					failed, lastErr = append(failed, pr), err
					mu.Unlock()
				}
				return nil
			})
		}
		if req.Log != nil && slots.Log != nil {
			g.Go(func() error {
				err := p.putBody(gctx, slots.Log, log.key, log.body)
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					log.done = true
				} else if gctx.Err() == nil {
					lastErr = err
				}
				return gctx.Err()
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
		todo = failed
	}
	if len(todo) > 0 {
		return fmt.Errorf("publish: %d uploads failed: %w", len(todo), lastErr)
	}
	if log != nil && !log.done {
		return fmt.Errorf("publish: log upload failed: %w", lastErr)
	}
	return nil
}

func (p *Publisher) put(ctx context.Context, u *signerapi.Upload, pr *prepared) error {
	body, err := pr.open()
	if err != nil {
		return err
	}
	defer body.Close()
	return p.send(ctx, u, pr.out.StorePath, body, pr.out.FileSize, true)
}

func (p *Publisher) putBody(ctx context.Context, u *signerapi.Upload, what string, body []byte) error {
	return p.send(ctx, u, what, bytes.NewReader(body), int64(len(body)), false)
}

// send PUTs body to u. A NAR upload that S3 refuses with 412 found the NAR there already (its
// key is its content's hash), which is what the upload was for.
func (p *Publisher) send(ctx context.Context, u *signerapi.Upload, what string, body io.Reader, size int64, nar bool) error {
	req, err := http.NewRequestWithContext(ctx, u.Method, u.URL, body)
	if err != nil {
		return fmt.Errorf("put %s: %w", what, err)
	}
	for k, vs := range u.Headers {
		if strings.EqualFold(k, "Content-Length") {
			continue
		}
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	req.ContentLength = size
	client := p.HTTP
	if client == nil {
		client = defaultHTTP
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("put %s: %w", what, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if nar && resp.StatusCode == http.StatusPreconditionFailed {
		return nil
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("put %s: %s: %s", what, resp.Status, strings.TrimSpace(string(msg)))
	}
	return nil
}

var defaultHTTP = &http.Client{Timeout: 10 * time.Minute, Transport: &http.Transport{
	Proxy: http.ProxyFromEnvironment, MaxIdleConnsPerHost: 32, IdleConnTimeout: 90 * time.Second,
}}
