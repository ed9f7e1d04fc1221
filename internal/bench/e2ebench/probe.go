package e2ebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/bench"
	"github.com/harmonia-ci/harmonia-ci/internal/builder"
)

// probe replays o.Samples of the round's jobs on one builder.Session, one at a time in a fresh chroot
// store fetching from the cluster's cache, to time each step without contention.
func (b *e2e) probe(ctx context.Context, name string, rows []jobRow) ([]ProbeStep, error) {
	// Jobs with inputs (to substitute from the cache), spread over the DAG, in dependency order
	// (dN depends on lower N only), so that no job's .drv came with an earlier one's closure.
	rows = slices.Clone(rows)
	slices.SortFunc(rows, func(x, y jobRow) int { return drvIndex(x.drv) - drvIndex(y.drv) })
	var withInputs []jobRow
	for _, j := range rows {
		var n int
		if err := b.pool.QueryRow(ctx, sqlInputCount, j.drv).Scan(&n); err != nil {
			return nil, err
		}
		if n > 0 {
			withInputs = append(withInputs, j)
		}
	}
	var sample []jobRow
	step := max(1, len(withInputs)/b.o.Samples)
	for i := 0; i < len(withInputs) && len(sample) < b.o.Samples; i += step {
		sample = append(sample, withInputs[i])
	}
	var caches, keys []string
	if err := b.pool.QueryRow(ctx, sqlCacheEndpoints).Scan(&caches, &keys); err != nil {
		return nil, err
	}
	if len(caches) == 0 {
		return nil, errors.New("no active cache node")
	}
	st := builder.Store{Root: filepath.Join(b.dir, "probe-store"), Substituters: caches, TrustedKeys: keys}
	if name == E2ESleep {
		st.SandboxPaths = []string{"/bin/sleep"}
	}
	steps := map[string][]float64{}
	order := []string{"open a daemon session (once per slot, not per job)", "derivation over HTTP (Derivation)",
		"inputs' closure over HTTP + AddToStoreNar (EnsureInputs)", "BuildDerivation (Build)",
		"path infos (OutputInfos)", "NarFromPath of the outputs (DumpNAR)", "no-op nix-store process (for scale)"}
	t := time.Now()
	ss, err := st.Open(ctx)
	if err != nil {
		return nil, err
	}
	defer ss.Close()
	steps[order[0]] = append(steps[order[0]], bench.Ms(time.Since(t)))
	for _, j := range sample {
		t := time.Now()
		drv, err := ss.Derivation(ctx, j.drv)
		if err != nil {
			return nil, err
		}
		steps[order[1]] = append(steps[order[1]], bench.Ms(time.Since(t)))
		inputs, err := ss.InputPaths(ctx, j.drv, drv, nil)
		if err != nil {
			return nil, err
		}
		t = time.Now()
		if _, err := ss.EnsureInputs(ctx, inputs, nil, nil); err != nil {
			return nil, err
		}
		steps[order[2]] = append(steps[order[2]], bench.Ms(time.Since(t)))
		t = time.Now()
		outs, err := ss.Build(ctx, j.drv, drv, inputs, builder.BuildLimits{}, io.Discard)
		if err != nil {
			return nil, err
		}
		steps[order[3]] = append(steps[order[3]], bench.Ms(time.Since(t)))
		paths := slices.Sorted(maps.Values(outs))
		t = time.Now()
		if _, err := ss.OutputInfos(ctx, paths); err != nil {
			return nil, err
		}
		steps[order[4]] = append(steps[order[4]], bench.Ms(time.Since(t)))
		t = time.Now()
		for _, p := range paths {
			if err := ss.DumpNAR(ctx, p, io.Discard); err != nil {
				return nil, err
			}
		}
		steps[order[5]] = append(steps[order[5]], bench.Ms(time.Since(t)))
		// What the builder no longer pays per job: the cheapest Nix process on this store,
		// realising a valid path (nothing to do).
		env, done, err := b.nixEnv()
		if err != nil {
			return nil, err
		}
		cmd := exec.CommandContext(ctx, b.nixBin, "--store", st.Root, "--realise", paths[0],
			"--option", "substituters", "", "--option", "build-users-group", "")
		cmd.Env = env
		t = time.Now()
		err = cmd.Run()
		done()
		if err != nil {
			return nil, fmt.Errorf("nix-store --realise: %w", err)
		}
		steps[order[6]] = append(steps[order[6]], bench.Ms(time.Since(t)))
	}
	var out []ProbeStep
	for _, s := range order {
		out = append(out, ProbeStep{Step: s, Stat: bench.Summarize(steps[s])})
	}
	return out, nil
}

// drvIndex is N of a generated derivation dN's .drv path.
func drvIndex(drv string) int {
	name := strings.TrimSuffix(drv[strings.LastIndexByte(drv, '-')+1:], ".drv")
	n, _ := strconv.Atoi(strings.TrimPrefix(name, "d"))
	return n
}
