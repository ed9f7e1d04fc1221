package queuetest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
)

// NixDrv is a fixture derivation as Nix writes it: its .drv text at its true store path, and
// its rows for the queue, whose output paths are the ones its text and its inputs give. The
// signer checks a job's outputs against the .drv it stored, so a job that reaches the signer
// must be one of these, its .drv stored (blobtest.PutDerivations), not a Drv.
type NixDrv struct {
	queue.Derivation
	Text []byte
	Hash nix.DrvHash // what a derivation using it hashes it as
}

// Out is the path of d's output name.
func (d NixDrv) Out(name string) string {
	for _, o := range d.Outputs {
		if o.Name == name {
			return o.Path
		}
	}
	panic(fmt.Sprintf("%s has no output %q", d.DrvPath, name))
}

// DrvSpec describes a NixDrv.
type DrvSpec struct {
	Name, System string
	Inputs       []NixDrv // input derivations; each one's outputs are all taken
	Srcs         []string // input sources
	Outputs      []string // default {"out"}
	// Script is the builder's shell script; default one that writes the name to $out. Two
	// specs that differ only here make derivations with different outputs.
	Script string
	// FixedNAR, if set, makes a fixed-output derivation whose output is the path a recursive
	// sha256 of this NAR hash gives (what `nix-store --add` of that tree gives): every such
	// derivation of one name and hash has that output, whatever its script.
	FixedNAR *[sha256.Size]byte
}

// MakeDrv makes the derivation s describes.
func MakeDrv(s DrvSpec) NixDrv {
	if s.System == "" {
		panic("queuetest.MakeDrv: no system")
	}
	if len(s.Outputs) == 0 {
		s.Outputs = []string{"out"}
	}
	if s.Script == "" {
		s.Script = "echo " + s.Name + " > $out"
	}
	d := &nix.Derivation{Outputs: map[string]nix.DerivationOutput{}, InputDrvs: map[string][]string{},
		InputSrcs: slices.Sorted(slices.Values(s.Srcs)), Platform: s.System, Builder: "/bin/sh",
		Args: []string{"-c", s.Script},
		Env:  map[string]string{"builder": "/bin/sh", "name": s.Name, "system": s.System}}
	if d.InputSrcs == nil {
		d.InputSrcs = []string{}
	}
	hashes := map[string]nix.DrvHash{}
	for _, in := range s.Inputs {
		d.InputDrvs[in.DrvPath] = slices.Clone(in.Hash.Outputs)
		hashes[in.DrvPath] = in.Hash
	}
	inputHash := func(p string) (nix.DrvHash, error) {
		h, ok := hashes[p]
		if !ok {
			return nix.DrvHash{}, fmt.Errorf("no input %s", p)
		}
		return h, nil
	}
	if s.FixedNAR != nil {
		if len(s.Outputs) != 1 || s.Outputs[0] != "out" {
			panic("queuetest.MakeDrv: a fixed-output derivation has the one output out")
		}
		h := hex.EncodeToString(s.FixedNAR[:])
		d.Outputs["out"] = nix.DerivationOutput{HashAlgo: "r:sha256", Hash: h}
		d.Env["outputHash"], d.Env["outputHashAlgo"], d.Env["outputHashMode"] = h, "sha256", "recursive"
	} else {
		for _, o := range s.Outputs {
			d.Outputs[o] = nix.DerivationOutput{}
		}
	}
	for _, o := range s.Outputs {
		d.Env[o] = ""
	}
	if len(s.Outputs) > 1 {
		d.Env["outputs"] = strings.Join(s.Outputs, " ")
	}
	paths, err := d.OutputPaths(s.Name, inputHash)
	if err != nil {
		panic(fmt.Sprintf("queuetest.MakeDrv %s: %v", s.Name, err))
	}
	for o, p := range paths {
		out := d.Outputs[o]
		out.Path = p
		d.Outputs[o] = out
		d.Env[o] = p
	}
	text := d.Unparse()
	drvPath, _, err := nix.DerivationPath(s.Name+".drv", text)
	if err != nil {
		panic(fmt.Sprintf("queuetest.MakeDrv %s: %v", s.Name, err))
	}
	h, err := d.Hash(drvPath, inputHash)
	if err != nil {
		panic(fmt.Sprintf("queuetest.MakeDrv %s: %v", s.Name, err))
	}
	nar := nix.FileNAR(text, false)
	q := queue.Derivation{DrvPath: drvPath, Name: s.Name, System: s.System, NarHash: nix.FormatSHA256(sha256.Sum256(nar)),
		NarSize: int64(len(nar)), InputSrcs: d.InputSrcs}
	for _, o := range d.OutputNames() {
		q.Outputs = append(q.Outputs, queue.Output{Name: o, Path: d.Outputs[o].Path})
	}
	for _, in := range slices.Sorted(maps.Keys(d.InputDrvs)) {
		q.Inputs = append(q.Inputs, queue.Input{DrvPath: in, Outputs: d.InputDrvs[in]})
	}
	return NixDrv{Derivation: q, Text: text, Hash: h}
}

// Real is MakeDrv of a derivation called name for system with the given inputs.
func Real(name, system string, inputs ...NixDrv) NixDrv {
	return MakeDrv(DrvSpec{Name: name, System: system, Inputs: inputs})
}

// JobOf reads the job of the derivation at drvPath.
func JobOf(t testing.TB, pool *pgxpool.Pool, drvPath string) JobRow {
	t.Helper()
	var j JobRow
	err := pool.QueryRow(context.Background(), `
SELECT id, drv_path, status, priority, project_id, claimed_by, attempt, retry_count, blocked_inputs
FROM build_jobs WHERE drv_path = $1`, drvPath).
		Scan(&j.ID, &j.DrvPath, &j.Status, &j.Priority, &j.ProjectID, &j.ClaimedBy, &j.Attempt, &j.RetryCount, &j.BlockedInputs)
	if err != nil {
		t.Fatalf("read job of %s: %v", drvPath, err)
	}
	return j
}
