package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
)

func newProjectCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "project",
		Short: "Add, list and change projects",
	}
	cmd.AddCommand(newProjectAdd(g), newProjectList(g), newProjectSet(g), newProjectRepos(g),
		newProjectEnable(g), newProjectDisable(g))
	return cmd
}

func newProjectAdd(g *globalFlags) *cobra.Command {
	var p project.AddParams
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "add NAME --repo URL_OR_PATH",
		Short: "Add a project: a git repository the CI evaluates and builds",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p.Name = args[0]
			return withDB(cmd, g, func(ctx context.Context, _ *config.Config, pool *pgxpool.Pool) error {
				pr, err := project.Add(ctx, pool, p)
				if err != nil {
					return err
				}
				pr = pr.Redacted()
				if asJSON {
					return printJSON(cmd.OutOrStdout(), pr)
				}
				visibility := "public"
				if pr.Private {
					visibility = "private"
				}
				fmt.Fprintf(cmd.OutOrStdout(), "added project %s (id %d): %s, branch %s, %d shares, %s\n",
					pr.Name, pr.ID, pr.RepoURL, pr.Branch, pr.Shares, visibility)
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&p.RepoURL, "repo", "", "git repository: a local path, file://, ssh://, git:// or http(s):// URL (without credentials)")
	f.BoolVar(&p.Private, "private", false, "show the project's pages, builds and logs to admins only")
	f.StringVar(&p.Branch, "branch", "main", "default branch to evaluate")
	f.IntVar(&p.Shares, "shares", 100, "scheduling shares (fair share of the builders)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	_ = cmd.MarkFlagRequired("repo")
	return cmd
}

func newProjectList(g *globalFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List projects",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withDB(cmd, g, func(ctx context.Context, _ *config.Config, pool *pgxpool.Pool) error {
				ps, err := project.List(ctx, pool)
				if err != nil {
					return err
				}
				for i := range ps {
					ps[i] = ps[i].Redacted()
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), ps)
				}
				printProjects(cmd.OutOrStdout(), ps)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newProjectSet(g *globalFlags) *cobra.Command {
	var shares int
	var enabled, private bool
	var branch string
	var pr prFlags
	cmd := &cobra.Command{
		Use:   "set NAME [--shares N] [--enabled=true|false] [--branch B] [--private=true|false] [--pr-enabled=B] [--pr-trust T] [--poll-interval D] [--promote-pr-outputs=B]",
		Short: "Change a project's shares, default branch, pull request policy, polling, or whether it is evaluated",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			settings, err := pr.settings(cmd)
			if err != nil {
				return err
			}
			if settings != (project.Settings{}) {
				if cmd.Flags().Changed("enabled") || cmd.Flags().Changed("branch") || cmd.Flags().Changed("private") {
					return fmt.Errorf("give the pull request and polling flags without --enabled, --branch and --private")
				}
				if cmd.Flags().Changed("shares") {
					settings.Shares = &shares
				}
				return withDB(cmd, g, func(ctx context.Context, _ *config.Config, pool *pgxpool.Pool) error {
					p, err := project.Get(ctx, pool, args[0])
					if err != nil {
						return err
					}
					p, err = project.Configure(ctx, pool, p.RepoID, settings)
					if err != nil {
						return err
					}
					printProjects(cmd.OutOrStdout(), []project.Project{p})
					return nil
				})
			}
			var s project.SetParams
			if cmd.Flags().Changed("shares") {
				s.Shares = &shares
			}
			if cmd.Flags().Changed("enabled") {
				s.Enabled = &enabled
			}
			if cmd.Flags().Changed("branch") {
				s.Branch = &branch
			}
			if cmd.Flags().Changed("private") {
				s.Private = &private
			}
			if s == (project.SetParams{}) {
				return fmt.Errorf("nothing to change: give --shares, --enabled, --branch or --private")
			}
			return withDB(cmd, g, func(ctx context.Context, _ *config.Config, pool *pgxpool.Pool) error {
				pr, err := project.Set(ctx, pool, args[0], s)
				if err != nil {
					return err
				}
				printProjects(cmd.OutOrStdout(), []project.Project{pr})
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.IntVar(&shares, "shares", 100, "scheduling shares")
	f.BoolVar(&enabled, "enabled", true, "evaluate the project (false: queued evaluations wait)")
	f.StringVar(&branch, "branch", "", "default branch")
	f.BoolVar(&private, "private", false, "a project added by URL: show its pages, builds and logs to admins only (a forge's repository is private as its forge says)")
	pr.add(f)
	return cmd
}

func printProjects(w io.Writer, ps []project.Project) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tID\tBRANCH\tSHARES\tENABLED\tPULL REQUESTS\tPOLL\tREPOSITORY")
	for _, p := range ps {
		p = p.Redacted()
		prs := "off"
		if p.PREnabled {
			prs = p.PRTrust
		}
		poll := "-"
		if p.PollInterval > 0 {
			poll = p.PollInterval.String()
		}
		repo := p.RepoURL
		if p.Forge != project.ForgeGit {
			repo = p.Forge + ":" + p.FullName
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%v\t%s\t%s\t%s\n", p.Name, p.ID, p.Branch, p.Shares, p.Enabled, prs, poll, repo)
	}
	if len(ps) == 0 {
		fmt.Fprintln(tw, "(no projects; add one with harmonia-ci project add)")
	}
	tw.Flush()
}
