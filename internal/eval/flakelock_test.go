package eval

import (
	"fmt"
	"strings"
	"testing"
)

func TestCheckFlakeInputs(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, locked string
		want         string // "" when accepted
	}{
		{"relative path", `{"type": "path", "path": "./lib"}`, ""},
		{"nested relative path", `{"type": "path", "path": "lib/sub/."}`, ""},
		{"absolute path", `{"type": "path", "path": "/etc/nix"}`, `flake input "x" is the path /etc/nix, outside the project's tree`},
		{"escaping path", `{"type": "path", "path": "./lib/../../other"}`, `flake input "x" is the path ./lib/../../other`},
		{"git file URL", `{"type": "git", "url": "file:///var/lib/harmonia-ci/eval/1/source.git"}`, `flake input "x" is the local URL file:///var/lib`},
		{"git+file URL", `{"type": "git", "url": "git+file:///srv/repo"}`, "the local URL git+file:///srv/repo"},
		{"tarball file URL", `{"type": "tarball", "url": "file:///tmp/x.tar.gz"}`, "the local URL file:///tmp/x.tar.gz"},
		{"bare path URL", `{"type": "git", "url": "/srv/repo"}`, "the path /srv/repo"},
		{"remote git", `{"type": "git", "url": "https://example.org/repo.git"}`, ""},
		{"github", `{"type": "github", "owner": "o", "repo": "r"}`, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			lock := fmt.Sprintf(`{"nodes": {"root": {"inputs": {"x": "x"}}, "x": {"locked": %s, "original": {"type": "indirect", "id": "x"}}}, "root": "root", "version": 7}`, c.locked)
			err := checkFlakeInputs([]byte(lock))
			switch {
			case c.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Errorf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
	if err := checkFlakeInputs([]byte("not json")); err == nil || !strings.Contains(err.Error(), "read flake.lock") {
		t.Errorf("a broken lock file: %v", err)
	}
}
