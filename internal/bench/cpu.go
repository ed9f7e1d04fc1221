package bench

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// BusyCPU is the machine's busy CPU time so far, seconds (/proc/stat; 0 where there is none).
func BusyCPU() float64 {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	if len(fields) < 8 || fields[0] != "cpu" {
		return 0
	}
	var busy float64
	for i, f := range fields[1:] {
		v, _ := strconv.ParseFloat(f, 64)
		if i != 3 && i != 4 && i < 8 { // user nice system [idle iowait] irq softirq steal
			busy += v
		}
	}
	return busy / 100 // USER_HZ
}

// ProcessCPU is the CPU time of this process and of its reaped descendants, seconds.
func ProcessCPU() (self, children float64) {
	sec := func(ru syscall.Rusage) float64 {
		return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		self = sec(ru)
	}
	if syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru) == nil {
		children = sec(ru)
	}
	return self, children
}

// PostgresCPU is the CPU time so far, seconds, of the PostgreSQL whose data directory is
// dataDir: the postmaster with its reaped children, and its live children (backends,
// background workers).
func PostgresCPU(dataDir string) float64 {
	data, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(data), "\n")
	pm, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return 0
	}
	entries, _ := os.ReadDir("/proc")
	var ticks float64
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:])) // f[0] is field 3 (state)
		if len(f) < 15 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		n := 2 // utime, stime
		if pid == pm {
			n = 4 // and cutime, cstime: its exited children
		} else if ppid != pm {
			continue
		}
		for _, v := range f[11 : 11+n] {
			t, _ := strconv.ParseFloat(v, 64)
			ticks += t
		}
	}
	return ticks / 100 // USER_HZ
}
