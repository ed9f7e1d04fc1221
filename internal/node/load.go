package node

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
	"sync"
)

// loadSampler turns /proc/stat and /proc/meminfo into the load figures of a heartbeat.
// CPU is the busy fraction since the previous sample; on systems without /proc it reports 0.
type loadSampler struct {
	mu              sync.Mutex
	lastIdle, lastT uint64
}

func (s *loadSampler) cpu() float32 {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := bytes.Cut(data, []byte("\n"))
	fields := strings.Fields(string(line))
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0
	}
	var total, idle uint64
	for i, f := range fields[1:] {
		v, _ := strconv.ParseUint(f, 10, 64)
		total += v
		if i == 3 || i == 4 { // idle, iowait
			idle += v
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	dt, di := total-s.lastT, idle-s.lastIdle
	first := s.lastT == 0
	s.lastT, s.lastIdle = total, idle
	if first || dt == 0 {
		return 0
	}
	return float32(dt-di) / float32(dt)
}

func memory() float32 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	var total, avail float64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		v, _ := strconv.ParseFloat(fields[1], 64)
		switch fields[0] {
		case "MemTotal:":
			total = v
		case "MemAvailable:":
			avail = v
		}
	}
	if total == 0 {
		return 0
	}
	return float32(1 - avail/total)
}
