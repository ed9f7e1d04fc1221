package cli

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
)

// prFlags are the pull request and polling settings of project enable and set.
type prFlags struct {
	enabled bool
	trust   string
	poll    string
	promote bool
}

func (p *prFlags) add(f *pflag.FlagSet) {
	f.BoolVar(&p.enabled, "pr-enabled", true, "evaluate pull requests")
	f.StringVar(&p.trust, "pr-trust", project.PRTrustCollaborators, "whose pull requests are evaluated: collaborators (others after a collaborator's \"/ci run\"), all or none")
	f.StringVar(&p.poll, "poll-interval", "0s", "also check the default branch's head this often (0s: webhooks only; at least 1m)")
	f.BoolVar(&p.promote, "promote-pr-outputs", true, "a branch's evaluation takes outputs built only for pull requests (quarantined) as built, serving them to everyone; false rebuilds them first")
}

func (p *prFlags) settings(cmd *cobra.Command) (project.Settings, error) {
	var s project.Settings
	if cmd.Flags().Changed("pr-enabled") {
		s.PREnabled = &p.enabled
	}
	if cmd.Flags().Changed("pr-trust") {
		s.PRTrust = &p.trust
	}
	if cmd.Flags().Changed("promote-pr-outputs") {
		s.PromotePROutputs = &p.promote
	}
	if cmd.Flags().Changed("poll-interval") {
		var d config.Duration
		if err := d.UnmarshalText([]byte(p.poll)); err != nil {
			return s, fmt.Errorf("--poll-interval: %w", err)
		}
		s.PollInterval = &d.Duration
	}
	return s, s.Validate()
}

func newProjectRepos(g *globalFlags) *cobra.Command {
	var forgeName, search string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "repos [--forge NAME] [--search TEXT]",
		Short: "List the repositories the forges listed, with their ids for project enable",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withDB(cmd, g, func(ctx context.Context, _ *config.Config, pool *pgxpool.Pool) error {
				rs, err := project.ListRepositories(ctx, pool, forgeName, search)
				if err != nil {
					return err
				}
				for i := range rs {
					rs[i] = rs[i].Redacted()
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), rs)
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tFORGE\tREPOSITORY\tPRIVATE\tPROJECT\tLAST LISTED")
				for _, r := range rs {
					proj := "-"
					if r.Project != "" {
						proj = r.Project
						if !r.Enabled {
							proj += " (disabled)"
						}
					}
					fmt.Fprintf(tw, "%d\t%s\t%s\t%v\t%s\t%s\n", r.ID, r.Forge, r.FullName, r.Private, proj,
						r.LastSynced.Local().Format(time.DateTime))
				}
				if len(rs) == 0 {
					fmt.Fprintln(tw, "(none: the frontends list the forges' repositories at start and every repo_sync_interval)")
				}
				return tw.Flush()
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&forgeName, "forge", "", "only this forge's repositories")
	f.StringVar(&search, "search", "", "only repositories whose owner/name contains this")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// enabler builds what enabling needs from the configuration: the forges and where they
// deliver webhooks.
func enabler(cfg *config.Config, pool *pgxpool.Pool) (*project.Enabler, error) {
	forges, err := forge.FromConfig(cfg.Forges)
	if err != nil {
		return nil, err
	}
	return &project.Enabler{Pool: pool, Forges: forges, PublicURL: cfg.Frontend.PublicURL}, nil
}

func parseRepoID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("repository id %q: want a positive integer (harmonia-ci project repos lists them)", s)
	}
	return id, nil
}

func newProjectEnable(g *globalFlags) *cobra.Command {
	var name string
	var shares int
	var pr prFlags
	cmd := &cobra.Command{
		Use:   "enable REPO_ID [--name NAME] [--shares N] [--pr-trust T] [--poll-interval D]",
		Short: "Make a forge repository a project: register its webhook and evaluate its pushes and pull requests",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseRepoID(args[0])
			if err != nil {
				return err
			}
			s, err := pr.settings(cmd)
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("shares") {
				s.Shares = &shares
			}
			return withDB(cmd, g, func(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool) error {
				en, err := enabler(cfg, pool)
				if err != nil {
					return err
				}
				if en.PublicURL == "" {
					return fmt.Errorf("frontend.public_url is not set: the forge needs it to deliver webhooks (or enable through a frontend's API, which defaults it to its endpoint)")
				}
				p, err := en.Enable(ctx, id, project.EnableParams{Name: name, Settings: s})
				if err != nil {
					return err
				}
				printProjects(cmd.OutOrStdout(), []project.Project{p})
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "the project's name (default: the repository's name)")
	f.IntVar(&shares, "shares", 100, "scheduling shares")
	pr.add(f)
	return cmd
}

func newProjectDisable(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "disable REPO_ID",
		Short: "Stop evaluating a forge repository's project and remove its webhook",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseRepoID(args[0])
			if err != nil {
				return err
			}
			return withDB(cmd, g, func(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool) error {
				en, err := enabler(cfg, pool)
				if err != nil {
					return err
				}
				p, err := en.Disable(ctx, id)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "disabled project %s (%s)\n", p.Name, strings.TrimSpace(p.FullName))
				return nil
			})
		},
	}
}
