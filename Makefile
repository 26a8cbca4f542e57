GO           ?= go
TEST_TIMEOUT ?= 14m
# -race and the sqlite driver need cgo.
export CGO_ENABLED := 1

.PHONY: test deps vet bench bench-quick bench-long

## test: install what is missing, vet, and run every test with -race against real redis-server processes.
test: deps vet
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...
	@if [ -f benchmarks/go.mod ]; then cd benchmarks && $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...; fi
	@if [ -f benchmarks/Makefile.inc ]; then $(MAKE) --no-print-directory bench-quick; fi

deps:
	@./internal/tools/deps.sh

vet:
	$(GO) vet ./...
	@if [ -f benchmarks/go.mod ]; then cd benchmarks && $(GO) vet ./...; fi

-include benchmarks/Makefile.inc
