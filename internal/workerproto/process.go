package workerproto

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// childProcessGroups returns the process groups of pid's children other than pid's own: the
// builds of a `nix-daemon --stdio` child, which Nix starts in sessions of their own.
func childProcessGroups(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var groups []int
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// "pid (comm) state ppid pgrp …", and comm may contain anything, even ") ".
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 3 {
			continue
		}
		ppid, err1 := strconv.Atoi(f[1])
		pgrp, err2 := strconv.Atoi(f[2])
		if err1 == nil && err2 == nil && ppid == pid && pgrp != pid && pgrp > 0 {
			groups = append(groups, pgrp)
		}
	}
	return groups
}
