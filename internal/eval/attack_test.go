package eval_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
)

// TestForgedDerivationRefused is the poisoning of issue 24 at the evaluator: a project writes,
// with builtins.toFile, a .drv text claiming another project's output path (Nix refuses to
// register it, but the file stays in the store directory) and hands its path over as an
// attribute's drvPath. The attribute is an evaluation error saying why; nothing of the forged
// derivation reaches the database; the victim's derivation still gets its own job.
func TestForgedDerivationRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.startEvaluator("ev-1")
	sys := nixSystem(t)

	// The victim's derivation, as another project will evaluate it.
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
	victimOut := victim.Outputs["out"].Path

	// The forged .drv: the victim's output path, the attacker's builder.
	forgedPath, text := nixtest.ForgedDerivation(victim)
	_, commit := h.newProject("attacker", map[string]string{"ci.nix": fmt.Sprintf(`{
  a-write = builtins.toFile "forged.drv" %s;
  b-poison = { type = "derivation"; name = "forged"; system = %q; drvPath = %q; outPath = %q; };
}`, strconv.Quote(string(text)), sys, forgedPath, victimOut)})
	e, _ := h.trigger("attacker", "", commit)
	h.waitSucceeded(e.ID)
	if _, err := os.Stat(forgedPath); err != nil {
		t.Fatalf("the attack did not leave the forged .drv in the store directory (%v): the test no longer tests it", err)
	}
	poison := h.attrs(e.ID)["b-poison"]
	if poison.DrvPath != "" || !strings.Contains(poison.Error, forgedPath) {
		t.Errorf("b-poison: %+v; want an evaluation error naming the forged derivation", poison)
	}
	for _, q := range []string{
		`SELECT drv_path FROM derivations WHERE drv_path = $1`,
		`SELECT drv_path FROM build_jobs WHERE drv_path = $1`,
		`SELECT drv_path FROM derivation_outputs WHERE drv_path = $1`,
	} {
		if got := h.queryStrings(q, forgedPath); len(got) != 0 {
			t.Errorf("%s: %q; the forged derivation reached the database", q, got)
		}
	}

	// The victim's project evaluates its derivation and gets a job for it.
	_, vcommit := h.newProject("victim", map[string]string{"ci.nix": victimNix})
	ve, _ := h.trigger("victim", "", vcommit)
	h.waitSucceeded(ve.ID)
	if got := h.queryStrings(`SELECT drv_path FROM build_jobs WHERE drv_path = $1`, victimDrv); len(got) != 1 {
		t.Errorf("the victim's derivation has jobs %q, want its own", got)
	}
}
