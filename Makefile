GO        ?= go
BIN       := bin/walcast
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.version=$(VERSION)

.PHONY: build test bench bench-e2e demo lint clean

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/walcast

# The whole suite, against a real PostgreSQL 15 the tests start themselves.
test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 20m ./...

# A throwaway PostgreSQL, walcast verify, walcast run with embedded NATS and
# walcast tail while the script writes; Ctrl-C stops it all.
demo: build
	bash deploy/demo/demo.sh

# Micro-benchmarks of every package (decode, journal append, ...).
bench:
	$(GO) test -run '^$$' -bench . -skip E2E -benchmem ./...

# End-to-end catch-up of `walcast run` next to pg_recvlogical on the same WAL
# (a durable private PostgreSQL; 1M + 200k rows; about a minute).
bench-e2e:
	$(GO) test ./replication -run '^$$' -bench E2E -benchtime 1x -timeout 30m

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

clean:
	rm -rf bin
	$(GO) clean -testcache
