// Package deploy_test checks what deploy/ ships: the systemd units pass systemd-analyze verify
// and keep the options a draining, Nix-building node needs, and the example cluster's
// configurations load with the real loader and keep each machine's secrets in its trust zone.
package deploy_test

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nodetoken"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	proctest.Cleanup()
	os.Exit(code)
}

const (
	unitDir     = "systemd"
	unit        = "harmonia-ci.service"
	template    = "harmonia-ci@.service"
	installed   = "/usr/local/bin/harmonia-ci" // where the units expect the binary
	examplesDir = "examples/three-machines"
	secretsDir  = "/etc/harmonia-ci/secrets/"
)

// TestSystemdVerify runs systemd-analyze verify on the units, the template both as itself and as
// an instance, with the binary the units start at a path that exists: verify checks that the
// ExecStart= command is executable, and this tree's binary is what would be installed there.
// Any message about the units fails the test, warnings included (systemd-analyze exits 0 on an
// unknown key).
func TestSystemdVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("systemd-analyze is missing (scripts/deps.sh test installs it: Debian's systemd)")
		}
		t.Skip("systemd-analyze is missing (scripts/deps.sh test installs it: Debian's systemd)")
	}
	bin := proctest.Binary(t)
	dir := t.TempDir()
	for _, name := range []string{unit, template} {
		text := readFile(t, filepath.Join(unitDir, name))
		if !strings.Contains(text, "ExecStart="+installed+" ") {
			t.Fatalf("%s: ExecStart does not run %s", name, installed)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(strings.ReplaceAll(text, installed, bin)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The instance has no file of its own: systemd loads it from the template next to it.
	units := []string{filepath.Join(dir, unit), filepath.Join(dir, template), filepath.Join(dir, "harmonia-ci@front.service")}
	out, err := exec.Command(analyze, append([]string{"verify"}, units...)...).CombinedOutput()
	if err != nil {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		switch {
		case line == "":
		case strings.Contains(line, "harmonia-ci"):
			t.Errorf("systemd-analyze verify: %s", line)
		default:
			t.Logf("systemd-analyze verify, about another unit: %s", line)
		}
	}
}

// settings reads a unit's Key=Value lines by section; repeated keys keep every value.
func settings(t *testing.T, text string) map[string][]string {
	t.Helper()
	m := map[string][]string{}
	section := ""
	for line := range strings.SplitSeq(text, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "["):
			section = strings.Trim(line, "[]")
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Fatalf("not Key=Value: %q", line)
			}
			m[section+"."+k] = append(m[section+"."+k], v)
		}
	}
	return m
}

// systemdSpan parses the time spans the units use ("6min", "10s", "1h 30min").
func systemdSpan(t *testing.T, s string) time.Duration {
	t.Helper()
	units := map[string]time.Duration{"h": time.Hour, "min": time.Minute, "s": time.Second}
	var d time.Duration
	parts := regexp.MustCompile(`(\d+)\s*(h|min|s)\b`).FindAllStringSubmatch(s, -1)
	if len(parts) == 0 {
		t.Fatalf("cannot parse the time span %q", s)
	}
	for _, p := range parts {
		n, _ := strconv.Atoi(p[1])
		d += time.Duration(n) * units[p[2]]
	}
	return d
}

