package signer

import (
	"bytes"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/signerapi"
)

// quarantineRow is what the database records of a derivation's output.
type quarantineRow struct {
	narHash     string
	quarantined bool
	nonrepro    *string
}

func (e *env) quarantineRow(t *testing.T, label string) quarantineRow {
	t.Helper()
	var r quarantineRow
	if err := e.pool.QueryRow(ctx(t), `SELECT COALESCE(nar_hash, ''), quarantined, nonrepro_nar_hash FROM derivation_outputs WHERE drv_path = $1`,
		drvPath(label)).Scan(&r.narHash, &r.quarantined, &r.nonrepro); err != nil {
		t.Fatal(err)
	}
	return r
}

// An untrusted job's outputs are recorded quarantined. A trusted rebuild (a branch needed them
// and its project does not promote them) that reproduces the NAR releases them as they are; one
// that does not replaces the narinfo (the one case a narinfo is rewritten) and records the
// pull request's NAR hash as non-reproducible.
func TestQuarantinedOutputsRebuilt(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	tok := e.builder(t, "builder-1")
	for _, c := range []struct {
		label        string
		reproducible bool
	}{{"quarantine-same", true}, {"quarantine-differs", false}} {
		d := fixture(c.label, nil)
		e.enqueue(t, d)
		queuetest.Exec(t, e.pool, `UPDATE build_jobs SET trusted = false WHERE drv_path = $1`, d.DrvPath)
		j := e.claimPath(t, "builder-1", d.DrvPath)
		prBuild := built(t, d.Out("out"), "the pull request's build")
		e.upload(t, tok, signerapi.UploadSlotsRequest{Job: jobClaim(j)}, nil, prBuild)
		var r signerapi.BuildCompleteResponse
		e.mustPost(t, "/api/build-complete", tok, complete(j, "", prBuild), &r)
		if row := e.quarantineRow(t, c.label); !row.quarantined || row.narHash != prBuild.out.NarHash {
			t.Fatalf("%s: after the untrusted build: %+v, want quarantined with its hash", c.label, row)
		}
		// The narinfo itself says so: no cache node serves it to everyone, whatever it learnt
		// of the path before.
		if text, _ := e.read(t, hashPart(t, d.Out("out"))+".narinfo"); !nix.NarInfoQuarantined(text) {
			t.Fatalf("%s: the untrusted build's narinfo is not marked quarantined:\n%s", c.label, text)
		}

		// The branch's evaluation resets the job, trusted.
		queuetest.Exec(t, e.pool, `UPDATE build_jobs SET status = 'pending', trusted = true, claimed_by = NULL, claimed_at = NULL,
			started_at = NULL, finished_at = NULL WHERE drv_path = $1`, d.DrvPath)
		j = e.claimPath(t, "builder-1", d.DrvPath)
		trusted := prBuild
		if !c.reproducible {
			trusted = built(t, d.Out("out"), "the trusted build, which differs")
		}
		e.upload(t, tok, signerapi.UploadSlotsRequest{Job: jobClaim(j)}, nil, trusted)
		e.mustPost(t, "/api/build-complete", tok, complete(j, "", trusted), &r)
		row := e.quarantineRow(t, c.label)
		if row.quarantined || row.narHash != trusted.out.NarHash {
			t.Errorf("%s: after the trusted build: %+v, want released with the trusted hash %s", c.label, row, trusted.out.NarHash)
		}
		switch {
		case c.reproducible && (r != signerapi.BuildCompleteResponse{Skipped: 1} || row.nonrepro != nil):
			t.Errorf("%s: reproduced: answered %+v, non-reproducible %v; want skipped, none", c.label, r, row.nonrepro)
		case !c.reproducible && (r != signerapi.BuildCompleteResponse{Written: 1} || row.nonrepro == nil || *row.nonrepro != prBuild.out.NarHash):
			t.Errorf("%s: not reproduced: answered %+v, non-reproducible %v; want written, the pull request's hash", c.label, r, row.nonrepro)
		}
		e.checkNarInfo(t, trusted, nil, drvBase(c.label), "")
		// A rewritten narinfo is the trusted build's, unmarked; one reproduced keeps its mark,
		// the database releasing the path.
		if text, _ := e.read(t, hashPart(t, d.Out("out"))+".narinfo"); nix.NarInfoQuarantined(text) != c.reproducible {
			t.Errorf("%s: narinfo marked quarantined %v after the trusted build, want %v", c.label, nix.NarInfoQuarantined(text), c.reproducible)
		}
	}
	if got := counters(t, e.reg)[`harmonia_ci_signer_narinfos_total{result="rewritten"}`]; got != 1 {
		t.Errorf("narinfos rewritten: %v, want 1", got)
	}
}

// A trusted job's build of a path a trusted job built before is never rewritten, even when
// an untrusted one built it in between (the path is not quarantined: a trusted row has it).
func TestTrustedNarinfoNotRewritten(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	tok := e.builder(t, "builder-1")
	d := fixture("quarantine-trusted-first", nil)
	e.enqueue(t, d)
	j := e.claimPath(t, "builder-1", d.DrvPath)
	first := built(t, d.Out("out"), "the trusted build")
	e.upload(t, tok, signerapi.UploadSlotsRequest{Job: jobClaim(j)}, nil, first)
	e.mustPost(t, "/api/build-complete", tok, complete(j, "", first), nil)
	narinfo, _ := e.read(t, hashPart(t, d.Out("out"))+".narinfo")

	queuetest.Exec(t, e.pool, `UPDATE build_jobs SET status = 'pending', claimed_by = NULL, claimed_at = NULL,
		started_at = NULL, finished_at = NULL WHERE drv_path = $1`, d.DrvPath)
	j = e.claimPath(t, "builder-1", d.DrvPath)
	second := built(t, d.Out("out"), "another trusted build")
	e.upload(t, tok, signerapi.UploadSlotsRequest{Job: jobClaim(j)}, nil, second)
	var r signerapi.BuildCompleteResponse
	e.mustPost(t, "/api/build-complete", tok, complete(j, "", second), &r)
	if r != (signerapi.BuildCompleteResponse{Conflicts: 1}) {
		t.Errorf("a second trusted build: %+v, want a conflict", r)
	}
	if now, _ := e.read(t, hashPart(t, d.Out("out"))+".narinfo"); !bytes.Equal(now, narinfo) {
		t.Errorf("narinfo rewritten:\n%s\nwas:\n%s", now, narinfo)
	}
	if row := e.quarantineRow(t, "quarantine-trusted-first"); row.quarantined || row.narHash != first.out.NarHash || row.nonrepro != nil {
		t.Errorf("row %+v, want the first build's, not quarantined", row)
	}
}
