package e2ebench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/bench"
)

// nixEnv is the environment of the benchmark's own Nix commands: a fresh HOME (no narinfo disk
// cache, no user configuration).
func (b *e2e) nixEnv() ([]string, func(), error) {
	home, err := os.MkdirTemp(b.dir, "home-")
	if err != nil {
		return nil, nil, err
	}
	return append(os.Environ(), "HOME="+home), func() { os.RemoveAll(home) }, nil
}

// instantiate writes expr and instantiates it (attrs, or all of it) into the chroot store at
// root; it returns the .drv paths in the order of attrs.
func (b *e2e) instantiate(ctx context.Context, root, expr string, attrs []string) ([]string, error) {
	file := root + ".nix"
	if err := os.WriteFile(file, []byte(expr), 0o644); err != nil {
		return nil, err
	}
	args := []string{"--store", root, file, "--option", "substituters", "", "--option", "build-users-group", ""}
	for _, a := range attrs {
		args = append(args, "-A", a)
	}
	env, done, err := b.nixEnv()
	if err != nil {
		return nil, err
	}
	defer done()
	cmd := exec.CommandContext(ctx, "nix-instantiate", args...)
	cmd.Env = env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("nix-instantiate: %w: %s", err, stderr.String())
	}
	return strings.Fields(string(out)), nil
}

// realise times plain nix-store --realise of drvs in the chroot store at root, sandboxed as the
// builders' builds are.
func (b *e2e) realise(ctx context.Context, root string, drvs []string, jobs int, sandbox []string) (time.Duration, error) {
	args := append([]string{"--store", root, "--realise"}, drvs...)
	args = append(args, "--max-jobs", strconv.Itoa(jobs),
		"--option", "sandbox", "true", "--option", "sandbox-paths", strings.Join(sandbox, " "),
		"--option", "build-users-group", "", "--option", "substituters", "")
	env, done, err := b.nixEnv()
	if err != nil {
		return 0, err
	}
	defer done()
	cmd := exec.CommandContext(ctx, b.nixBin, args...)
	cmd.Env = env
	cmd.Stdout = io.Discard
	tail := &tailBuffer{}
	cmd.Stderr = tail
	start := time.Now()
	err = cmd.Run()
	d := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("nix-store --realise: %w: %s", err, tail.String())
	}
	return d, nil
}

// tailBuffer keeps what Nix printed for an error message: the first error it reported (the
// build that failed first, with its log lines), else the last 4 KiB. Newer Nix ends a failed
// realise with one line naming every derivation it did not build, hundreds of them here.
type tailBuffer struct{ head, b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	if room := 8<<10 - len(t.head); room > 0 {
		t.head = append(t.head, p[:min(room, len(p))]...)
	}
	t.b = append(t.b, p...)
	if len(t.b) > 8<<10 {
		t.b = append(t.b[:0], t.b[len(t.b)-4<<10:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	lines := strings.Split(string(t.head), "\n")
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "error:") {
			block := lines[i:min(i+12, len(lines))]
			for j, b := range block {
				if len(b) > 300 {
					block[j] = b[:300] + "…"
				}
			}
			return strings.Join(block, "\n")
		}
	}
	return string(t.b)
}

// plainSingle times one nix-store --realise per derivation in a fresh store, o.Samples of the
// second layer once the first is built, so that each builds exactly one derivation with two
// inputs, as a builder's job does: the Nix build itself.
func (b *e2e) plainSingle(ctx context.Context, name, salt string) ([]float64, error) {
	w := b.o.Width
	first, samples := 0, min(b.o.Samples, w)
	if b.o.Derivations >= 2*w {
		first = w
	}
	var attrs []string
	for i := range first + samples {
		attrs = append(attrs, "d"+strconv.Itoa(i))
	}
	store := filepath.Join(b.dir, "single-"+salt)
	drvs, err := b.instantiate(ctx, store, b.expr(name, salt), attrs)
	if err != nil {
		return nil, err
	}
	if first > 0 {
		if _, err := b.realise(ctx, store, drvs[:first], b.o.Builders*b.o.Slots, b.sandboxPaths(name)); err != nil {
			return nil, err
		}
	}
	var out []float64
	for _, drv := range drvs[first:] {
		d, err := b.realise(ctx, store, []string{drv}, 1, b.sandboxPaths(name))
		if err != nil {
			return nil, err
		}
		out = append(out, bench.Ms(d))
	}
	return out, nil
}