// TestUnitOptions checks what the units must say for a node to drain, restart and build.
func TestUnitOptions(t *testing.T) {
	// Options that break Nix's sandbox on builders and evaluators (the unit says why for each).
	forbidden := []string{"RestrictNamespaces", "PrivateUsers", "ProtectKernelTunables", "ProtectKernelLogs",
		"ProtectHostname", "ProtectProc", "ProcSubset", "SystemCallFilter", "LockPersonality",
		"RestrictAddressFamilies", "MemoryDenyWriteExecute", "RestrictSUIDSGID", "PrivateDevices",
		"ProtectClock", "DeviceAllow", "UMask"}
	want := map[string]string{
		"Service.KillMode":       "mixed",
		"Service.Restart":        "on-failure",
		"Service.ProtectSystem":  "strict",
		"Service.ProtectHome":    "yes",
		"Service.PrivateTmp":     "yes",
		"Service.ReadWritePaths": "-/nix",
		"Install.WantedBy":       "multi-user.target",
	}
	// The slowest drain: the default drain timeout, then the shutdown's own steps (30 s).
	drain := config.Default().Cluster.Shutdown.DrainTimeout.Duration + 30*time.Second
	bin := ""
	for _, tc := range []struct {
		name, instance string
		config, state  string // the paths the node gets, specifiers expanded
	}{
		{unit, "", "/etc/harmonia-ci/config.toml", "/var/lib/harmonia-ci"},
		{template, "front", "/etc/harmonia-ci/front.toml", "/var/lib/harmonia-ci/front"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := settings(t, readFile(t, filepath.Join(unitDir, tc.name)))
			one := func(key string) string {
				t.Helper()
				if len(s[key]) != 1 {
					t.Fatalf("%s: want one %s, got %q", tc.name, key, s[key])
				}
				return s[key][0]
			}
			for k, v := range want {
				if got := one(k); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
			for _, k := range forbidden {
				if v, ok := s["Service."+k]; ok {
					t.Errorf("Service.%s = %q: it breaks Nix's sandbox on builders", k, v)
				}
			}
			if stop := systemdSpan(t, one("Service.TimeoutStopSec")); stop <= drain {
				t.Errorf("TimeoutStopSec = %s: a drain may take %s; systemd would kill a draining node", stop, drain)
			}
			expand := strings.NewReplacer("%i", tc.instance, "%S", "/var/lib")
			if got := "/var/lib/" + expand.Replace(one("Service.StateDirectory")); got != tc.state {
				t.Errorf("StateDirectory is %s, want %s", got, tc.state)
			}
			// The commands run this binary with flags it has: `CMD --help` parses every flag.
			for key, verb := range map[string]string{"Service.ExecStart": "serve", "Service.ExecStop": "drain"} {
				cmd := one(key)
				if key == "Service.ExecStop" {
					var ok bool
					if cmd, ok = strings.CutPrefix(cmd, "-"); !ok {
						t.Errorf("ExecStop %q: want a leading '-', so that stopping a node that is already gone succeeds", cmd)
					}
				}
				args := strings.Fields(expand.Replace(cmd))
				if args[0] != installed || args[1] != verb || !slices.Equal(args[2:], []string{"--config", tc.config, "--state-dir", tc.state}) {
					t.Errorf("%s = %q, want %s %s --config %s --state-dir %s", key, cmd, installed, verb, tc.config, tc.state)
					continue
				}
				if bin == "" {
					bin = proctest.Binary(t)
				}
				if out, err := exec.Command(bin, append(args[1:], "--help")...).CombinedOutput(); err != nil {
					t.Errorf("%s: harmonia-ci %s: %v\n%s", key, strings.Join(args[1:], " "), err, out)
				}
			}
		})
	}
}

// TestTemplateMatchesUnit: the template is the unit with instance names, comments included.
func TestTemplateMatchesUnit(t *testing.T) {
	body := func(text string) string { return text[strings.Index(text, "[Unit]"):] }
	plain := body(readFile(t, filepath.Join(unitDir, unit)))
	instance := strings.NewReplacer(
		"/etc/harmonia-ci/%i.toml", "/etc/harmonia-ci/config.toml",
		"harmonia-ci/%i", "harmonia-ci",
		"node %i (", "node (",
	).Replace(body(readFile(t, filepath.Join(unitDir, template))))
	if instance != plain {
		t.Errorf("%s differs from %s beyond the instance names (%s after the instance names are replaced):\n%s", template, unit, template, lineDiff(plain, instance))
	}
}

// lineDiff shows the first line where a and b differ.
func lineDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return fmt.Sprintf("line %d:\n- %s\n+ %s", i+1, al[i], bl[i])
		}
	}
	return fmt.Sprintf("%d lines against %d", len(al), len(bl))
}

// machine is a row of the example's README table.
type machine struct {
	name, config string
	roles        []string
	secrets      []string // file names in /etc/harmonia-ci/secrets
}

var tableRow = regexp.MustCompile(`(?m)^\| (\w+) \| \[([\w.-]+\.toml)\]\([\w.-]+\) \| ([^|]+) \| ([^|]+) \|$`)

func readmeMachines(t *testing.T) []machine {
	t.Helper()
	var ms []machine
	list := func(s string) []string {
		var out []string
		for f := range strings.SplitSeq(s, ",") {
			out = append(out, strings.TrimSpace(f))
		}
		sort.Strings(out)
		return out
	}
	for _, m := range tableRow.FindAllStringSubmatch(readFile(t, filepath.Join(examplesDir, "README.md")), -1) {
		ms = append(ms, machine{name: m[1], config: m[2], roles: list(m[3]), secrets: list(m[4])})
	}
	tomls, err := filepath.Glob(filepath.Join(examplesDir, "*.toml"))
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, m := range ms {
		listed = append(listed, filepath.Join(examplesDir, m.config))
	}
	sort.Strings(listed)
	if len(ms) == 0 || !slices.Equal(listed, tomls) {
		t.Fatalf("the README's table lists %v; the directory has %v", listed, tomls)
	}
	return ms
}

// secretFiles lists the *_file values anywhere in a decoded TOML document, by dotted key.
func secretFiles(prefix string, v any, out map[string]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && strings.HasSuffix(k, "_file") {
				out[prefix+k] = s
				continue
			}
			secretFiles(prefix+k+".", x, out)
		}
	case []map[string]any:
		for i, x := range v {
			secretFiles(fmt.Sprintf("%s%d.", prefix, i), x, out)
		}
	}
}

