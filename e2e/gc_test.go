package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/node"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

// gcGrace is the clusters' grace period: short, so that the test can wait until what it built
// is old, and long enough that junk made before the dry run is still young at the collection
// on a loaded machine.
const gcGrace = 10 * time.Second

// gcProject is two versions of a project: v1 builds "oldonly", v2 builds "newonly", whose output
// refers at run time to "dep" (not an attribute); both build "shared".
func gcProject(salt string, v int) string {
	lib := shLib(salt)
	if v == 1 {
		return lib + ` rec {
  shared = sh "shared" [] "";
  oldonly = sh "oldonly" [] "echo ${shared} > $out";
}`
	}
	return lib + ` let dep = sh "dep" [] ""; in rec {
  shared = sh "shared" [] "";
  newonly = sh "newonly" [] "echo ${dep} ${shared} > $out";
}`
}

// gcCluster is a build cluster with a short GC grace period and direct access to its cache.
type gcCluster struct {
	*buildCluster
	store blob.Store
}

func newGCCluster(t *testing.T, backend string) *gcCluster {
	c := newBuildCluster(t, buildClusterOptions{builders: 1, backend: backend,
		extraConfig: fmt.Sprintf("[retention]\ngrace = %q\n", gcGrace.String())})
	env := map[string]string{}
	for _, kv := range c.env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	cfg, err := config.Load(config.Overrides{ConfigFile: c.nodeCfg}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	store, err := node.OpenStore(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return &gcCluster{buildCluster: c, store: store}
}

// build evaluates ciNix and waits until its jobs succeeded.
func (c *gcCluster) build(ciNix string) (evalJSON, []jobRow) {
	c.t.Helper()
	e := c.evaluate(ciNix)
	jobs := c.waitFinished(e.ID, 2*time.Minute)
	for _, j := range jobs {
		if j.Status != status.JobSucceeded {
			c.t.Fatalf("%s; want succeeded", j)
		}
	}
	return e, jobs
}

// junk puts an unreferenced narinfo and NAR into the cache and returns their keys.
func (c *gcCluster) junk(name string) []string {
	c.t.Helper()
	body := make([]byte, 100)
	_, _ = rand.Read(body)
	narKey := nix.NarURL(nix.FormatSHA256(sha256.Sum256(body)))
	hash := nix.EncodeBase32(body[:20])
	p := nix.StoreDir + "/" + hash + "-" + name
	ni := &nix.NarInfo{StorePath: p, URL: narKey, Compression: "zstd", FileHash: "sha256:" + strings.TrimSuffix(narKey[4:], ".nar.zst"),
		FileSize: 100, NarHash: "sha256:" + strings.TrimSuffix(narKey[4:], ".nar.zst"), NarSize: 100}
	text, err := ni.MarshalText()
	if err != nil {
		c.t.Fatal(err)
	}
	ctx := context.Background()
	for key, b := range map[string][]byte{narKey: body, hash + ".narinfo": text} {
		if err := c.store.Put(ctx, key, bytes.NewReader(b), int64(len(b)), blob.PutOptions{}); err != nil {
			c.t.Fatal(err)
		}
	}
	return []string{hash + ".narinfo", narKey}
}

// has reports whether the cache holds key: in its blob store or, for a .drv's narinfo, in the
// database (blob.Derivations).
func (c *gcCluster) has(key string) bool {
	c.t.Helper()
	_, err := c.store.Head(context.Background(), key)
	if errors.Is(err, blob.ErrNotFound) {
		if h, ok := strings.CutSuffix(key, ".narinfo"); ok {
			_, _, err = blob.NewDerivations(c.pool).NarInfo(context.Background(), h)
		}
	}
	if errors.Is(err, blob.ErrNotFound) {
		return false
	}
	if err != nil {
		c.t.Fatal(err)
	}
	return true
}

// age makes evaluation id past the default retention (90 days).
func (c *gcCluster) age(id int64) {
	c.t.Helper()
	if _, err := c.pool.Exec(context.Background(), `UPDATE evaluations SET created_at = now() - interval '100 days' WHERE id = $1`, id); err != nil {
		c.t.Fatal(err)
	}
}

// waitOld waits until everything written so far is older than the grace period.
func (c *gcCluster) waitOld() {
	c.t.Helper()
	var start time.Time
	if err := c.pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&start); err != nil {
		c.t.Fatal(err)
	}
	waittest.For(c.t, 20*time.Second, func() bool {
		var now time.Time
		if err := c.pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&now); err != nil {
			c.t.Fatal(err)
		}
		return now.Sub(start) > gcGrace+time.Second
	}, "the grace period to pass")
}

