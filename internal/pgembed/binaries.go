package pgembed

import (
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// errNoBinaries is what a machine without PostgreSQL gets: it names the package to install.
var errNoBinaries = errors.New(`embedded PostgreSQL needs the server binaries (initdb, pg_ctl, postgres): install the Debian package "postgresql" (apt-get install postgresql)`)

// Binaries are the absolute, symlink-resolved paths of the server programs.
type Binaries struct{ Initdb, PgCtl, Postgres string }

// FindBinaries locates initdb, pg_ctl and postgres: first through $PATH (all three must sit in
// the directory pg_ctl resolves to, since pg_ctl runs the postgres next to it), else in the
// highest-versioned /usr/lib/postgresql/*/bin (Debian does not put the server on $PATH).
func FindBinaries() (Binaries, error) {
	return findBinaries(os.Getenv("PATH"), "/usr/lib/postgresql/*/bin")
}

func findBinaries(path, globPattern string) (Binaries, error) {
	for _, dir := range filepath.SplitList(path) {
		if dir == "" || !filepath.IsAbs(dir) {
			// Relative $PATH entries depend on the working directory; never trust them.
			continue
		}
		pgCtl, err := filepath.EvalSymlinks(filepath.Join(dir, "pg_ctl"))
		if err != nil || !isExecutable(pgCtl) {
			continue
		}
		if b, ok := binariesIn(filepath.Dir(pgCtl)); ok {
			return b, nil
		}
	}
	dirs, _ := filepath.Glob(globPattern) // the only error is a malformed pattern
	// Highest version first: the version is the directory above bin ("15", "9.6").
	sort.SliceStable(dirs, func(i, j int) bool {
		return versionLess(filepath.Base(filepath.Dir(dirs[j])), filepath.Base(filepath.Dir(dirs[i])))
	})
	for _, dir := range dirs {
		real, err := filepath.EvalSymlinks(dir)
		if err != nil {
			continue
		}
		if b, ok := binariesIn(real); ok {
			return b, nil
		}
	}
	return Binaries{}, errNoBinaries
}

func binariesIn(dir string) (Binaries, bool) {
	b := Binaries{
		Initdb:   filepath.Join(dir, "initdb"),
		PgCtl:    filepath.Join(dir, "pg_ctl"),
		Postgres: filepath.Join(dir, "postgres"),
	}
	for _, p := range []string{b.Initdb, b.PgCtl, b.Postgres} {
		if !isExecutable(p) {
			return Binaries{}, false
		}
	}
	return b, true
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// versionLess compares dotted numeric versions; anything non-numeric sorts lowest.
func versionLess(a, b string) bool {
	pa, pb := parseVersion(a), parseVersion(b)
	for i := 0; i < len(pa) && i < len(pb); i++ {
		if pa[i] != pb[i] {
			return pa[i] < pb[i]
		}
	}
	return len(pa) < len(pb)
}

func parseVersion(s string) []int {
	var v []int
	for _, part := range strings.Split(s, ".") {
		n, err := strconv.Atoi(part)
		if err != nil {
			return nil
		}
		v = append(v, n)
	}
	return v
}
