package nixtest

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// PathInfo is what `nix path-info --json` says of a path, with the NAR hash in the cluster's
// "sha256:<nix32>" form whatever the Nix version wrote.
type PathInfo struct {
	Path       string
	NarHash    string
	NarSize    int64
	References []string
	Deriver    string // "" if unknown
	CA         string // "" unless content-addressed
}

// PathInfos runs `nix path-info --json ARGS...` (with the nix-command feature) and returns what
// it says by path; a path it reports invalid fails t. env, if not nil, is the command's
// environment.
func PathInfos(t testing.TB, env []string, args ...string) map[string]PathInfo {
	t.Helper()
	cmd := exec.Command("nix", append([]string{"--extra-experimental-features", "nix-command", "path-info", "--json"}, args...)...)
	cmd.Env = env
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("nix path-info --json %s: %v\n%s", strings.Join(args, " "), err, msg)
	}
	infos, err := ParsePathInfos(out)
	if err != nil {
		t.Fatalf("nix path-info --json %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return infos
}

// pathInfoJSON is one path's object in `nix path-info --json`.
type pathInfoJSON struct {
	Path       string   `json:"path"` // in the list form only
	Valid      *bool    `json:"valid"`
	NarHash    string   `json:"narHash"`
	NarSize    int64    `json:"narSize"`
	References []string `json:"references"`
	Deriver    *string  `json:"deriver"`
	CA         *string  `json:"ca"`
}

// ParsePathInfos reads `nix path-info --json`: a list of objects with a "path" field up to
// Nix 2.18, an object keyed by path (null for an invalid one) since 2.19. Hashes are SRI
// ("sha256-<base64>") or, in older versions, "sha256:<nix32>".
func ParsePathInfos(data []byte) (map[string]PathInfo, error) {
	var list []pathInfoJSON
	if err := json.Unmarshal(data, &list); err != nil {
		var byPath map[string]*pathInfoJSON
		if err2 := json.Unmarshal(data, &byPath); err2 != nil {
			return nil, fmt.Errorf("neither a list nor an object of path infos: %w", err)
		}
		for p, i := range byPath {
			if i == nil {
				return nil, fmt.Errorf("%s is not valid", p)
			}
			i.Path = p
			list = append(list, *i)
		}
	}
	out := make(map[string]PathInfo, len(list))
	for _, i := range list {
		if i.Valid != nil && !*i.Valid {
			return nil, fmt.Errorf("%s is not valid", i.Path)
		}
		h, err := narHash(i.NarHash)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", i.Path, err)
		}
		info := PathInfo{Path: i.Path, NarHash: h, NarSize: i.NarSize, References: i.References}
		if i.Deriver != nil {
			info.Deriver = *i.Deriver
		}
		if i.CA != nil {
			info.CA = *i.CA
		}
		if info.References == nil {
			info.References = []string{}
		}
		out[i.Path] = info
	}
	return out, nil
}

// narHash converts an SRI or sha256:<nix32> hash to sha256:<nix32>.
func narHash(h string) (string, error) {
	if sri, ok := strings.CutPrefix(h, "sha256-"); ok {
		b, err := base64.StdEncoding.DecodeString(sri)
		if err != nil || len(b) != sha256.Size {
			return "", fmt.Errorf("narHash %q is not a SHA-256 SRI hash", h)
		}
		return nix.FormatSHA256([sha256.Size]byte(b)), nil
	}
	if _, err := nix.ParseSHA256(h); err != nil {
		return "", fmt.Errorf("narHash: %w", err)
	}
	return h, nil
}

// Version is the version of the Nix on PATH ("2.8.0", "2.26.3"), as `nix-store --version`
// prints it.
func Version(t testing.TB) string {
	t.Helper()
	RequireNix(t)
	out, err := exec.Command("nix-store", "--version").Output()
	if err != nil {
		t.Fatalf("nix-store --version: %v", err)
	}
	v, err := nix.ParseVersion(string(out))
	if err != nil {
		t.Fatalf("nix-store --version: %v", err)
	}
	return v
}