func randomHex(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// TestExampleConfigs loads every example configuration with the real loader, its secret files
// made up in a temporary directory (the paths rewritten, nothing else), and checks it against
// the README's table and the trust zones: only signers hold the signing key, the S3 credentials
// and the cluster secret.
func TestExampleConfigs(t *testing.T) {
	clusterSecret := randomHex(t)
	key, err := nodetoken.NewKey(clusterSecret)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range readmeMachines(t) {
		t.Run(m.name, func(t *testing.T) {
			text := readFile(t, filepath.Join(examplesDir, m.config))
			var raw map[string]any
			if _, err := toml.Decode(text, &raw); err != nil {
				t.Fatalf("%s: %v", m.config, err)
			}
			files := map[string]string{}
			secretFiles("", raw, files)
			if dbURL, ok := raw["database_url"].(string); ok {
				u, err := url.Parse(dbURL)
				if err != nil {
					t.Fatalf("database_url: %v", err)
				}
				if u.User != nil {
					if _, ok := u.User.Password(); ok {
						t.Error("database_url holds a password: the README promises it in passfile")
					}
				}
				if pf := u.Query().Get("passfile"); pf != "" {
					files["database_url passfile"] = pf
				}
			}
			var names []string
			for k, p := range files {
				if !strings.HasPrefix(p, secretsDir) || strings.Contains(strings.TrimPrefix(p, secretsDir), "/") {
					t.Errorf("%s = %q: want a file directly in %s", k, p, secretsDir)
				}
				names = append(names, path.Base(p))
			}
			sort.Strings(names)
			if !slices.Equal(names, m.secrets) {
				t.Errorf("%s holds the secrets %v; the README says %v", m.config, names, m.secrets)
			}

			node, _ := raw["node"].(map[string]any)
			id, _ := node["id"].(string)
			var roles []string
			for _, r := range node["roles"].([]any) {
				roles = append(roles, r.(string))
			}
			dir := t.TempDir()
			secrets := filepath.Join(dir, "secrets")
			if err := os.Mkdir(secrets, 0o700); err != nil {
				t.Fatal(err)
			}
			for _, name := range names {
				p := filepath.Join(secrets, name)
				switch name {
				case "signing-key":
					k, err := nix.GenerateKey("ci.example.com-1")
					if err == nil {
						err = k.WriteFile(p, false)
					}
					if err != nil {
						t.Fatal(err)
					}
					continue
				case "node-token":
					token, err := key.Issue(nodetoken.Identity{NodeID: id, Roles: roles})
					if err != nil {
						t.Fatal(err)
					}
					writeSecret(t, p, token)
				case "cluster-secret":
					writeSecret(t, p, clusterSecret)
				default:
					writeSecret(t, p, randomHex(t))
				}
			}
			file := filepath.Join(dir, m.config)
			if err := os.WriteFile(file, []byte(strings.ReplaceAll(text, secretsDir, secrets+"/")), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg, err := config.Load(config.Overrides{ConfigFile: file}, func(string) string { return "" })
			if err != nil {
				t.Fatalf("%s does not load:\n%v", m.config, err)
			}
			if err := cfg.Validate(); err != nil {
				t.Errorf("%s: %v", m.config, err)
			}
			got := slices.Sorted(slices.Values(cfg.Node.Roles))
			if !slices.Equal(got, m.roles) {
				t.Errorf("%s runs %v; the README says %v", m.config, got, m.roles)
			}

			signer := cfg.HasRole(config.RoleSigner)
			for _, held := range []struct {
				what string
				has  bool
			}{
				{"the signing key (signer.signing_key_file)", cfg.Signer.SigningKeyFile != ""},
				{"the S3 access key", cfg.Cache.S3.AccessKey != "" || cfg.Cache.S3.AccessKeyFile != ""},
				{"the S3 secret key", cfg.Cache.S3.SecretKey != "" || cfg.Cache.S3.SecretKeyFile != ""},
				{"the cluster secret", cfg.Auth.ClusterSecret != ""},
			} {
				if held.has != signer {
					t.Errorf("%s (roles %v): holds %s: %v; only signers hold it", m.config, cfg.Node.Roles, held.what, held.has)
				}
			}
			if !signer {
				if cfg.Auth.NodeToken == "" {
					t.Errorf("%s: no node token: the signer would refuse this node", m.config)
				}
				if cfg.Auth.AdminToken != "" || len(cfg.Forges) > 0 || cfg.Auth.Secret != "" {
					t.Errorf("%s: a node that runs project code holds the admin token, forge or cookie secrets", m.config)
				}
			}
		})
	}
}

func writeSecret(t *testing.T, p, v string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(v+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
