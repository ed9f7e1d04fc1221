package webhook

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/forge"
)

// Who is trusted, and what an approval approves (docs/decisions.md, "Forge trust rules"):
//   - trusted means write access to the repository (forge.WriteAccess), the check the web UI
//     makes too;
//   - a pull_request event's code is evaluated without an approval when its sender is
//     trusted: the author opening it, whoever pushed (synchronize) or reopened it. The author
//     being trusted is not enough: their branch may take pushes from others;
//   - "/ci run" by a trusted commenter approves the head the pull request had when the
//     comment was written, "/ci run <commit>" that commit of the pull request; never a later
//     push.

// RunCommand is the pull request comment by which a collaborator has a pull request
// evaluated, on a line of its own, optionally followed by the commit it approves.
const RunCommand = "/ci run"

// commitArgRE is an abbreviated or full commit id, as "/ci run <commit>" takes it.
var commitArgRE = regexp.MustCompile(`^[0-9a-fA-F]{7,40}$`)

// trusted reports whether login may have code evaluated or approve it on repo. A login the
// forge could not have sent is not trusted, rather than an error to retry.
func (r *Receiver) trusted(ctx context.Context, f forge.Forge, repo forge.Repo, login string) (bool, error) {
	if forge.ValidateLogin(login) != nil {
		return false, nil
	}
	return forge.WriteAccess(ctx, f, repo, login)
}

// waitsForApproval says why a pull request event's head is not evaluated.
func waitsForApproval(ev forge.Event) string {
	pr := ev.PullRequest
	switch {
	case ev.Sender == "" || strings.EqualFold(ev.Sender, pr.Author):
		return fmt.Sprintf("pull request #%d by %s waits for a collaborator's %q", pr.Number, pr.Author, RunCommand)
	case strings.HasPrefix(ev.Action, "synchroniz"): // GitHub "synchronize", Gitea "synchronized"
		return fmt.Sprintf("pull request #%d by %s: a push by %s waits for a collaborator's %q", pr.Number, pr.Author, ev.Sender, RunCommand)
	}
	return fmt.Sprintf("pull request #%d by %s, %s by %s, waits for a collaborator's %q", pr.Number, pr.Author, ev.Action, ev.Sender, RunCommand)
}

// runCommand finds the first "/ci run" line of a comment, and its commit argument ("" if
// none). A line with more than one argument is not the command.
func runCommand(body string) (arg string, ok bool) {
	for line := range strings.Lines(body) {
		f := strings.Fields(line)
		if len(f) < 2 || len(f) > 3 || f[0]+" "+f[1] != RunCommand {
			continue
		}
		if len(f) == 3 {
			return f[2], true
		}
		return "", true
	}
	return "", false
}

// approvedHead is the commit a "/ci run" comment approves, or the reason it approves none:
// the commit it names, which must be one of the pull request's; else the head as the forge
// recorded it with the comment (Gitea's payload); else the head at the comment's time from
// the pull request's commits (GitHub).
func approvedHead(ctx context.Context, f forge.Forge, repo forge.Repo, ev forge.Event, arg string) (sha, reason string, err error) {
	n := ev.PullRequest.Number
	if arg != "" {
		if !commitArgRE.MatchString(arg) {
			return "", fmt.Sprintf("%q argument %q is not a commit id", RunCommand, arg), nil
		}
		commits, err := f.PullRequestCommits(ctx, repo, n)
		if err != nil {
			return "", "", err
		}
		sha, reason = commitNamed(commits, strings.ToLower(arg))
		if reason != "" {
			return "", fmt.Sprintf("%s %s of pull request #%d", arg, reason, n), nil
		}
		return sha, "", nil
	}
	if ev.PullRequest.HeadSHA != "" {
		return ev.PullRequest.HeadSHA, "", nil
	}
	if ev.CommentedAt.IsZero() {
		return "", fmt.Sprintf("the delivery does not say when the comment was written; name the commit: %q <commit>", RunCommand), nil
	}
	commits, err := f.PullRequestCommits(ctx, repo, n)
	if err != nil {
		return "", "", err
	}
	if sha = headAt(commits, ev.CommentedAt); sha == "" {
		return "", fmt.Sprintf("no commit of pull request #%d is older than the comment; name the commit: %q <commit>", n, RunCommand), nil
	}
	return sha, "", nil
}

// commitNamed is the one commit whose id starts with prefix, or why there is none.
func commitNamed(commits []forge.Commit, prefix string) (sha, reason string) {
	for _, c := range commits {
		if !strings.HasPrefix(c.SHA, prefix) || c.SHA == sha {
			continue
		}
		if sha != "" {
			return "", "names more than one commit"
		}
		sha = c.SHA
	}
	if sha == "" {
		return "", "is not a commit"
	}
	return sha, ""
}

// headAt is the pull request's head at time t: the last of its first commits (oldest first)
// that are all dated no later than t. A commit dated later cannot have been there at t, nor
// can anything built on it, whatever its own date says. Commit dates are the committer's
// word: a push made after the comment and dated before it is not told apart, which is why
// "/ci run <commit>" exists.
func headAt(commits []forge.Commit, t time.Time) string {
	head := ""
	for _, c := range commits {
		if c.Time.IsZero() || c.Time.After(t) {
			break
		}
		head = c.SHA
	}
	return head
}
