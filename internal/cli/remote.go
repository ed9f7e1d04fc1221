package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/harmonia-ci/harmonia-ci/internal/apiclient"
	"github.com/harmonia-ci/harmonia-ci/internal/apiv1"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// The remote command line: with --server (or HARMONIA_CI_SERVER), the commands that have an
// HTTP path call a frontend's API with a token instead of opening the database.
const (
	envServer = "HARMONIA_CI_SERVER"
	envToken  = "HARMONIA_CI_TOKEN"
)

// serverURL is --server, else $HARMONIA_CI_SERVER.
func (g *globalFlags) serverURL() string {
	if g.server != "" {
		return g.server
	}
	return os.Getenv(envServer)
}

// remote is the API client when a server is given; nil (and no error) when the command should
// use the database.
func (g *globalFlags) remote() (*apiclient.Client, error) {
	server := g.serverURL()
	if server == "" {
		if g.token != "" || g.tokenFile != "" {
			return nil, usageError{errors.New("--token and --token-file need --server URL (or " + envServer + ")")}
		}
		return nil, nil
	}
	token, err := g.apiToken(server)
	if err != nil {
		return nil, err
	}
	c, err := apiclient.New(apiclient.Options{Server: server, Token: token})
	if err != nil {
		return nil, usageError{err}
	}
	return c, nil
}

// apiToken is --token, --token-file, $HARMONIA_CI_TOKEN or the token `login` stored for
// server, in that order; "" asks anonymously (public projects only).
func (g *globalFlags) apiToken(server string) (string, error) {
	switch {
	case g.token != "" && g.tokenFile != "":
		return "", usageError{errors.New("give --token or --token-file, not both")}
	case g.token != "":
		return g.token, nil
	case g.tokenFile != "":
		b, err := os.ReadFile(g.tokenFile)
		if err != nil {
			return "", usageError{fmt.Errorf("--token-file: %w", err)}
		}
		t := strings.TrimSpace(string(b))
		if t == "" {
			return "", usageError{fmt.Errorf("--token-file %s is empty", g.tokenFile)}
		}
		return t, nil
	case os.Getenv(envToken) != "":
		return os.Getenv(envToken), nil
	}
	path, err := apiclient.CredentialsPath(os.Getenv)
	if err != nil {
		return "", nil //nolint:nilerr // no home directory: no stored token, ask anonymously
	}
	return apiclient.StoredTokenFor(path, server)
}

// requireRemote is the API client of a command that works over HTTP only.
func (g *globalFlags) requireRemote(cmd *cobra.Command) (*apiclient.Client, error) {
	c, err := g.remote()
	if err == nil && c == nil {
		err = usageError{fmt.Errorf("%s works over HTTP only: pass --server URL (or set %s) and a token", cmd.CommandPath(), envServer)}
	}
	return c, err
}

