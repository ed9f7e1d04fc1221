package gcbench

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/harmonia-ci/harmonia-ci/internal/bench"
	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
)

// gcObject is one cache object of the synthetic package set.
type gcObject struct {
	key  string
	body []byte
	live bool
}

// gcWorld is a synthetic package set: live derivations (a .drv and an output each, both
// published) whose inputs form a DAG, the evaluation attributes that keep them, and dead store
// paths that only the cache holds.
type gcWorld struct {
	objects     []gcObject // besides nix-cache-info
	derivations []queue.Derivation
	roots       []string // derivations no other one uses as an input
	unbuilt     []string // roots whose build failed: the cache has no output
	livePaths   int      // with a narinfo and a NAR
	deadPaths   int
}

// generateGCWorld makes objects/2 store paths, each a narinfo and a NAR. A share liveFraction
// of them belongs to derivations: the .drv's narinfo refers to its input .drvs, the output's
// to its inputs' outputs, so the mark follows closures. Each derivation has one to four
// inputs, one near it and the others anywhere before it. The dead paths refer to earlier dead
// paths and now and then to a live output, as an old build of a package that is still built.
// A share unbuilt of the derivations (roots only: nothing built depends on them) failed to
// build, so the cache has only their .drv; their objects are left out of the count.
func generateGCWorld(objects int, liveFraction, unbuilt float64, seed uint64) (*gcWorld, error) {
	paths := objects / 2
	pairs := min(int(math.Round(float64(paths)*liveFraction/2)), paths/2)
	rng := rand.New(rand.NewPCG(seed, uint64(objects)))
	hash := func() string {
		b := make([]byte, 32)
		for i := range b {
			b[i] = bench.NixBase32[rng.IntN(32)]
		}
		return string(b)
	}
	w := &gcWorld{livePaths: 2 * pairs, deadPaths: paths - 2*pairs}
	drvs, outs := make([]string, pairs), make([]string, pairs)
	used := make([]bool, pairs)
	for i := range pairs {
		name := "pkg-" + strconv.Itoa(i)
		drvs[i] = nix.StoreDir + "/" + hash() + "-" + name + ".drv"
		outs[i] = nix.StoreDir + "/" + hash() + "-" + name
		var inputs []int
		if i > 0 {
			inputs = append(inputs, i-1-rng.IntN(min(i, 8)))
			for range rng.IntN(4) {
				inputs = append(inputs, rng.IntN(i))
			}
			slices.Sort(inputs)
			inputs = slices.Compact(inputs)
		}
		d := queue.Derivation{DrvPath: drvs[i], Name: name, System: "x86_64-linux",
			NarHash: nix.FormatSHA256(sha256.Sum256([]byte(drvs[i]))), NarSize: 1024,
			Outputs: []queue.Output{{Name: "out", Path: outs[i]}}, InputSrcs: []string{}}
		var drvRefs, outRefs []string
		for _, j := range inputs {
			used[j] = true
			d.Inputs = append(d.Inputs, queue.Input{DrvPath: drvs[j], Outputs: []string{"out"}})
			drvRefs, outRefs = append(drvRefs, base(drvs[j])), append(outRefs, base(outs[j]))
		}
		w.derivations = append(w.derivations, d)
		if err := w.add(rng, drvs[i], drvRefs, "", true); err != nil {
			return nil, err
		}
		if err := w.add(rng, outs[i], outRefs, base(drvs[i]), true); err != nil {
			return nil, err
		}
	}
	for i := range pairs {
		if !used[i] {
			w.roots = append(w.roots, drvs[i])
		}
	}
	dead := make([]string, 0, w.deadPaths)
	for i := range w.deadPaths {
		p := nix.StoreDir + "/" + hash() + "-old-" + strconv.Itoa(i)
		var refs []string
		if i > 0 {
			for range rng.IntN(3) {
				refs = append(refs, base(dead[rng.IntN(i)]))
			}
		}
		if pairs > 0 && rng.IntN(4) == 0 {
			refs = append(refs, base(outs[rng.IntN(pairs)]))
		}
		dead = append(dead, p)
		if err := w.add(rng, p, refs, "", false); err != nil {
			return nil, err
		}
	}
	if n := min(int(math.Round(float64(pairs)*unbuilt)), len(w.roots)); n > 0 {
		// A generator of its own, so that the package set is the same with and without.
		urng := rand.New(rand.NewPCG(seed, uint64(objects)^0xfa11))
		failed := map[string]bool{}
		for _, k := range urng.Perm(len(w.roots))[:n] {
			failed[w.roots[k]] = true
			w.unbuilt = append(w.unbuilt, w.roots[k])
		}
		// Derivation i's objects are 4i to 4i+3: the .drv's narinfo and NAR, the output's.
		kept := w.objects[:0]
		for k, ob := range w.objects {
			if k >= 4*pairs || k%4 < 2 || !failed[drvs[k/4]] {
				kept = append(kept, ob)
			}
		}
		w.objects = kept
		w.livePaths -= n
	}
	return w, nil
}

