package eval_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/blobtest"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// fetcher is a fixed-output derivation called name fetching content from url: every one of a
// name and content has the same output path and derivation hash, whatever its url.
func fetcher(name, content, url string) string {
	sum := sha256.Sum256([]byte(content + "\n"))
	return fmt.Sprintf(`derivation { name = %q; system = builtins.currentSystem; builder = "/bin/sh";
    args = [ "-c" "echo %s > $out" ]; url = %q;
    outputHashMode = "flat"; outputHashAlgo = "sha256"; outputHash = %q; }`, name, content, url, hex.EncodeToString(sum[:]))
}

// TestSharedOutputsOfEqualHashes: two fixed-output derivations of one hash, fetched from
// different urls, claim one output path; Nix treats them as one, and so does ingest: both are
// accepted, and once one is built the path counts as built for a third.
func TestSharedOutputsOfEqualHashes(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.startEvaluator("ev-1")
	attrs := h.evaluateOnce("mirrors", fmt.Sprintf("{ a = %s; b = %s; }",
		fetcher("tarball", "the sources", "https://a.example/t.tar"), fetcher("tarball", "the sources", "https://b.example/t.tar")), 2)
	a, b := attrs["a"], attrs["b"]
	if a.Error != "" || b.Error != "" || a.DrvPath == "" || a.DrvPath == b.DrvPath {
		t.Fatalf("attributes a %+v and b %+v; want two derivations", a, b)
	}
	out := h.queryStrings(`SELECT DISTINCT output_path FROM derivation_outputs WHERE drv_path = ANY($1)`, []string{a.DrvPath, b.DrvPath})
	if len(out) != 1 {
		t.Fatalf("outputs %v, want one shared path", out)
	}
	for _, d := range []string{a.DrvPath, b.DrvPath} {
		if s := h.jobStatus(d); s == "" {
			t.Errorf("%s has no job", d)
		}
	}

	// a's output built and signed (the signer records its hash on a's rows only): a third
	// fetcher of the hash needs no build.
	if n := h.exec(`UPDATE derivation_outputs SET nar_hash = 'sha256:00', nar_size = 1 WHERE drv_path = $1`, a.DrvPath); n != 1 {
		t.Fatalf("recorded the hash of %d rows", n)
	}
	attrs = h.evaluateOnce("mirror-c", fmt.Sprintf("{ c = %s; }", fetcher("tarball", "the sources", "https://c.example/t.tar")), 1)
	c := attrs["c"]
	if c.Error != "" || c.DrvPath == "" || c.DrvPath == a.DrvPath {
		t.Fatalf("attribute c %+v; want a third derivation", c)
	}
	if s := h.jobStatus(c.DrvPath); s != "" {
		t.Errorf("%s, whose output a built, has a job (%s)", c.DrvPath, s)
	}
}

// TestSharedOutputsOfDifferentHashesRefused: a derivation the database has (its .drv in the
// cache, as one stored before the signer checked outputs) claims the output path of a
// derivation being ingested, with another derivation hash. Ingest refuses: the path cannot be
// built for both.
func TestSharedOutputsOfDifferentHashesRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.startEvaluator("ev-1")
	victimNix := h.lib() + `{ victim = mk "victim" [ ]; }`
	file := filepath.Join(t.TempDir(), "victim.nix")
	if err := os.WriteFile(file, []byte(victimNix), 0o644); err != nil {
		t.Fatal(err)
	}
	victimDrv := strings.TrimSpace(runNix(t, "nix-instantiate", file, "-A", "victim"))
	victim, err := nix.ReadDerivation("", victimDrv)
	if err != nil {
		t.Fatal(err)
	}
	forgedPath, text := nixtest.ForgedDerivation(victim)
	blobtest.PutDerivations(t, h.pool, h.cluster.Key, map[string][]byte{forgedPath: text})
	_, err = queue.Enqueue(context.Background(), h.pool, queue.EnqueueParams{Build: []string{}, Derivations: []queue.Derivation{{
		DrvPath: forgedPath, Name: "forged", System: victim.Platform, NarHash: "sha256:00", NarSize: int64(len(text)),
		Outputs: []queue.Output{{Name: "out", Path: victim.Outputs["out"].Path}}}}})
	if err != nil {
		t.Fatal(err)
	}

	_, commit := h.newProject("victim", map[string]string{"ci.nix": victimNix})
	e, _ := h.trigger("victim", "", commit)
	got := h.waitStatus(e.ID, status.EvalFailed)
	for _, want := range []string{forgedPath, victimDrv, victim.Outputs["out"].Path, "both claim output path"} {
		if !strings.Contains(got.Error, want) {
			t.Errorf("evaluation error %q does not name %q", got.Error, want)
		}
	}
	if got := h.queryStrings(`SELECT drv_path FROM derivations WHERE drv_path = $1`, victimDrv); len(got) != 0 {
		t.Errorf("the refused derivation reached the database: %v", got)
	}
}
