package eval

import (
	"bytes"
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// memoryWatch watches the memory of one walk's workers: each worker's process tree (bwrap, whose
// process group holds the view, and its descendants, the Nix inside the view among them) against
// perWorker, and all of them with the evaluation's own nix-daemon (with its workers and the
// builds it runs for imports from derivation) against total. A worker past perWorker is killed
// alone and reported to its walker, which restarts it; past total the whole walk is killed and
// cancelled with overTotal. One goroutine reads /proc for every worker.
type memoryWatch struct {
	perWorker, total int64
	daemonPid        func() int // nil or 0: no daemon to count
	overTotal        error      // the cause the walk is cancelled with past total
	cancel           context.CancelCauseFunc

	mu      sync.Mutex
	workers map[int]*watchedWorker // by bwrap's pid (its process group)
	over    bool
	stop    chan struct{}
	done    chan struct{}
}

type watchedWorker struct {
	tree   []int
	killed bool
}

// newMemoryWatch starts watching; stop ends it. With neither limit it watches nothing.
func newMemoryWatch(perWorker, total int64, daemonPid func() int, overTotal error, cancel context.CancelCauseFunc) *memoryWatch {
	m := &memoryWatch{perWorker: perWorker, total: total, daemonPid: daemonPid, overTotal: overTotal, cancel: cancel,
		workers: map[int]*watchedWorker{}, stop: make(chan struct{}), done: make(chan struct{})}
	if perWorker <= 0 && total <= 0 {
		close(m.done)
		return m
	}
	go m.loop()
	return m
}

// add watches the worker whose bwrap is pgid; the returned func stops watching it and reports
// whether it was killed for going past perWorker.
func (m *memoryWatch) add(pgid int) func() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	w := &watchedWorker{tree: []int{pgid}}
	m.workers[pgid] = w
	return func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		delete(m.workers, pgid)
		return w.killed
	}
}

// exceeded reports whether the walk was killed for going past total.
func (m *memoryWatch) exceeded() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.over
}

func (m *memoryWatch) close() {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	<-m.done
}

func (m *memoryWatch) loop() {
	defer close(m.done)
	t := time.NewTicker(memoryCheck)
	defer t.Stop()
	var daemonTree []int
	for i := 0; ; i++ {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		// Finding the descendants reads all of /proc; the trees are refreshed every treeRefresh
		// checks, and in between only their members are read.
		if i%treeRefresh == 0 {
			daemonTree = m.refresh()
		}
		if m.check(daemonTree) {
			return
		}
	}
}

// refresh finds every worker's process tree again, and returns the daemon's.
func (m *memoryWatch) refresh() []int {
	children := processChildren()
	m.mu.Lock()
	for pgid, w := range m.workers {
		w.tree = below(children, []int{pgid})
	}
	m.mu.Unlock()
	if m.daemonPid != nil {
		if d := m.daemonPid(); d > 0 {
			return below(children, []int{d})
		}
	}
	return nil
}

// check kills what is over its limit; true once the whole walk was.
func (m *memoryWatch) check(daemonTree []int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	total := treeRSS(daemonTree)
	for pgid, w := range m.workers {
		used := treeRSS(w.tree)
		total += used
		if m.perWorker > 0 && used > m.perWorker && !w.killed {
			w.killed = true
			killTree(pgid, w.tree)
		}
	}
	if m.total <= 0 || total <= m.total {
		return false
	}
	m.over = true
	for pgid, w := range m.workers {
		killTree(pgid, w.tree)
	}
	for _, p := range below(processChildren(), daemonTree) {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	m.cancel(m.overTotal)
	return true
}

func killTree(pgid int, tree []int) {
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	for _, p := range below(processChildren(), tree) {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
}

func treeRSS(tree []int) int64 {
	var n int64
	for _, p := range tree {
		n += rss(p)
	}
	return n
}

// memoryCheck is how often a child's memory is read: often enough that an evaluation allocating
// gigabytes a second overshoots by little. Its process tree is found again every treeRefresh
// checks: a build started in between is counted from the next refresh on.
const (
	memoryCheck = 100 * time.Millisecond
	treeRefresh = 3
)

// rss is the resident memory of process pid in bytes, 0 if it cannot be read.
func rss(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

// processChildren maps every process to its children, from the parent ids in /proc.
func processChildren() map[int][]int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid := parent(pid); ppid > 0 {
			children[ppid] = append(children[ppid], pid)
		}
	}
	return children
}

// below is roots and every process below them in children.
func below(children map[int][]int, roots []int) []int {
	seen := map[int]bool{}
	out := []int{}
	for queue := slices.Clone(roots); len(queue) > 0; queue = queue[1:] {
		p := queue[0]
		if seen[p] {
			continue
		}
		seen[p] = true
		out = append(out, p)
		queue = append(queue, children[p]...)
	}
	return out
}

// parent is the parent process id of pid, 0 if it cannot be read. /proc/<pid>/stat is "pid
// (comm) state ppid …", and comm may hold spaces and parentheses.
func parent(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}
