package e2ebench

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// daemonCPU is the CPU time of the live Nix daemons serving the chroot stores: their own, and
// their reaped children's (the builds), seconds. A daemon replaced during the run is missed.
func daemonCPU(stores []string) (own, children float64) {
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range cmdlines {
		b, err := os.ReadFile(f)
		if err != nil || !bytes.HasPrefix(b, []byte("nix-daemon\x00")) ||
			!slices.ContainsFunc(stores, func(s string) bool { return bytes.Contains(b, []byte("\x00"+s+"\x00")) }) {
			continue
		}
		st, err := os.ReadFile(filepath.Join(filepath.Dir(f), "stat"))
		if err != nil {
			continue
		}
		// "pid (comm) state …": fields 14-17, counted from 1, are utime stime cutime cstime.
		fields := strings.Fields(string(st[bytes.LastIndexByte(st, ')')+1:]))
		if len(fields) < 15 {
			continue
		}
		tick := func(i int) float64 { v, _ := strconv.ParseFloat(fields[i-3], 64); return v / 100 } // USER_HZ
		own += tick(14) + tick(15)
		children += tick(16) + tick(17)
	}
	return own, children
}