// remoteContext ends at SIGINT/SIGTERM, and after limit unless it is 0.
func remoteContext(cmd *cobra.Command, limit time.Duration) (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	if limit == 0 {
		return ctx, stop
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	return ctx, func() { cancel(); stop() }
}

// dbOnly refuses --server for a command that reads the database directly.
func (g *globalFlags) dbOnly(cmd *cobra.Command) error {
	if cmd.Flags().Changed("server") {
		return usageError{fmt.Errorf("%s has no --server mode: run it where the database is, without --server", cmd.CommandPath())}
	}
	return nil
}

func newLogin(g *globalFlags) *cobra.Command {
	var name string
	var noBrowser bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "login --server URL [--name NAME] [--no-browser]",
		Short: "Get an API token through the browser and store it for --server",
		Long: `login opens the server's token page in a browser (open on macOS, xdg-open where there is a
display; with --no-browser, or when that fails, it prints the URL), where a logged-in user confirms a token named NAME
(default cli@<hostname>); the page hands the token back to this command on a loopback port, and
it is stored in $XDG_CONFIG_HOME/harmonia-ci/credentials.json (0600), keyed by the server's URL.
Later commands with the same --server use it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			server := g.serverURL()
			u, err := apiclient.ParseServer(server)
			if err != nil {
				return usageError{err}
			}
			path, err := apiclient.CredentialsPath(os.Getenv)
			if err != nil {
				return err
			}
			if _, err := apiclient.LoadCredentials(path); err != nil {
				return err // refuse a file others may read before a token is added to it
			}
			ctx, cancel := remoteContext(cmd, 0)
			defer cancel()
			o := apiclient.LoginOptions{Server: u.String(), Name: cmp.Or(name, apiclient.DefaultTokenName()), Out: cmd.ErrOrStderr(), Timeout: timeout}
			if !noBrowser {
				o.OpenFunc = browserOpener
			}
			token, err := apiclient.Login(ctx, o)
			if err != nil {
				return err
			}
			if err := apiclient.StoreToken(path, u.String(), apiclient.StoredToken{Token: token, Name: o.Name, StoredAt: time.Now().UTC()}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "logged in to %s; token stored in %s\n", u, path)
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "the token's name on the server (default cli@<hostname>)")
	cmd.Flags().BoolVar(&noBrowser, "no-browser", false, "print the URL to open instead of opening a browser")
	cmd.Flags().DurationVar(&timeout, "timeout", apiclient.DefaultLoginTimeout, "how long to wait for the browser")
	return cmd
}

// browserOpener opens the login page; tests replace it.
var browserOpener = openBrowser

// openBrowser opens url with open on macOS, with xdg-open elsewhere when there is a display
// (without one, xdg-open may start a text browser in this terminal).
func openBrowser(url string) error {
	opener := "open"
	if runtime.GOOS != "darwin" {
		if os.Getenv("DISPLAY") == "" && os.Getenv("WAYLAND_DISPLAY") == "" {
			return errors.New("no display")
		}
		opener = "xdg-open"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, opener, url).Run()
}

// apiEvalRow is an API evaluation as `eval list` prints it.
func apiEvalRow(e apiv1.Evaluation) evalRow {
	return evalRow{id: e.ID, project: e.Project, branch: e.Branch, commit: e.Commit, status: string(e.Status), created: e.CreatedAt}
}

// remoteEvalList is `eval list` over HTTP.
func remoteEvalList(cmd *cobra.Command, c *apiclient.Client, project string, limit int, asJSON bool) error {
	if limit < 1 || limit > apiv1.MaxLimit {
		return usageError{fmt.Errorf("--limit %d: the server lists 1 to %d", limit, apiv1.MaxLimit)}
	}
	ctx, cancel := remoteContext(cmd, 2*time.Minute)
	defer cancel()
	es, err := c.Evaluations(ctx, project, limit)
	if err != nil {
		return err
	}
	return printEvalList(cmd.OutOrStdout(), es, asJSON, apiEvalRow)
}

// remoteEvalShow is `eval show` over HTTP; with wait, once the evaluation has finished.
func remoteEvalShow(cmd *cobra.Command, c *apiclient.Client, id int64, wait, diff, asJSON bool) error {
	var limit time.Duration
	if !wait {
		limit = 2 * time.Minute
	}
	ctx, cancel := remoteContext(cmd, limit)
	defer cancel()
	for wait {
		e, err := c.Evaluation(ctx, id, false)
		if err != nil {
			return err
		}
		if !e.Status.Unfinished() {
			break
		}
		if err := apiclient.Sleep(ctx, watchInterval); err != nil {
			return err
		}
	}
	e, err := c.Evaluation(ctx, id, !diff)
	if err != nil {
		return err
	}
	if diff {
		d, err := c.Diff(ctx, id)
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(cmd.OutOrStdout(), d.Diff)
		}
		writeEvalHead(cmd.OutOrStdout(), evalHead{evalRow: apiEvalRow(e.Evaluation), nixVersion: e.NixVersion, evaluator: e.Evaluator, err: e.Error})
		if err := printDiff(cmd.OutOrStdout(), d.Diff); err != nil {
			return err
		}
	} else if err := showAPIEval(cmd, e, asJSON); err != nil {
		return err
	}
	if wait && (e.Status == status.EvalFailed || e.Status == status.EvalCancelled) {
		return failedError{fmt.Sprintf("evaluation %d %s", e.ID, e.Status)}
	}
	return nil
}

func showAPIEval(cmd *cobra.Command, e apiv1.EvaluationDetail, asJSON bool) error {
	w := cmd.OutOrStdout()
	if asJSON {
		return printJSON(w, e)
	}
	writeEvalHead(w, evalHead{evalRow: apiEvalRow(e.Evaluation), nixVersion: e.NixVersion, evaluator: e.Evaluator, err: e.Error})
	rows := make([]attrRow, len(e.Attributes))
	for i, a := range e.Attributes {
		rows[i] = attrRow{attr: a.Name, drv: a.DrvPath, evalErr: a.EvalError, job: a.Status}
	}
	return writeAttrs(w, rows)
}

// remoteAction runs a write over HTTP and prints the server's answer.
func remoteAction(cmd *cobra.Command, asJSON bool, do func(ctx context.Context) (apiclient.ActionResult, error)) error {
	ctx, cancel := remoteContext(cmd, 2*time.Minute)
	defer cancel()
	res, err := do(ctx)
	if err != nil {
		return err
	}
	return printAction(cmd, res.Message, asJSON)
}

// printAction prints what an action did, as a line or as {"message": …}.
func printAction(cmd *cobra.Command, msg string, asJSON bool) error {
	if asJSON {
		return printJSON(cmd.OutOrStdout(), apiclient.ActionResult{Message: msg})
	}
	_, err := fmt.Fprintln(cmd.OutOrStdout(), msg)
	return err
}

// remoteJobShow is `job show` over HTTP.
func remoteJobShow(cmd *cobra.Command, c *apiclient.Client, id int64, asJSON bool) error {
	ctx, cancel := remoteContext(cmd, 2*time.Minute)
	defer cancel()
	b, err := c.Build(ctx, id)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(cmd.OutOrStdout(), b)
	}
	f := newFieldWriter(cmd.OutOrStdout())
	j := jobFields{id: b.ID, drv: b.DrvPath, project: b.Project, status: string(b.Status), attempt: b.Attempt,
		retries: b.RetryCount, priority: b.Priority, builder: b.Builder, exitCode: b.ExitCode, err: b.Error, log: b.LogURL}
	if b.DurationSeconds != nil {
		d := time.Duration(*b.DurationSeconds * float64(time.Second))
		j.duration = &d
	}
	if b.Flaky {
		j.failures = b.Failures
	}
	if b.Status == status.JobPending {
		j.retryAt = b.RetryAt
	}
	j.write(f)
	return f.flush()
}
