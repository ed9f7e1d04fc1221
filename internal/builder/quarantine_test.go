package builder_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/builder"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// A trusted job building again an output only a pull request built really builds it, though
// the builder's store holds the pull request's build: Nix would otherwise take it as done, and
// the signer would take the pull request's NAR as reproduced.
func TestQuarantinedOutputBuiltAgain(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	// imp writes what the marker file says at the time of its build.
	marker := filepath.Join(t.TempDir(), "marker")
	if err := os.WriteFile(marker, []byte("the pull request's build\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	expr := fmt.Sprintf(`{ imp = builtins.derivation {
  name = "imp";
  system = builtins.currentSystem;
  builder = "/bin/sh";
  salt = "%s";
  args = [ "-c" "read -r v < %s; echo \"$v\" > $out" ];
}; }`, h.salt, marker)
	drv := h.instantiate(expr, "imp")["imp"]
	imp := h.outputs(drv)["out"]

	h.enqueue(drv)
	queuetest.Exec(t, h.pool, `UPDATE build_jobs SET trusted = false WHERE drv_path = $1`, drv)
	b := h.startBuilder("builder-a", builder.Config{Store: builder.Store{SandboxPaths: []string{marker}},
		Limits: builder.BuildLimits{Timeout: time.Minute}})
	h.waitStatus(drv, status.JobSucceeded)
	prHash := h.canonicalHashes(drv)["out"]
	if q := queuetest.QueryInt(t, h.pool, `SELECT count(*) FROM derivation_outputs WHERE drv_path = $1 AND quarantined`, drv); q != 1 {
		t.Fatalf("the pull request's build is not quarantined")
	}

	// A branch's evaluation needs imp and its project does not promote: the job goes back to
	// the queue, trusted.
	if err := os.WriteFile(marker, []byte("the trusted build\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	queuetest.Exec(t, h.pool, `UPDATE build_jobs SET status = 'pending', trusted = true, claimed_by = NULL, claimed_at = NULL, started_at = NULL,
		finished_at = NULL WHERE drv_path = $1`, drv)
	h.waitJob(drv, "built again", func(j jobRow) bool { return j.Attempt == 2 && j.Status == status.JobSucceeded })
	var quarantined bool
	var narHash, nonrepro string
	if err := h.pool.QueryRow(h.ctx(), `SELECT quarantined, nar_hash, COALESCE(nonrepro_nar_hash, '') FROM derivation_outputs WHERE drv_path = $1`,
		drv).Scan(&quarantined, &narHash, &nonrepro); err != nil {
		t.Fatal(err)
	}
	if quarantined || narHash == prHash || nonrepro != prHash {
		t.Errorf("after the trusted build: quarantined %v, NAR hash %s, non-reproducible %q; want released, another hash than the pull request's %s, recorded as non-reproducible",
			quarantined, narHash, nonrepro, prHash)
	}
	if got, err := os.ReadFile(filepath.Join(b.store, imp)); err != nil || string(got) != "the trusted build\n" {
		t.Errorf("%s in the builder's store holds %q, %v; want the trusted build", imp, got, err)
	}
	if code, body := h.narInfo(imp); code != 200 || !slices.Contains(strings.Split(body, "\n"), "NarHash: "+narHash) {
		t.Errorf("narinfo of %s: %d\n%s\nwant the trusted build's NarHash %s", imp, code, body, narHash)
	}
}
