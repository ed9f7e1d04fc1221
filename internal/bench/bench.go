// Package bench is the harness of harmonia-ci's benchmarks (`harmonia-ci bench ...`): the private
// PostgreSQL, in-process nodes that say when they are ready, waiting, and the statistics and
// report header every benchmark shares. Each benchmark is a subpackage (queuebench, e2ebench,
// evalbench, webhookbench, gcbench, cachebench); only they and the CLI import this package.
package bench

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
)

// Machine describes this machine for a report's header: OS, architecture and CPUs.
func Machine() string {
	return fmt.Sprintf("%s/%s, %d CPUs", runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
}

// Logger is l, or a logger that discards when a benchmark was given none.
func Logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return l
}

// ToolVersion is the first line `name arg` prints that is not a warning, "unknown" if none.
func ToolVersion(name string, arg string) string {
	out, _ := exec.Command(name, arg).CombinedOutput()
	for l := range strings.Lines(string(out)) {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "warning:") {
			return l
		}
	}
	return "unknown"
}

// RandomHex is n random bytes in hex: salts, secrets and tokens of a run.
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// LoadAverage is the one-minute load average, 0 if unknown.
func LoadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f, _, _ := strings.Cut(string(b), " ")
	v, _ := strconv.ParseFloat(f, 64)
	return v
}

// NixBase32 is Nix's base-32 alphabet, for made-up store path hashes.
const NixBase32 = "0123456789abcdfghijklmnpqrsvwxyz"

// NeedTool fails with hint when name is not on PATH.
func NeedTool(name, hint string) error {
	if _, err := exec.LookPath(name); err != nil {
		return fmt.Errorf("%s not found (%s)", name, hint)
	}
	return nil
}
