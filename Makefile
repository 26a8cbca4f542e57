GO           ?= go
TEST_TIMEOUT ?= 14m
# -race and the sqlite driver need cgo.
export CGO_ENABLED := 1

SOAK         ?= 10m
SOAK_TIMEOUT ?= 3h

.PHONY: test deps vet lint soak gen-long bench bench-quick bench-long

## test: install what is missing, vet, lint, and run every test with -race against real redis-server processes.
test: deps vet lint
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...
	@if [ -f benchmarks/go.mod ]; then cd benchmarks && $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...; fi
	cd cgotel && $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...
	@if [ -f benchmarks/Makefile.inc ]; then $(MAKE) --no-print-directory bench-quick; fi

## soak: the end-to-end fleet suite for $(SOAK) under a random fault schedule (its seed is
## printed; FLEET_SEED=n replays it, FLEET_DB=postgres runs it on PostgreSQL), then its table.
soak: deps
	FLEET_SOAK=$(SOAK) $(GO) test -race -count=1 -v -run '^TestFleetSoak$$' -timeout $(SOAK_TIMEOUT) ./internal/fleet/

## gen-long: every randomized state-machine test (internal/testing/gen) with 20× its make-test budget.
gen-long: deps
	CACHEGUARD_GEN_SCALE=$${CACHEGUARD_GEN_SCALE:-20} $(GO) test -race -count=1 -run 'Gen' -timeout 3h ./...

deps:
	@./internal/tools/deps.sh

vet:
	$(GO) vet ./...
	@if [ -f benchmarks/go.mod ]; then cd benchmarks && $(GO) vet ./...; fi
	cd cgotel && $(GO) vet ./...

## lint: staticcheck and errcheck (golangci-lint's default linters besides vet), pinned, through the Go module proxy.
lint:
	@./internal/tools/lint.sh

-include benchmarks/Makefile.inc

## cachetests: the HTTP caching conformance suite (github.com/http-tests/cache-tests) run through
## ginmw.Cache; CACHE_TESTS is the path of its checkout, with `npm i --omit=dev` run in it. Not run by CI.
.PHONY: cachetests
cachetests:
	@test -n "$(CACHE_TESTS)" || { echo 'set CACHE_TESTS=/path/to/cache-tests (git clone https://github.com/http-tests/cache-tests; npm i --omit=dev)'; exit 2; }
	CACHE_TESTS=$(abspath $(CACHE_TESTS)) $(GO) test -count=1 -v -timeout 15m -run '^TestConformance$$' ./internal/testing/cachetests/
