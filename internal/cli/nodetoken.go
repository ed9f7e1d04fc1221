package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/harmonia-ci/harmonia-ci/internal/nodetoken"
)

// newNodeToken issues a node's token from the cluster secret.
func newNodeToken(g *globalFlags) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "node-token NODE_ID --roles builder[,evaluator] [--out FILE]",
		Short: "Issue the token a builder or evaluator node authenticates to the signer with",
		Long: `node-token issues the token of node NODE_ID in the given roles, signed with the cluster
secret (auth.cluster_secret_file or HARMONIA_CLUSTER_SECRET), which only signer nodes hold. Give it
to that node as auth.node_token_file or HARMONIA_NODE_TOKEN: it lets the node act as itself in
those roles and nothing else. The token is printed, or written to --out (mode 0600).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("roles") {
				return errors.New("--roles is required: the roles the node may act in (builder, evaluator)")
			}
			cfg, err := g.load(cmd)
			if err != nil {
				return err
			}
			if cfg.Auth.ClusterSecret == "" {
				return errors.New("no cluster secret: set auth.cluster_secret_file or HARMONIA_CLUSTER_SECRET (the signers' secret)")
			}
			key, err := nodetoken.NewKey(cfg.Auth.ClusterSecret)
			if err != nil {
				return fmt.Errorf("auth.cluster_secret_file: %w", err)
			}
			token, err := key.Issue(nodetoken.Identity{NodeID: args[0], Roles: cfg.Node.Roles})
			if err != nil {
				return err
			}
			if out != "" {
				if err := createSecretFile(out, []byte(token+"\n")); err != nil {
					return fmt.Errorf("--out: %w", err)
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "wrote the token of %s to %s\n", args[0], out)
				return nil
			}
			fmt.Fprintln(cmd.OutOrStdout(), token)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "write the token to this file (mode 0600, never overwritten) instead of printing it")
	return cmd
}
