package forge

import (
	"fmt"
	"sort"

	"github.com/harmonia-ci/harmonia-ci/internal/config"
)

// Set is the configured forges by name.
type Set map[string]Forge

// FromConfig builds the forges of [[forges]].
func FromConfig(cfgs []config.ForgeConfig) (Set, error) {
	s := Set{}
	for _, c := range cfgs {
		var f Forge
		var err error
		switch c.Type {
		case config.ForgeGitea:
			f, err = NewGitea(GiteaConfig{Name: c.Name, URL: c.URL, Token: c.Token, WebhookSecret: []byte(c.WebhookSecret)})
		case config.ForgeGitHub:
			f, err = NewGitHub(GitHubConfig{Name: c.Name, APIURL: c.APIURL, WebURL: c.URL, AppID: int64(c.AppID),
				PrivateKey: []byte(c.PrivateKey), WebhookSecret: []byte(c.WebhookSecret)})
		default:
			err = fmt.Errorf("unknown forge type %q", c.Type)
		}
		if err != nil {
			return nil, fmt.Errorf("forge %s: %w", c.Name, err)
		}
		s[c.Name] = f
	}
	return s, nil
}

// Names returns the forges' names, sorted.
func (s Set) Names() []string {
	names := make([]string, 0, len(s))
	for n := range s {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
