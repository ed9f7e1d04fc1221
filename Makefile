# harmonia-ci — `make help` lists the targets.
GO      ?= go
BIN     ?= bin/harmonia-ci
PKGS    ?= ./...
TIMEOUT ?= 25m
# The suites that touch Nix, which `make test` runs a second time against Nix 2.26 in the
# Debian 13 root that scripts/deps.sh makes (scripts/nix-root.sh enters it): the packages, and
# the multi-process tests that evaluate, build, publish and substitute.
NIX_PKGS ?= ./internal/workerproto ./internal/nix ./internal/substitute ./internal/eval \
	./internal/builder ./internal/upload ./internal/cache ./internal/signer
NIX_E2E  ?= ^Test(Attack|Build|PublishAndSubstitute|SignerFailover|Deps|TwoEvaluators|EvalCLI|GC|NixDaemon|Reevaluate|Run)

.PHONY: help assets build example example-failing up test test-nix-2.26 test-race vet fmt lint clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

assets: ## fetch the web UI's pinned, checksum-checked HTMX from npm (embedded by the build)
	scripts/assets.sh

build: assets ## build bin/harmonia-ci
	$(GO) build -o $(BIN) ./cmd/harmonia-ci

example: ## install what is missing, build, and build the example project with `harmonia-ci run`
	scripts/deps.sh run
	$(MAKE) build
	$(BIN) run examples/dag

example-failing: ## build examples/failing, what a failure looks like: run exits 1 by design, the target then succeeds
	scripts/deps.sh run
	$(MAKE) build
	@$(BIN) run examples/failing; code=$$?; \
	echo "harmonia-ci run exited $$code (1 expected: the example fails on purpose)"; test $$code -eq 1

up: ## install what is missing, build, and run a single-node cluster on the embedded database
	scripts/deps.sh run
	$(MAKE) build
	$(BIN) up

test: ## install what is missing, then run vet and the whole test suite against real PostgreSQL, Nix 2.8 and Nix 2.26
	scripts/deps.sh test
	scripts/assets.sh
	$(GO) vet $(PKGS)
	$(GO) test -count=1 -timeout $(TIMEOUT) $(PKGS)
	$(MAKE) --no-print-directory test-nix-2.26

test-nix-2.26: ## run the suites that touch Nix again, against Nix 2.26 in the Debian 13 root
	scripts/deps.sh nix-root
	scripts/nix-root.sh --skip-unavailable go test -count=1 -timeout $(TIMEOUT) $(NIX_PKGS)
	scripts/nix-root.sh --skip-unavailable go test -count=1 -timeout $(TIMEOUT) -run '$(NIX_E2E)' ./e2e

test-race: ## the test suite under the race detector
	scripts/deps.sh test
	scripts/assets.sh
	$(GO) test -race -count=1 -timeout $(TIMEOUT) $(PKGS)

fmt: ## gofmt every Go file in place
	gofmt -w $$(git ls-files '*.go')

lint: ## gofmt and go vet, failing on any finding
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet $(PKGS)

clean: ## remove build output
	rm -rf bin
