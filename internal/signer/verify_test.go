package signer

import (
	"net/http"
	"strings"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/blobtest"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/signerapi"
)

// TestForgedJobRefused is the poisoning attack past the evaluator: a job whose derivation rows
// list the victim's output path (as a compromised evaluator's login could insert them), its
// .drv the forged one, completed by a builder holding its claim. The signer recomputes the
// outputs from the .drv it holds and signs nothing; the victim's own build still goes through.
func TestForgedJobRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		stored bool // the forged .drv is in the signer's .drv objects (an older signer took it)
		want   string
	}{
		{"forged .drv stored", true, "are not the ones its text gives"},
		{"forged .drv never published", false, "the cache has no .drv"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, false)
			victim := fixture("victim", nil)
			parsed, err := nix.ParseDerivation(victim.Text)
			if err != nil {
				t.Fatal(err)
			}
			forgedPath, forgedText := nixtest.ForgedDerivation(parsed)
			if c.stored {
				blobtest.PutDerivations(t, e.pool, e.key, map[string][]byte{forgedPath: forgedText})
			}
			forged := queuetest.NixDrv{Derivation: queue.Derivation{DrvPath: forgedPath, Name: "forged", System: system,
				NarHash: victim.NarHash, NarSize: victim.NarSize,
				Outputs: []queue.Output{{Name: "out", Path: victim.Out("out")}}}}
			queuetest.Enqueue(t, e.pool, nil, forged.Derivation)
			fj := e.claimPath(t, "builder-1", forgedPath)
			tok := e.builder(t, "builder-1")
			poison := built(t, victim.Out("out"), "echo attacker")

			before := e.state(t)
			for _, r := range []struct {
				path string
				body any
			}{
				{"/api/upload-slots", signerapi.UploadSlotsRequest{Job: jobClaim(fj), Outputs: []signerapi.Output{poison.out}}},
				{"/api/build-complete", complete(fj, "", poison)},
			} {
				code, body := e.post(t, r.path, tok, r.body, nil)
				if code != http.StatusBadRequest || !strings.Contains(body, forgedPath) || !strings.Contains(body, c.want) {
					t.Fatalf("%s of the forged job: %d %s, want 400 naming %s and %q", r.path, code, body, forgedPath, c.want)
				}
			}
			e.unchanged(t, before, "the forged job's uploads")
			if _, ok := e.narInfo(t, victim.Out("out")); ok {
				t.Fatalf("%s is served", victim.Out("out"))
			}

			// The victim's own build is signed.
			vj := e.enqueueAndClaim(t, "builder-2", victim)
			vtok := e.builder(t, "builder-2")
			genuine := built(t, victim.Out("out"), "echo victim")
			e.upload(t, vtok, signerapi.UploadSlotsRequest{Job: jobClaim(vj)}, nil, genuine)
			e.mustPost(t, "/api/build-complete", vtok, complete(vj, "", genuine), nil)
			e.checkNarInfo(t, genuine, nil, drvBase("victim"), "")
			var forgedHash *string
			if err := e.pool.QueryRow(ctx(t), `SELECT nar_hash FROM derivation_outputs WHERE drv_path = $1`, forgedPath).Scan(&forgedHash); err != nil {
				t.Fatal(err)
			}
			if forgedHash != nil {
				t.Fatalf("the forged derivation's output row got the victim's build's hash %s", *forgedHash)
			}
		})
	}
}
