package eval

import (
	"encoding/json"
	"fmt"
	"net/url"
	"path"
	"slices"
	"strings"
)

// checkFlakeInputs refuses a flake whose lock file has an input that resolves to a path on the
// node outside the flake's own tree: a path input with an absolute path or one leaving the
// tree through "..", or any input fetched from a file: URL (git, tarball, file, mercurial).
// Nix fetches such inputs without restricted mode's checks; the evaluation's filesystem view
// would leave them nothing to read, but the project is told why instead of failing on a
// missing path.
func checkFlakeInputs(lock []byte) error {
	var lf struct {
		Root  string `json:"root"`
		Nodes map[string]struct {
			Locked   map[string]any `json:"locked"`
			Original map[string]any `json:"original"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal(lock, &lf); err != nil {
		return fmt.Errorf("read flake.lock: %w", err)
	}
	names := make([]string, 0, len(lf.Nodes))
	for name := range lf.Nodes {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if name == lf.Root {
			continue
		}
		n := lf.Nodes[name]
		for _, ref := range []map[string]any{n.Locked, n.Original} {
			if where := outsidePath(ref); where != "" {
				return fmt.Errorf("flake input %q is %s, outside the project's tree: a flake's inputs may be paths inside its own repository only", name, where)
			}
		}
	}
	return nil
}

// outsidePath describes where a lock file's input reference points on the node outside the
// flake's tree, or is "" if it does not.
func outsidePath(ref map[string]any) string {
	if p, ok := ref["path"].(string); ok && ref["type"] == "path" {
		if c := path.Clean(p); path.IsAbs(c) || c == ".." || strings.HasPrefix(c, "../") {
			return "the path " + p
		}
	}
	if u, ok := ref["url"].(string); ok {
		if strings.HasPrefix(u, "/") {
			return "the path " + u
		}
		if pu, err := url.Parse(u); err != nil || pu.Scheme == "file" || strings.HasSuffix(pu.Scheme, "+file") {
			return "the local URL " + u
		}
	}
	return ""
}
