package proctest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Installed returns the path of a program scripts/deps.sh builds with the Go toolchain (MinIO,
// Gitea): in GOBIN, or GOPATH's bin directories, or on PATH. The error names where it looked
// and how to install it.
func Installed(name string) (string, error) {
	var dirs []string
	if out, err := exec.Command("go", "env", "GOBIN", "GOPATH").Output(); err == nil {
		lines := strings.Split(string(out), "\n") // GOBIN's line may be empty
		if len(lines) > 0 && strings.TrimSpace(lines[0]) != "" {
			dirs = append(dirs, strings.TrimSpace(lines[0]))
		}
		if len(lines) > 1 {
			for _, gp := range filepath.SplitList(strings.TrimSpace(lines[1])) {
				dirs = append(dirs, filepath.Join(gp, "bin"))
			}
		}
	}
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("no %s binary in %v or on PATH; install it with `scripts/deps.sh test`", name, dirs)
}
