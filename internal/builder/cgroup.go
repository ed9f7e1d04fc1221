package builder

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Builds' CPU weight in their cgroup, against the default of the node's own processes: about
// a tenth (cgroup v2 cpu.weight 10 of 100; v1 cpu.shares 102 of 1024).
const (
	cgroupWeightV2 = "10"
	cgroupSharesV1 = "102"
)

// PrepareCgroup makes dir, a directory in a cgroup hierarchy with the cpu controller (v2, or v1's
// cpu), the cgroup of the builder's Nix daemons and their builds, with a low CPU weight. Nix
// starts every build in a session of its own, which a kernel that schedules by autogroup
// weighs like the whole node; a cgroup holds the builds together, whatever their session.
func PrepareCgroup(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("build cgroup %s: not an absolute path", dir)
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("build cgroup %s: %w", dir, err)
	}
	for _, w := range []struct{ file, value string }{{"cpu.weight", cgroupWeightV2}, {"cpu.shares", cgroupSharesV1}} {
		p := filepath.Join(dir, w.file)
		if _, err := os.Stat(p); err != nil {
			continue
		}
		if err := os.WriteFile(p, []byte(w.value), 0); err != nil {
			return fmt.Errorf("build cgroup %s: set %s: %w", dir, w.file, err)
		}
		return nil
	}
	return fmt.Errorf("build cgroup %s: no cpu.weight or cpu.shares: not a cgroup with the cpu controller", dir)
}

// WritableCPUCgroup returns a directory under which this process may make cgroups with the cpu
// controller (v1's cpu hierarchy, or v2's root with cpu enabled below it), or "" if there is
// none (not root, no such hierarchy). For tests and benchmarks; a node is given its cgroup.
func WritableCPUCgroup() string {
	for _, dir := range []string{"/sys/fs/cgroup/cpu", "/sys/fs/cgroup"} {
		probe, err := os.MkdirTemp(dir, "harmonia-probe-")
		if err != nil {
			continue
		}
		_, errV1 := os.Stat(filepath.Join(probe, "cpu.shares"))
		_, errV2 := os.Stat(filepath.Join(probe, "cpu.weight"))
		os.Remove(probe)
		if errV1 == nil || errV2 == nil {
			return dir
		}
	}
	return ""
}