func base(p string) string { return strings.TrimPrefix(p, nix.StoreDir+"/") }

// add makes path's NAR (64 B to 1 KiB of random bytes) and narinfo.
func (w *gcWorld) add(rng *rand.Rand, path string, refs []string, deriver string, live bool) error {
	body := make([]byte, 64+rng.IntN(961))
	for i := range body {
		body[i] = byte(rng.Uint32())
	}
	fileHash := nix.FormatSHA256(sha256.Sum256(body))
	ni := &nix.NarInfo{StorePath: path, URL: nix.NarURL(fileHash), Compression: "zstd",
		FileHash: fileHash, FileSize: int64(len(body)),
		NarHash: nix.FormatSHA256(sha256.Sum256(append([]byte("nar"), body...))), NarSize: int64(3 * len(body)),
		References: refs, Deriver: deriver}
	text, err := ni.MarshalText()
	if err != nil {
		return fmt.Errorf("bench gc: %w", err)
	}
	w.objects = append(w.objects,
		gcObject{key: base(path)[:32] + ".narinfo", body: text, live: live},
		gcObject{key: ni.URL, body: body, live: live})
	return nil
}

// record enqueues the derivations as project projectID's, marks their jobs finished a day
// ago (succeeded, or failed if unbuilt), and records a succeeded evaluation whose attributes are the roots.
func (w *gcWorld) record(ctx context.Context, pool *pgxpool.Pool, projectID int64) error {
	for chunk := range slices.Chunk(w.derivations, 5000) {
		if _, err := queue.Enqueue(ctx, pool, queue.EnqueueParams{ProjectID: &projectID, Derivations: chunk}); err != nil {
			return err
		}
	}
	if _, err := pool.Exec(ctx, sqlJobsFinish, projectID, w.unbuilt); err != nil {
		return fmt.Errorf("finish jobs: %w", err)
	}
	var evalID int64
	if err := pool.QueryRow(ctx, sqlEvalCreate,
		projectID, bench.RandomHex(20)).Scan(&evalID); err != nil {
		return fmt.Errorf("record evaluation: %w", err)
	}
	if _, err := pool.Exec(ctx, sqlEvalAttrsCreate, evalID, w.roots); err != nil {
		return fmt.Errorf("record attributes: %w", err)
	}
	_, err := pool.Exec(ctx, sqlAnalyze)
	return err
}

// forget deletes what record recorded, so the next size starts from an empty database.
func (w *gcWorld) forget(ctx context.Context, pool *pgxpool.Pool, projectID int64) error {
	drvs := make([]string, len(w.derivations))
	for i, d := range w.derivations {
		drvs[i] = d.DrvPath
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, q := range []string{
			sqlProjectEvalsDelete,
			sqlProjectJobsDelete,
		} {
			if _, err := tx.Exec(ctx, q, projectID); err != nil {
				return fmt.Errorf("forget the package set: %w", err)
			}
		}
		if _, err := tx.Exec(ctx, sqlDerivationsDelete, drvs); err != nil {
			return fmt.Errorf("forget the package set: %w", err)
		}
		return nil
	})
}

// write puts nix-cache-info and every object into store, writers at a time.
func (w *gcWorld) write(ctx context.Context, store blob.Store, writers int) error {
	info := []byte("StoreDir: /nix/store\nWantMassQuery: 1\nPriority: 40\n")
	if err := store.Put(ctx, "nix-cache-info", bytes.NewReader(info), int64(len(info)), blob.PutOptions{}); err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(writers)
	for _, ob := range w.objects {
		g.Go(func() error {
			return store.Put(gctx, ob.key, bytes.NewReader(ob.body), int64(len(ob.body)), blob.PutOptions{})
		})
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("fill the cache: %w", err)
	}
	if s, ok := store.(blob.Syncer); ok {
		return s.Sync(ctx)
	}
	return nil
}

// check lists store after a collection: every live object and nix-cache-info must be there,
// no dead one, nothing else.
func (w *gcWorld) check(ctx context.Context, store blob.Store) (kept, gone int, err error) {
	present := make(map[string]bool, len(w.objects))
	if err := store.List(ctx, "", func(i blob.Info) error { present[i.Key] = true; return nil }); err != nil {
		return 0, 0, err
	}
	var live int
	for _, ob := range w.objects {
		switch {
		case ob.live:
			live++
			if present[ob.key] {
				kept++
			}
		case !present[ob.key]:
			gone++
		}
	}
	dead := len(w.objects) - live
	if kept != live || gone != dead || !present["nix-cache-info"] || len(present) != live+1 {
		return kept, gone, fmt.Errorf("after the collection %d of %d live objects are left, %d of %d dead ones gone, nix-cache-info present %v, %d objects in all",
			kept, live, gone, dead, present["nix-cache-info"], len(present))
	}
	return kept, gone, nil
}
