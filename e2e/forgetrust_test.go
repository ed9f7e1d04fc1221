package e2e

import (
	"context"
	"fmt"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/giteatest"
)

// Trust against a real Gitea, through real frontends: a read-only collaborator's pull request
// and "/ci run" evaluate nothing; a push to a trusted author's pull request by someone else
// waits for an approval; "/ci run <commit>" evaluates that commit and not the later head.
func TestGiteaForgeTrust(t *testing.T) {
	c := newForgeCluster(t, forgeOptions{})
	ctx := context.Background()
	salt := uniqueSalt(t)
	users := map[string]giteatest.User{}
	for _, name := range []string{"bob", "carol", "mallory"} {
		u, err := c.gitea.CreateUser(ctx, giteatest.UniqueName(name))
		if err != nil {
			t.Fatal(err)
		}
		users[name] = u
	}
	bob, carol, mallory := users["bob"], users["carol"], users["mallory"]
	for login, perm := range map[string]string{bob.Login: "write", carol.Login: "read"} {
		if err := c.gitea.AddCollaborator(ctx, c.repo, login, perm); err != nil {
			t.Fatal(err)
		}
	}
	c.enable(nil)

	// openPR forks the repository as author, commits on the fork's main (which has the
	// repository's history, so the pull request has a merge base) and opens a pull request.
	openPR := func(author giteatest.User) (giteatest.Repo, string, int) {
		t.Helper()
		fork, err := c.gitea.Fork(ctx, c.repo, author)
		if err != nil {
			t.Fatal(err)
		}
		head := c.push(author, fork, "main", map[string]string{"ci.nix": okNix(salt + "-" + author.Login)}, false)
		n, err := c.gitea.CreatePullRequest(ctx, author, c.repo, "main", fork, "main", "a change by "+author.Login)
		if err != nil {
			t.Fatal(err)
		}
		return fork, head, n
	}

	// A read-only collaborator is not trusted: neither their pull request nor their approval.
	_, carolHead, carolPR := openPR(carol)
	c.waitLog("front-1", fmt.Sprintf("pull request #%d by %s waits for a collaborator", carolPR, carol.Login), 1)
	if err := c.gitea.Comment(ctx, c.repo, carol, carolPR, "/ci run"); err != nil {
		t.Fatal(err)
	}
	c.waitLog("front-1", fmt.Sprintf("\\\"/ci run\\\" by %s ignored: not a collaborator", carol.Login), 1)
	if n := c.evaluations(carolHead); n != 0 {
		t.Fatalf("a read-only collaborator's pull request was evaluated (%d evaluations)", n)
	}

	// A writer's pull request is evaluated...
	bobFork, b1, bobPR := openPR(bob)
	c.evalOf(b1, fmt.Sprintf("pull/%d", bobPR))
	// ...but pushes to its branch by someone else (here a collaborator of bob's fork) are not.
	if err := c.gitea.AddCollaborator(ctx, bobFork, mallory.Login, "write"); err != nil {
		t.Fatal(err)
	}
	b2 := c.push(mallory, bobFork, "main", map[string]string{"ci.nix": okNix(salt + "-m2")}, false)
	b3 := c.push(mallory, bobFork, "main", map[string]string{"ci.nix": okNix(salt + "-m3")}, false)
	c.waitLog("front-1", fmt.Sprintf("pull request #%d by %s: a push by %s waits for a collaborator", bobPR, bob.Login, mallory.Login), 2)
	if n := c.evaluations(b2) + c.evaluations(b3); n != 0 {
		t.Fatalf("a stranger's push to a trusted author's pull request was evaluated (%d evaluations)", n)
	}

	// "/ci run <commit>" by the owner evaluates that commit of the pull request, not its head.
	if err := c.gitea.Comment(ctx, c.repo, c.owner, bobPR, "Only the first of these:\n/ci run "+b2[:12]+"\n"); err != nil {
		t.Fatal(err)
	}
	c.evalOf(b2, fmt.Sprintf("pull/%d", bobPR))
	if n := c.evaluations(b3); n != 0 {
		t.Fatalf("the head after the named commit was evaluated (%d evaluations)", n)
	}
}
