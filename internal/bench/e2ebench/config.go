package e2ebench

import (
	"os"
	"path/filepath"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixgen"
	"github.com/harmonia-ci/harmonia-ci/internal/nodetoken"
)

func (b *e2e) baseConfig(id, stateDir string) (*config.Config, error) {
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return nil, err
	}
	cfg := config.Default()
	cfg.DatabaseURL, cfg.StateDir, cfg.Listen = b.url, stateDir, "127.0.0.1:0"
	cfg.LogLevel = "warn"
	cfg.Node.ID = id
	cfg.Auth.ClusterSecret = b.token
	cfg.Cluster.Shutdown.DrainTimeout = config.Duration{} // a stopped benchmark kills its builds
	return cfg, nil
}

func (b *e2e) frontConfig() (*config.Config, error) {
	cfg, err := b.baseConfig("e2e-front", filepath.Join(b.dir, "front"))
	if err != nil {
		return nil, err
	}
	cfg.Node.Roles = []string{config.RoleFrontend, config.RoleEvaluator, config.RoleSigner, config.RoleCache}
	cfg.Eval.PollInterval = config.Duration{Duration: time.Second}
	key, err := nix.GenerateKey("bench-e2e-1")
	if err != nil {
		return nil, err
	}
	cfg.Signer.SigningKeyFile = filepath.Join(cfg.StateDir, "signing-key")
	if err := key.WriteFile(cfg.Signer.SigningKeyFile, true); err != nil {
		return nil, err
	}
	return cfg, cfg.Validate()
}

// builderConfig is the configuration of builder id: o.Slots slots, its own chroot store,
// /bin/sleep in the sandbox if sleep, and queue.order order unless "".
func (b *e2e) builderConfig(id string, sleep bool, order string) (*config.Config, error) {
	cfg, err := b.baseConfig(id, filepath.Join(b.dir, "state-"+id))
	if err != nil {
		return nil, err
	}
	cfg.Node.Roles = []string{config.RoleBuilder}
	// A builder holds its node token only, as in a real deployment.
	if cfg.Auth.NodeToken, err = issueToken(b.token, id, cfg.Node.Roles); err != nil {
		return nil, err
	}
	cfg.Auth.ClusterSecret = ""
	cfg.Node.MaxJobs = b.o.Slots
	cfg.Build.NixStore = filepath.Join(b.dir, "store-"+id)
	cfg.Build.Cgroup = b.cgroup
	cfg.Build.ExtraSandboxPaths = nil
	if sleep {
		cfg.Build.ExtraSandboxPaths = []string{"/bin/sleep"}
	}
	if order != "" {
		cfg.Queue.Order = order
	}
	return cfg, cfg.Validate()
}

// sandboxPaths are the sandbox paths of both sides: builder.Store's defaults and the workload's.
func (b *e2e) sandboxPaths(name string) []string {
	var extra []string
	if name == E2ESleep {
		extra = []string{"/bin/sleep"}
	}
	return nix.SandboxPaths(extra)
}

func (b *e2e) expr(name, salt string) string {
	if name == E2ESleep {
		return nixgen.LayeredSleep(salt, b.o.Derivations, b.o.Width, b.o.SleepSeconds)
	}
	return nixgen.Layered(salt, b.o.Derivations, b.o.Width)
}

// issueToken returns the node token of node id in roles under the cluster secret.
func issueToken(secret, id string, roles []string) (string, error) {
	k, err := nodetoken.NewKey(secret)
	if err != nil {
		return "", err
	}
	return k.Issue(nodetoken.Identity{NodeID: id, Roles: roles})
}
