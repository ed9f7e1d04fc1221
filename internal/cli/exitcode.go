package cli

import (
	"errors"
	"net/http"
	"strings"

	"github.com/spf13/cobra"

	"github.com/harmonia-ci/harmonia-ci/internal/apiclient"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
)

// Exit codes: stable, since scripts branch on them. README's table "Exit codes" lists the same
// (TestExitCodesInReadme).
const (
	exitOK              = 0
	exitFailed          = 1
	exitUsage           = 2
	exitUnauthenticated = 3
	exitForbidden       = 4
	exitNotFound        = 5
	exitUnavailable     = 6
	exitRateLimited     = 7
)

// exitCodes documents each exit code, in README's words.
var exitCodes = []struct {
	code    int
	meaning string
}{
	{exitOK, "success; for `watch` and `eval --wait`, everything succeeded"},
	{exitFailed, "what the command followed failed (a build, an evaluation, an attribute), or another error"},
	{exitUsage, "usage error: an unknown command or flag, a bad argument"},
	{exitUnauthenticated, "the server refused the token (401: invalid, revoked or expired)"},
	{exitForbidden, "the token's user may not do this (403); nothing was changed"},
	{exitNotFound, "no such project, evaluation or build, or one the caller may not read (404)"},
	{exitUnavailable, "the server is unreachable or failed (5xx), or the network did"},
	{exitRateLimited, "still rate limited (429) after the retries"},
}

// usageError is a command line the program cannot run: exit code 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// failedError says that what a command followed failed: exit code 1, with its message.
type failedError struct{ msg string }

func (e failedError) Error() string { return e.msg }

// exitCode is the exit code of a command's error.
func exitCode(err error) int {
	var ae *apiclient.Error
	var ue usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		return exitUsage
	case errors.As(err, &ae):
		switch {
		case ae.Status == http.StatusUnauthorized:
			return exitUnauthenticated
		case ae.Status == http.StatusForbidden:
			return exitForbidden
		case ae.Status == http.StatusNotFound:
			return exitNotFound
		case ae.Status == http.StatusTooManyRequests:
			return exitRateLimited
		case ae.Status == 0 || ae.Status >= 500:
			return exitUnavailable
		}
	case errors.Is(err, evaluation.ErrNotFound), errors.Is(err, queue.ErrNotFound):
		return exitNotFound
	case strings.HasPrefix(err.Error(), "unknown command "), strings.HasPrefix(err.Error(), "unknown flag"):
		// cobra's own, before any command runs
		return exitUsage
	}
	return exitFailed
}

// markUsageErrors makes the argument and flag errors of cmd and its subcommands usage errors.
func markUsageErrors(cmd *cobra.Command) {
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	if args := cmd.Args; args != nil {
		cmd.Args = func(c *cobra.Command, a []string) error {
			if err := args(c, a); err != nil {
				return usageError{err}
			}
			return nil
		}
	}
	for _, c := range cmd.Commands() {
		markUsageErrors(c)
	}
}
