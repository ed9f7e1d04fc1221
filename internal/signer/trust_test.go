package signer

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/nodetoken"
	"github.com/harmonia-ci/harmonia-ci/internal/signerapi"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// The tests in this file are the attacks of the issue "Trust zones that hold". Before it, every
// node shared one cluster token, and the signer took the caller's word: build-complete named the
// job, the node and the attempt in its body (or no job at all, an "evaluator batch"), and signed
// whatever outputs, references, deriver and log key came with it. A compromised builder could
// therefore sign any store path; each attack below was accepted then. Each must now be refused
// with a 4xx that writes nothing: not an object of the store, not a row.

// TestAuth: every endpoint wants a node token of this cluster, and the role the request acts in.
func TestAuth(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	j := e.enqueueAndClaim(t, "builder-1", fixture("auth", nil))
	o := built(t, outPath("auth"), "auth")
	builder := e.builder(t, "builder-1")
	e.upload(t, builder, signerapi.UploadSlotsRequest{Job: jobClaim(j)}, nil, o)
	ev := e.evaluation(t, "eval-1")
	evaluator := e.evaluator(t, "eval-1")
	src := source(t, "auth-src", "auth")
	e.upload(t, evaluator, signerapi.UploadSlotsRequest{Eval: &ev}, nil, src)

	ticket, err := e.tokens.IssueTicket(nodetoken.Ticket{NodeID: "eval-1", EvalID: ev.ID, Attempt: ev.Attempt, Expires: time.Now().Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	other, err := nodetoken.NewKey("another-cluster-secret-0123456789")
	if err != nil {
		t.Fatal(err)
	}
	otherCluster, err := other.Issue(nodetoken.Identity{NodeID: "builder-1", Roles: []string{config.RoleBuilder}})
	if err != nil {
		t.Fatal(err)
	}
	// The token's mac covers its node and roles: neither can be changed.
	moreRoles := strings.Replace(builder, ":builder:", ":builder,evaluator:", 1)
	otherNode := strings.Replace(builder, ":builder-1:", ":builder-2:", 1)
	unauthenticated := []struct{ name, token string }{
		{"none", ""},
		{"not a token", "garbage"},
		// The old shared secret as a bearer token.
		{"the cluster secret", secret},
		// A token minted by another cluster (or by an attacker with a secret of their own).
		{"another cluster's token", otherCluster},
		{"roles added to a token", moreRoles},
		{"node renamed in a token", otherNode},
	}

	requests := []struct {
		name, path, token string
		body              any
		// wrongRole are tokens of the right node that lack the request's role.
		wrongRole []string
	}{
		{"cache-lookup", "/api/cache-lookup", builder, signerapi.CacheLookupRequest{StorePaths: []string{o.path()}}, nil},
		{"upload-slots of a job", "/api/upload-slots", builder, signerapi.UploadSlotsRequest{Job: jobClaim(j), Outputs: []signerapi.Output{o.out}},
			[]string{e.token(t, "builder-1", config.RoleEvaluator), e.token(t, "builder-1", config.RoleCache)}},
		{"upload-slots of an evaluation", "/api/upload-slots", evaluator, signerapi.UploadSlotsRequest{Eval: &ev, Outputs: []signerapi.Output{src.out}},
			[]string{e.token(t, "eval-1", config.RoleBuilder)}},
		{"publish", "/api/publish", evaluator, signerapi.PublishRequest{Eval: ev, Sources: []signerapi.Output{src.out}},
			[]string{e.token(t, "eval-1", config.RoleBuilder), e.token(t, "eval-1", config.RoleSigner, config.RoleCache)}},
		{"build-complete", "/api/build-complete", builder, complete(j, "", o),
			[]string{e.token(t, "builder-1", config.RoleEvaluator), e.token(t, "builder-1", config.RoleFrontend)}},
		{"eval-ticket", "/api/eval-ticket", evaluator, signerapi.EvalTicketRequest{Eval: ev},
			[]string{e.token(t, "eval-1", config.RoleBuilder), e.token(t, "eval-1", config.RoleFrontend)}},
		{"eval-ticket check", "/api/eval-ticket/check", e.token(t, "front-1", config.RoleFrontend),
			signerapi.CheckTicketRequest{Ticket: ticket},
			[]string{e.token(t, "front-1", config.RoleEvaluator), e.token(t, "front-1", config.RoleBuilder)}},
		{"node-token check", "/api/node-token/check", e.token(t, "cache-1", config.RoleCache),
			signerapi.CheckNodeTokenRequest{Token: builder},
			[]string{e.token(t, "cache-1", config.RoleBuilder), e.token(t, "cache-1", config.RoleFrontend)}},
	}
	for _, r := range requests {
		t.Run(r.name, func(t *testing.T) {
			for _, tok := range unauthenticated {
				before := e.state(t)
				code, body := e.post(t, r.path, tok.token, r.body, nil)
				if code != http.StatusUnauthorized || strings.Contains(body, "http") || strings.Contains(body, o.path()) {
					t.Errorf("%s token: %d %s, want 401 telling nothing", tok.name, code, body)
				}
				e.unchanged(t, before, tok.name+" token")
			}
			for i, tok := range r.wrongRole {
				before := e.state(t)
				if code, body := e.post(t, r.path, tok, r.body, nil); code != http.StatusForbidden || !strings.Contains(body, "may not act as") {
					t.Errorf("token %d without the role: %d %s, want 403", i, code, body)
				}
				e.unchanged(t, before, "a token without the role")
			}
			// The same request with the right token goes through: the refusals were the token's.
			e.mustPost(t, r.path, r.token, r.body, nil)
		})
	}
	if s := jobStatus(t, e.pool, "auth"); s != status.JobSucceeded {
		t.Fatalf("the job is %s after its build-complete, want succeeded", s)
	}
	// A cache node learns a good token's identity, and nothing from a bad one.
	var who signerapi.CheckNodeTokenResponse
	e.mustPost(t, "/api/node-token/check", e.token(t, "cache-1", config.RoleCache), signerapi.CheckNodeTokenRequest{Token: builder}, &who)
	if who.Node != "builder-1" || !slices.Contains(who.Roles, config.RoleBuilder) {
		t.Fatalf("node-token check: %+v, want builder-1 with the builder role", who)
	}
	for _, tok := range unauthenticated {
		if code, body := e.post(t, "/api/node-token/check", e.token(t, "cache-1", config.RoleCache),
			signerapi.CheckNodeTokenRequest{Token: tok.token}, nil); code != http.StatusForbidden {
			t.Errorf("node-token check of %s: %d %s, want 403", tok.name, code, body)
		}
	}
	// Any valid token may look the cache up, a cache node's too.
	var found signerapi.CacheLookupResponse
	e.mustPost(t, "/api/cache-lookup", e.token(t, "cache-1", config.RoleCache), signerapi.CacheLookupRequest{StorePaths: []string{o.path(), src.path()}}, &found)
	if len(found.Present) != 2 {
		t.Fatalf("cache-lookup found %v, want both paths", found.Present)
	}
}

// TestTrustZones: a builder signs only the outputs of the job it holds, with references its
// inputs could give them, its job's derivation as deriver and its job's log; an evaluator only
// content-addressed paths whose address the signer recomputed.
func TestTrustZones(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	// a's inputs: a source the cache has, and a library only the trusted upstream has.
	aSrc := source(t, "a-src", "job a's source")
	upLib := source(t, "upstream-lib", "a library from the upstream cache")
	unrelated := source(t, "unrelated", "cached, but no input of a")
	e.seed(t, aSrc)
	e.seed(t, unrelated)
	e.upstream.serve(t, upLib)

	ja := e.enqueueAndClaim(t, "builder-a", fixture("a", nil, aSrc.path(), upLib.path()))
	jb := e.enqueueAndClaim(t, "builder-b", fixture("b", nil))
	aTok, bTok := e.builder(t, "builder-a"), e.builder(t, "builder-b")
	aRefs := []string{aSrc.path(), upLib.path(), outPath("a")}
	oa := built(t, outPath("a"), "a", aRefs...)
	ob := built(t, outPath("b"), "b")
	e.upload(t, aTok, signerapi.UploadSlotsRequest{Job: jobClaim(ja), Log: logUpload(logKey("a"), []byte("a log"))}, []byte("a log"), oa)
	e.upload(t, bTok, signerapi.UploadSlotsRequest{Job: jobClaim(jb), Log: logUpload(logKey("b"), []byte("b log"))}, []byte("b log"), ob)

	ev := e.evaluation(t, "eval-e")
	eTok := e.evaluator(t, "eval-e")
	honest := source(t, "honest", "an honest source")
	// An input-addressed path (job a's output) uploaded as a "source" with a trojan.
	trojan := built(t, outPath("a"), "trojan")
	// A source path and NAR hash for content Y, with the NAR of content X uploaded.
	lie := source(t, "claimed", "what the path and the NAR hash promise")
	x := source(t, "claimed", "what was uploaded instead")
	lie.out.FileHash, lie.out.FileSize, lie.file = x.out.FileHash, x.out.FileSize, x.file
	e.upload(t, eTok, signerapi.UploadSlotsRequest{Eval: &ev}, nil, honest, trojan, lie)

	// A made-up .drv claimed under job a's .drv path, and under a path of its own name.
	fake := drvText("a", nil, []string{unrelated.path()})
	forged := derivation(t, "a", nil, nil)
	forged.Text = fake

	// The old protocol's build-complete named the node in its body.
	oldStyle, err := json.Marshal(map[string]any{
		"job_id": jb.ID, "node_id": "builder-b", "attempt": jb.Attempt,
		"job":     signerapi.JobClaim{ID: jb.ID, Attempt: jb.Attempt},
		"outputs": []signerapi.Output{ob.out},
	})
	if err != nil {
		t.Fatal(err)
	}
	otherCluster, err := nodetoken.NewKey("another-cluster-secret-0123456789")
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := otherCluster.Issue(nodetoken.Identity{NodeID: "builder-a", Roles: []string{config.RoleBuilder}})
	if err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name    string
		attacks string
		path    string
		token   string
		body    any
		code    int
		want    string
	}{
		// a. Outputs of another job.
		{"another job's output with mine", "sign b's output path with content a's builder chose",
			"/api/build-complete", aTok, complete(ja, "", oa, ob), 400, "is not an output of " + drvPath("a")},
		{"only another job's output", "sign b's output path under a's claim",
			"/api/build-complete", aTok, complete(ja, "", ob), 400, "is not an output of"},
		{"slots for another job's output", "upload for b's output under a's claim",
			"/api/upload-slots", aTok, signerapi.UploadSlotsRequest{Job: jobClaim(ja), Outputs: []signerapi.Output{ob.out}}, 400, "is not an output of"},

		// b. Another node's claim.
		{"another node's job", "complete b, claimed by builder-b, with builder-a's token",
			"/api/build-complete", aTok, complete(jb, "", ob), 409, "is not in building/uploading for node builder-a"},
		{"another node named in the body", "the old protocol: name builder-b in the body to act for its claim",
			"/api/build-complete", aTok, oldStyle, 409, "for node builder-a"},
		{"slots of another node's job", "upload under b's claim with builder-a's token",
			"/api/upload-slots", aTok, signerapi.UploadSlotsRequest{Job: jobClaim(jb), Outputs: []signerapi.Output{ob.out}}, 409, "for node builder-a"},

		// c. Publishing.
		{"builder publishes", "a builder signs .drv files and sources",
			"/api/publish", aTok, signerapi.PublishRequest{Eval: ev, Sources: []signerapi.Output{honest.out}}, 403, "may not act as evaluator"},
		{"another node's evaluation", "publish under an evaluation another evaluator holds",
			"/api/publish", e.evaluator(t, "eval-x"), signerapi.PublishRequest{Eval: ev, Sources: []signerapi.Output{honest.out}}, 409, "is not running for node eval-x"},
		{"forged .drv path", "sign a made-up .drv under job a's .drv path, so builders fetch and build it",
			"/api/publish", eTok, signerapi.PublishRequest{Eval: ev, Derivations: []signerapi.DerivationText{{StorePath: drvPath("a"), Text: fake}}}, 400, "is not the store path of this text"},
		{"forged .drv path of a real name", "sign a made-up .drv under another .drv's true path",
			"/api/publish", eTok, signerapi.PublishRequest{Eval: ev, Derivations: []signerapi.DerivationText{forged}}, 400, "is not the store path of this text"},
		{"input-addressed path as a source", "sign a trojan as job a's output, before or instead of its build",
			"/api/publish", eTok, signerapi.PublishRequest{Eval: ev, Sources: []signerapi.Output{trojan.out}}, 400, "is not the content address of its NAR"},
		{"source NAR not the declared one", "sign a NAR hash the uploaded NAR does not have",
			"/api/publish", eTok, signerapi.PublishRequest{Eval: ev, Sources: []signerapi.Output{lie.out}}, 400, "the uploaded NAR is not the declared one"},
		{"source with a deriver", "sign a source as the output of some derivation",
			"/api/publish", eTok, signerapi.PublishRequest{Eval: ev, Sources: []signerapi.Output{honest.with(nil, drvBase("a")).out}}, 400, "a source has no deriver"},

		// d. References.
		{"reference to an unrelated cached path", "make clients of a's output fetch a path its inputs could not give it",
			"/api/build-complete", aTok, complete(ja, "", oa.with(append(aRefs, unrelated.path()), "")), 400, unrelated.path() + " is neither an output"},
		{"reference to a path not in the cache", "sign a closure the cache cannot serve",
			"/api/build-complete", aTok, complete(ja, "", oa.with([]string{fakePath("nowhere", "nowhere")}, "")), 400, "is neither an output"},
		{"reference to another job's output", "refer to b's output, which a does not depend on",
			"/api/build-complete", aTok, complete(ja, "", oa.with([]string{ob.path()}, "")), 400, "is neither an output"},

		// e. Deriver.
		{"deriver of another job", "sign a's output as b's",
			"/api/build-complete", aTok, complete(ja, "", oa.with(aRefs, drvBase("b"))), 400, "outputs[0].deriver"},
		{"deriver in slots", "the same at upload-slots",
			"/api/upload-slots", aTok, signerapi.UploadSlotsRequest{Job: jobClaim(ja), Outputs: []signerapi.Output{oa.with(aRefs, drvBase("b")).out}}, 400, "outputs[0].deriver"},

		// f. Logs.
		{"log of another job", "overwrite b's log under a's claim",
			"/api/upload-slots", aTok, signerapi.UploadSlotsRequest{Job: jobClaim(ja), Log: logUpload(logKey("b"), []byte("lies"))}, 400, "log.key"},
		{"log of a job I do not hold", "overwrite b's log under b's claim, held by builder-b",
			"/api/upload-slots", aTok, signerapi.UploadSlotsRequest{Job: jobClaim(jb), Log: logUpload(logKey("b"), []byte("lies"))}, 409, "for node builder-a"},
		{"build-complete with another job's log", "make a's log_url point at b's log",
			"/api/build-complete", aTok, complete(ja, logKey("b"), oa), 400, "log_key"},

		// g. Tokens.
		{"another cluster's token", "a token minted with another secret",
			"/api/build-complete", foreign, complete(ja, "", oa), 401, "invalid node token"},
		{"evaluator on build-complete", "an evaluator finishes a build",
			"/api/build-complete", e.token(t, "builder-a", config.RoleEvaluator), complete(ja, "", oa), 403, "may not act as builder"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := e.state(t)
			code, body := e.post(t, c.path, c.token, c.body, nil)
			if code != c.code || !strings.Contains(body, c.want) {
				t.Fatalf("attack (%s): %d %s, want %d naming %q", c.attacks, code, body, c.code, c.want)
			}
			e.unchanged(t, before, c.name)
		})
	}

	// Every refusal above was the attack's: the honest requests of the same world go through.
	// a's output refers to its source (in the cache), to the upstream's library and to itself.
	var resp signerapi.BuildCompleteResponse
	e.mustPost(t, "/api/build-complete", aTok, complete(ja, logKey("a"), oa), &resp)
	e.mustPost(t, "/api/build-complete", bTok, complete(jb, "", ob), &resp)
	e.mustPost(t, "/api/publish", eTok, signerapi.PublishRequest{Eval: ev, Sources: []signerapi.Output{honest.out}}, &resp)
	e.checkNarInfo(t, oa, aRefs, drvBase("a"), "")
	e.checkNarInfo(t, ob, nil, drvBase("b"), "")
	e.checkNarInfo(t, honest, nil, "", "fixed:r:sha256:")
	if got := e.logURL(t, ja); got != logKey("a") {
		t.Fatalf("a's log_url = %q", got)
	}
	if got, _ := e.read(t, logKey("b")); string(got) != "b log" {
		t.Fatalf("b's log is %q, want the one b uploaded", got)
	}
	if e.upstream.asked.Load() == 0 {
		t.Fatal("the upstream was never asked about a's library")
	}
}
