package e2ebench

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/harmonia-ci/harmonia-ci/internal/bench"
)

// installTrace puts wrappers of nix and nix-store first on PATH that log each call's start, end
// and arguments to a file, and returns a func restoring PATH.
func (b *e2e) installTrace() (func(), error) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		return nil, fmt.Errorf("--trace-nix needs bash: %w", err)
	}
	shim := filepath.Join(b.dir, "nix-trace")
	if err := os.MkdirAll(shim, 0o755); err != nil {
		return nil, err
	}
	b.traceLn = filepath.Join(shim, "log")
	for _, tool := range []string{"nix", "nix-store"} {
		real, err := exec.LookPath(tool)
		if err != nil {
			return nil, err
		}
		// $EPOCHREALTIME needs no fork; the line is one write (O_APPEND).
		// Fields 16 and 17 of /proc/$$/stat are the CPU ticks of the shell's waited-for
		// children: the Nix process and everything it waited for.
		script := fmt.Sprintf(`#!%s
t0=$EPOCHREALTIME
%q "$@"
rc=$?
t1=$EPOCHREALTIME
a="$*"
read -r st < /proc/$$/stat
st=${st##*) }
set -- $st
printf '%%s %%s %%s %%s %%s %%s\n' "$t0" "$t1" "$rc" "$(( ${14} + ${15} ))" %q "${a:0:600}" >> %q
exit $rc
`, bash, real, tool, b.traceLn)
		if err := os.WriteFile(filepath.Join(shim, tool), []byte(script), 0o755); err != nil {
			return nil, err
		}
	}
	old := os.Getenv("PATH")
	if err := os.Setenv("PATH", shim+string(os.PathListSeparator)+old); err != nil {
		return nil, err
	}
	return func() { os.Setenv("PATH", old) }, nil
}

// readTrace summarises the traced Nix processes run on the builders' stores, then empties the
// log.
func (b *e2e) readTrace(stores []string, jobs int) []TraceStep {
	f, err := os.Open(b.traceLn)
	if err != nil {
		return nil
	}
	defer func() {
		f.Close()
		_ = os.Truncate(b.traceLn, 0)
	}()
	byKind := map[string][]float64{}
	cpuByKind := map[string][]float64{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.SplitN(sc.Text(), " ", 6)
		if len(fields) < 6 {
			continue
		}
		t0, err1 := strconv.ParseFloat(strings.ReplaceAll(fields[0], ",", "."), 64)
		t1, err2 := strconv.ParseFloat(strings.ReplaceAll(fields[1], ",", "."), 64)
		if err1 != nil || err2 != nil {
			continue
		}
		ticks, _ := strconv.ParseFloat(fields[3], 64)
		tool, args := fields[4], fields[5]
		if !slices.ContainsFunc(stores, func(s string) bool { return strings.Contains(args, "--store "+s+" ") }) {
			continue
		}
		var kind string
		switch {
		case tool == "nix" && strings.Contains(args, " copy "):
			kind = "nix copy --derivation (fetch the .drv closure)"
		case tool == "nix-store" && strings.Contains(args, "--realise") && strings.Contains(args, "--option sandbox true"):
			kind = "nix-store --realise (the build)"
		case tool == "nix-store" && strings.Contains(args, "--realise"):
			kind = "nix-store --realise (substitute inputs)"
		default:
			first, _, _ := strings.Cut(args, " ")
			kind = tool + " " + first
		}
		byKind[kind] = append(byKind[kind], (t1-t0)*1000)
		cpuByKind[kind] = append(cpuByKind[kind], ticks*10) // USER_HZ 100
	}
	var out []TraceStep
	var all, allCPU []float64
	sum := func(xs []float64) float64 {
		var s float64
		for _, v := range xs {
			s += v
		}
		return s
	}
	perJob := func(kind string, d, cpu []float64) TraceStep {
		n := float64(max(1, jobs))
		return TraceStep{Kind: kind, Count: len(d), PerJob: float64(len(d)) / n, Stat: bench.Summarize(d), MsPerJob: sum(d) / n,
			CPUMs: sum(cpu) / float64(max(1, len(cpu))), CPUMsPerJob: sum(cpu) / n}
	}
	for kind, d := range byKind {
		out = append(out, perJob(kind, d, cpuByKind[kind]))
		all = append(all, d...)
		allCPU = append(allCPU, cpuByKind[kind]...)
	}
	slices.SortFunc(out, func(a, b TraceStep) int { return strings.Compare(a.Kind, b.Kind) })
	return append(out, perJob("all", all, allCPU))
}
