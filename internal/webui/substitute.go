package webui

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
)

// CacheSources is where Nix clients substitute the cluster's outputs from: the configured
// public URL of the cache ([cache] public_url), else the live cache nodes' endpoints; and the
// keys the cluster signs with.
type CacheSources struct {
	URLs []string
	Keys []string
	// Hidden is true when the URLs are the nodes' endpoints, which anonymous viewers are not
	// shown (as GET /api/cluster does not show them): URLs is then empty.
	Hidden bool
}

// cacheSources reads where to substitute from, for a viewer who is anonymous or not.
func (u *UI) cacheSources(ctx context.Context, anonymous bool) (CacheSources, error) {
	var s CacheSources
	dead := cmp.Or(u.cfg.DeadThreshold, cluster.DefaultDeadThreshold)
	if err := u.cfg.Pool.QueryRow(ctx, sqlCacheSources, dead.Seconds()).Scan(&s.URLs, &s.Keys); err != nil {
		return s, fmt.Errorf("cache sources: %w", err)
	}
	switch pu := strings.TrimRight(u.cfg.CacheURL, "/"); {
	case pu != "":
		s.URLs = []string{pu}
	case anonymous && len(s.URLs) > 0:
		s.URLs, s.Hidden = nil, true
	}
	for i, c := range s.URLs {
		s.URLs[i] = strings.TrimRight(c, "/")
	}
	return s, nil
}

// Hosts are the host names of the cache URLs, each once: a netrc-file's "machine" is a host
// name, without the port.
func (s CacheSources) Hosts() []string {
	var hosts []string
	for _, c := range s.URLs {
		p, err := url.Parse(c)
		if err != nil || p.Hostname() == "" || slices.Contains(hosts, p.Hostname()) {
			continue
		}
		hosts = append(hosts, p.Hostname())
	}
	return hosts
}

// NixConf is the nix.conf lines that substitute from the cluster's caches; a private
// project's paths also need the netrc-file (netrcPath) with a cache token.
func (s CacheSources) NixConf(private bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "extra-substituters = %s\n", strings.Join(s.URLs, " "))
	fmt.Fprintf(&b, "extra-trusted-public-keys = %s\n", strings.Join(s.Keys, " "))
	if private {
		fmt.Fprintf(&b, "netrc-file = %s\n", netrcPath)
	}
	return b.String()
}

// Netrc is the netrc-file lines of the caches' hosts for token.
func (s CacheSources) Netrc(token string) string {
	var b strings.Builder
	for _, h := range s.Hosts() {
		b.WriteString(netrcLine(h, token))
		b.WriteByte('\n')
	}
	return b.String()
}

// netrcPath is where the snippets put the netrc-file: the nix-daemon reads it there, as root.
const netrcPath = "/etc/nix/netrc"

// tokenPlaceholder stands for the user's token in a snippet shown before one is minted.
const tokenPlaceholder = "<your cache token>"

// netrcLine is a netrc-file line for host: Nix sends it as HTTP basic auth, whose password is
// the token (the cache ignores the login).
func netrcLine(host, token string) string {
	return "machine " + host + " login nix password " + token
}