// httpStatus GETs path from the cache.
func (c *gcCluster) httpStatus(path string) int {
	c.t.Helper()
	resp, err := http.Get(c.cacheURL + "/" + path)
	if err != nil {
		c.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func narinfoKey(p string) string { return strings.TrimPrefix(p, nix.StoreDir+"/")[:32] + ".narinfo" }

// TestGCKeepsTheNewerEvaluation builds two evaluations of a project and ages the older past
// retention: harmonia-ci gc deletes what only the older needed and nothing the newer needs,
// which real Nix still substitutes with signatures required, on a local store and on MinIO.
func TestGCKeepsTheNewerEvaluation(t *testing.T) {
	for _, backend := range []string{"local", "s3"} {
		t.Run(backend, func(t *testing.T) {
			c := newGCCluster(t, backend)
			salt := uniqueSalt(t)
			e1, _ := c.build(gcProject(salt, 1))
			_, jobs2 := c.build(gcProject(salt, 2))
			oldDrv := drvOf(t, e1, "oldonly")
			oldJob := c.job(oldDrv)
			oldOut := c.outputPaths([]jobRow{oldJob})[0]
			outs2 := c.outputPaths(jobs2)
			if len(jobs2) != 3 {
				t.Fatalf("the newer evaluation has %d jobs, want 3 (shared, dep, newonly)", len(jobs2))
			}
			oldJunk := c.junk("old-junk")
			c.age(e1.ID)
			c.waitOld()
			youngJunk := c.junk("young-junk")

			// The dry run lists the older evaluation's own objects and the old junk, and
			// deletes nothing.
			code, out := proctest.Run(t, c.env, "gc", "--dry-run", "--list", "--config", c.nodeCfg, "--database-url", c.dbURL,
				"--state-dir", filepath.Join(t.TempDir(), "cli"))
			if code != 0 {
				t.Fatalf("gc --dry-run: exit %d\n%s", code, out)
			}
			for _, k := range append([]string{narinfoKey(oldOut), narinfoKey(oldDrv), "log/" + filepath.Base(oldDrv)}, oldJunk...) {
				if !strings.Contains(out, k+"\t") {
					t.Errorf("gc --dry-run does not list %s:\n%s", k, out)
				}
				if !c.has(k) {
					t.Errorf("gc --dry-run deleted %s", k)
				}
			}
			for _, p := range outs2 {
				if strings.Contains(out, narinfoKey(p)) {
					t.Errorf("gc --dry-run would delete %s, an output of the newer evaluation:\n%s", narinfoKey(p), out)
				}
			}
			if strings.Contains(out, youngJunk[0]) {
				t.Errorf("gc --dry-run would delete %s, younger than the grace period", youngJunk[0])
			}

			out = c.cli.ok("gc")
			if !strings.Contains(out, "deleted 1 evaluations") {
				t.Errorf("gc reported:\n%s", out)
			}
			// Everything of the newer evaluation, with the runtime closure of its outputs
			// ("dep" is no attribute), substitutes with real Nix and signatures required.
			c.checkSubstitutable(outs2)
			for _, j := range jobs2 {
				c.checkLog(j, "building")
				if s := c.httpStatus(narinfoKey(j.DrvPath)); s != http.StatusOK {
					t.Errorf("the newer evaluation's %s: %d", narinfoKey(j.DrvPath), s)
				}
			}
			// The older evaluation's own objects (its build's logs, the latest and its attempt's)
			// and the old junk are gone; the young junk stays.
			for _, k := range append([]string{narinfoKey(oldOut), narinfoKey(oldDrv), "log/" + filepath.Base(oldDrv),
				queue.AttemptLogKey(oldDrv, oldJob.Attempt)}, oldJunk...) {
				if c.has(k) {
					t.Errorf("%s is still in the cache", k)
				}
			}
			if s := c.httpStatus(narinfoKey(oldOut)); s != http.StatusNotFound {
				t.Errorf("GET %s: %d, want 404", narinfoKey(oldOut), s)
			}
			for _, k := range youngJunk {
				if !c.has(k) {
					t.Errorf("%s, younger than the grace period, was deleted", k)
				}
			}
			var evals, oldRows int
			if err := c.pool.QueryRow(context.Background(), `SELECT count(*) FROM evaluations WHERE id = $1`, e1.ID).Scan(&evals); err != nil {
				t.Fatal(err)
			}
			if err := c.pool.QueryRow(context.Background(), `SELECT count(*) FROM derivations WHERE drv_path = $1`, oldDrv).Scan(&oldRows); err != nil {
				t.Fatal(err)
			}
			if evals != 0 || oldRows != 0 {
				t.Errorf("after gc: older evaluation rows %d, its derivation rows %d; want 0 and 0", evals, oldRows)
			}
		})
	}
}

// TestGCRacingAnEvaluation runs a collection while an evaluation of the expired commit's code
// publishes the same paths: whatever the interleaving, the new evaluation's outputs end up
// substitutable.
func TestGCRacingAnEvaluation(t *testing.T) {
	c := newGCCluster(t, "s3")
	salt := uniqueSalt(t)
	e1, _ := c.build(gcProject(salt, 1))
	c.build(gcProject(salt, 2))
	c.age(e1.ID)
	c.waitOld()

	var wg sync.WaitGroup
	var gcOut string
	var gcCode int
	wg.Add(1)
	go func() {
		defer wg.Done()
		gcCode, gcOut = c.cli.run("gc")
	}()
	// The same code again (another commit): the same derivations, which the collection is
	// deleting the rows and objects of.
	c.repo.Commit("again", map[string]string{"ci.nix": gcProject(salt, 1), "README": "again\n"})
	e3 := c.buildHead()
	wg.Wait()
	if gcCode != 0 {
		t.Fatalf("gc: exit %d\n%s", gcCode, gcOut)
	}
	if drvOf(t, e3, "oldonly") != drvOf(t, e1, "oldonly") {
		t.Fatal("the new evaluation has other derivations than the expired one")
	}
	outs := c.evalOutputs(e3.ID)
	if len(outs) != 2 {
		t.Fatalf("the new evaluation has outputs %v, want 2", outs)
	}
	c.checkSubstitutable(outs)
	// A second collection, with nothing racing, must not take anything of it either.
	c.cli.ok("gc")
	c.checkSubstitutable(outs)
}

// evalOutputs are the output paths of an evaluation's attributes and everything they depend on.
func (c *gcCluster) evalOutputs(evalID int64) []string {
	c.t.Helper()
	rows, err := c.pool.Query(context.Background(), `
WITH RECURSIVE drvs AS (
    SELECT drv_path FROM eval_attrs WHERE eval_id = $1 AND drv_path IS NOT NULL
  UNION
    SELECT di.input_drv FROM derivation_inputs di JOIN drvs ON di.referrer = drvs.drv_path
)
SELECT o.output_path FROM derivation_outputs o JOIN drvs USING (drv_path) ORDER BY 1`, evalID)
	if err != nil {
		c.t.Fatal(err)
	}
	outs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		c.t.Fatal(err)
	}
	return outs
}

// buildHead evaluates the repository's head and waits until its jobs (if it needs any) succeeded.
func (c *gcCluster) buildHead() evalJSON {
	c.t.Helper()
	var done evalJSON
	c.cli.json(&done, "eval", c.project, "--wait", "--json")
	if done.Status != status.EvalSucceeded {
		c.t.Fatalf("evaluation %d: %s (%s)", done.ID, done.Status, done.Error)
	}
	// Every job exists once the evaluation succeeded; there are none if the cache had it all.
	var jobs []jobRow
	waittest.For(c.t, 2*time.Minute, func() bool {
		c.checkRunning()
		jobs = c.evalJobs(done.ID)
		return !slices.ContainsFunc(jobs, func(j jobRow) bool { return !j.Status.Terminal() })
	}, "the jobs of evaluation %d to finish", done.ID)
	for _, j := range jobs {
		if j.Status != status.JobSucceeded {
			c.t.Fatalf("%s; want succeeded", j)
		}
	}
	return done
}
