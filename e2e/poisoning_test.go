package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// TestAttackPoisonAnotherProjectsOutput is the poisoning of issue 24, end to end on a cluster:
// an attacker's project writes, with builtins.toFile, a .drv claiming the output path of a
// derivation another project builds later, and names that file as an attribute's drvPath. The
// attribute fails, nothing is served for the victim's path, the victim's project then builds
// the path itself, and a fresh store substitutes the genuine content, signatures required.
func TestAttackPoisonAnotherProjectsOutput(t *testing.T) {
	t.Parallel()
	c := newBuildCluster(t, buildClusterOptions{builders: 1})
	salt := fmt.Sprintf("poison-%d", time.Now().UnixNano())
	victimNix := nixtest.Lib(salt) + `{ victim = mk "victim" [ ]; }`
	file := filepath.Join(t.TempDir(), "victim.nix")
	if err := os.WriteFile(file, []byte(victimNix), 0o644); err != nil {
		t.Fatal(err)
	}
	victimDrv := strings.TrimSpace(nixOut(t, "nix-instantiate", file, "-A", "victim", "--option", "substituters", ""))
	victim, err := nix.ReadDerivation("", victimDrv)
	if err != nil {
		t.Fatal(err)
	}
	victimOut := victim.Outputs["out"].Path

	forgedPath, text := nixtest.ForgedDerivation(victim)
	c.repo.Commit("attack", map[string]string{"ci.nix": fmt.Sprintf(`{
  a-write = builtins.toFile "forged.drv" %s;
  b-poison = { type = "derivation"; name = "forged"; system = %q; drvPath = %q; outPath = %q; };
}`, strconv.Quote(string(text)), victim.Platform, forgedPath, victimOut)})
	var e evalJSON
	c.cli.json(&e, "eval", c.project, "--wait", "--json")
	if e.Status != status.EvalSucceeded {
		t.Fatalf("the attacker's evaluation: %s (%s)", e.Status, e.Error)
	}
	for _, a := range e.Attrs {
		if a.Attr == "b-poison" && (a.DrvPath != "" || !strings.Contains(a.Error, forgedPath)) {
			t.Fatalf("b-poison: %+v; want an evaluation error naming the forged derivation", a)
		}
	}
	var jobs int
	if err := c.pool.QueryRow(t.Context(), `SELECT count(*) FROM build_jobs WHERE drv_path = $1`, forgedPath).Scan(&jobs); err != nil || jobs != 0 {
		t.Fatalf("the forged derivation has %d jobs (%v)", jobs, err)
	}
	if out, err := c.substitute(c.pub, victimOut); err == nil {
		t.Fatalf("the victim's output is served before the victim built it:\n%s", out)
	}

	// The victim's project builds its derivation itself, and Nix substitutes the genuine output.
	repo := nixtest.NewRepo(t)
	repo.Commit("victim", map[string]string{"ci.nix": victimNix})
	c.cli.ok("project", "add", "victim", "--repo", repo.Dir)
	var ve evalJSON
	c.cli.json(&ve, "eval", "victim", "--wait", "--json")
	if ve.Status != status.EvalSucceeded {
		t.Fatalf("the victim's evaluation: %s (%s)", ve.Status, ve.Error)
	}
	for _, j := range c.waitFinished(ve.ID, 2*time.Minute) {
		if j.Status != status.JobSucceeded || j.DrvPath != victimDrv {
			t.Fatalf("the victim's job: %s, want %s built", j, victimDrv)
		}
	}
	store := t.TempDir()
	args := []string{"--store", store, "--realise", victimOut, "--option", "substituters", c.cacheURL,
		"--option", "trusted-public-keys", c.pub, "--option", "require-sigs", "true",
		"--option", "build-users-group", "", "--option", "max-jobs", "0"}
	cmd := exec.Command("nix-store", args...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("a fresh store could not substitute the victim's output: %v\n%s", err, out)
	}
	got, err := os.ReadFile(filepath.Join(store, victimOut))
	if err != nil || !strings.HasPrefix(string(got), "victim") {
		t.Fatalf("the victim's output holds %q (%v); want what its derivation builds", got, err)
	}
}
