package eval

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// claimant is a derivation that claims an output path, and its derivation hash.
type claimant struct {
	drv string
	sum [32]byte
}

// checkSharedOutputs refuses new derivations (fresh) that claim an output path another
// derivation claims, in this evaluation or in the database, unless the two have the same
// derivation hash (Nix's hashDerivationModulo). Nix gives two derivations one output path only
// then (fixed-output derivations of one hash, and those that differ only in such inputs), and
// treats them as one: either's build is the other's. Anything else means a derivation whose
// outputs are not its own, and the path must not count as built for both. A claimant in the
// database counts with the hash the signer recorded when it stored its .drv; one whose .drv the
// cache never got has no build the signer would sign, and is passed over.
func (in *ingester) checkSharedOutputs(ctx context.Context, fresh map[string]*nix.Derivation) error {
	var paths []string
	for _, p := range slices.Sorted(maps.Keys(fresh)) {
		// Verified by now (verify), but for the inputs of fixed-output derivations, whose
		// hash does not depend on them: verified here.
		h, err := in.drvHash(p)
		if err != nil {
			return fmt.Errorf("derivation %s refused: %w", p, err)
		}
		for _, o := range fresh[p].OutputNames() {
			out := fresh[p].Outputs[o].Path
			if out == "" {
				continue
			}
			if err := in.claim(out, claimant{drv: p, sum: h.Sum}); err != nil {
				return err
			}
			paths = append(paths, out)
		}
	}
	if len(paths) == 0 {
		return nil
	}
	rows, err := in.pool.Query(ctx, sqlOutputClaimants, paths)
	if err != nil {
		return fmt.Errorf("look up the derivations claiming the outputs: %w", err)
	}
	type row struct {
		out, drv string
		sum      []byte
		stored   bool
	}
	var found []row
	var r row
	_, err = pgx.ForEachRow(rows, []any{&r.out, &r.drv, &r.sum, &r.stored}, func() error {
		found = append(found, r)
		return nil
	})
	if err != nil {
		return fmt.Errorf("look up the derivations claiming the outputs: %w", err)
	}
	var unhashed []string // stored before the signer recorded hashes
	for _, f := range found {
		if f.stored && len(f.sum) != 32 {
			unhashed = append(unhashed, f.drv)
		}
	}
	var computed map[string]nix.DrvHash
	if len(unhashed) > 0 {
		computed, err = blob.NewDerivations(in.pool).Hashes(ctx, unhashed)
		if errors.Is(err, nix.ErrWrongOutputs) {
			return fmt.Errorf("a derivation the database has claims an output of this evaluation: %w", err)
		}
		if err != nil {
			return err
		}
	}
	for _, f := range found {
		c := claimant{drv: f.drv}
		switch {
		case !f.stored:
			continue
		case len(f.sum) == 32:
			c.sum = [32]byte(f.sum)
		default:
			h, ok := computed[f.drv]
			if !ok {
				continue
			}
			c.sum = h.Sum
		}
		if err := in.claim(f.out, c); err != nil {
			return err
		}
	}
	return nil
}

// claim records that c claims output path out in this evaluation, and fails unless every other
// claimant has c's derivation hash.
func (in *ingester) claim(out string, c claimant) error {
	if in.claims == nil {
		in.claims = map[string]claimant{}
	}
	other, ok := in.claims[out]
	if !ok {
		in.claims[out] = c
		return nil
	}
	if other.drv != c.drv && other.sum != c.sum {
		return fmt.Errorf("derivations %s (hash %s) and %s (hash %s) both claim output path %s: Nix gives two derivations one output path only when their derivation hashes are equal, so one of them does not build what it claims",
			other.drv, hex.EncodeToString(other.sum[:]), c.drv, hex.EncodeToString(c.sum[:]), out)
	}
	return nil
}
