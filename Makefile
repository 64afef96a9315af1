GO        ?= go
BIN       := bin/walcast
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.version=$(VERSION)

.PHONY: build test js-test console js-pack docs bench bench-e2e bench-cost bench-latency demo lint clean

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/walcast

# The whole suite, against a real PostgreSQL 15 the tests start themselves;
# first the browser client's unit tests. The Go suite includes the browser
# test (TestBrowser: Debian's Chromium, see .ci/run) and the check that the
# console bundle committed in fanout/sync/console is fresh.
test: js-test
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 20m ./...

JS := fanout/client/js

# The browser client's unit tests (node's test runner); npm ci when its
# node_modules are missing.
js-test:
	cd $(JS) && { [ -d node_modules ] || npm ci --no-audit --no-fund; } && npm test

# Rebuild the console and client bundle `walcast sync --console` embeds
# (fanout/sync/console); commit the result (TestConsoleBundleFresh checks).
console:
	cd $(JS) && { [ -d node_modules ] || npm ci --no-audit --no-fund; } && node scripts/bundle.mjs

# Pack @walcast/client with the binary's version: a tag v1.2.3 gives 1.2.3,
# anything else 0.0.0-dev.<git describe>. The tree keeps 0.0.0-dev. Works in
# a clean checkout (creates bin/, runs npm ci when node_modules is missing)
# and removes its temporary copy whether or not npm pack succeeds.
js-pack:
	@v='$(VERSION)'; case "$$v" in v[0-9]*.[0-9]*.[0-9]*) v=$${v#v};; *) v=0.0.0-dev.$$(echo "$$v" | tr -c 'A-Za-z0-9.\n-' '-');; esac; \
	mkdir -p $(CURDIR)/bin && d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && \
	{ [ -d $(JS)/node_modules ] || (cd $(JS) && npm ci --no-audit --no-fund); } && \
	cp -r $(JS)/package.json $(JS)/package-lock.json $(JS)/tsconfig.json $(JS)/README.md $(JS)/src $(JS)/console $$d/ && \
	ln -s $(CURDIR)/$(JS)/node_modules $$d/node_modules && \
	(cd $$d && npm pkg set version=$$v && sed -i "s/'0.0.0-dev'/'$$v'/" src/version.ts && npm pack --pack-destination $(CURDIR)/bin)

# Regenerate the command and flag reference from the command tree:
# docs/reference, one page per command. Commit the result;
# TestCommandReference fails while it is stale.
docs:
	$(GO) test ./cmd/walcast -run '^TestCommandReference$$' -count=1 -update-docs

# A throwaway PostgreSQL, walcast verify, walcast run with embedded NATS,
# walcast sync --console (it prints the console's URL and a demo token) and
# walcast tail while the script writes; Ctrl-C stops it all.
# The build says what it is doing: on a cold module and build cache it
# takes minutes (deploy/demo/build.sh).
demo:
	GO='$(GO)' bash deploy/demo/build.sh '$(BIN)' '$(LDFLAGS)'
	bash deploy/demo/demo.sh

# Micro-benchmarks of every package (decode, journal append, ...).
bench:
	$(GO) test -run '^$$' -bench . -skip E2E -benchmem ./...

# End-to-end catch-up of `walcast run` next to pg_recvlogical on the same WAL
# (a durable private PostgreSQL; 1M + 200k rows; about a minute).
bench-e2e:
	$(GO) test ./replication -run '^$$' -bench E2E -skip E2ECost -benchtime 1x -timeout 30m

# What `walcast run` costs the source server while it catches up, for the
# journal in the source database, another database of the same server and
# another server, next to pg_recvlogical on the same WAL: rates, CPU per
# change (walcast, PostgreSQL, the walsender), WAL written per workload
# WAL byte, and the catch-up's WAL by record type and relation
# (pg_walinspect). 1M rows in 1,000-row transactions and 200k single-row
# transactions (WALCAST_BENCH_ROWS, WALCAST_BENCH_SINGLE_ROWS,
# WALCAST_BENCH_PLACEMENTS; see replication/cost_bench_test.go). About
# fifteen minutes; docs/performance.md holds a run.
bench-cost:
	$(GO) test ./replication -run '^$$' -bench E2ECost -benchtime 1x -timeout 90m

# Commit→NATS and commit→socket latency of the whole pipeline under a steady
# load: pgbench commits single-row transactions into a durable private
# PostgreSQL, the real `walcast run` (embedded NATS) and `walcast sync`
# processes carry them to 200 WebSocket clients; prints p50/p99/max and each
# process's CPU per rate (WALCAST_BENCH_RATES, default 1000,2500;
# WALCAST_BENCH_SOCKETS, WALCAST_BENCH_SECONDS; see
# cmd/walcast/latency_pipeline_bench_test.go). About a minute.
bench-latency:
	$(GO) test ./cmd/walcast -run '^$$' -bench E2EPipelineLatency -benchtime 1x -timeout 30m

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

clean:
	rm -rf bin
	$(GO) clean -testcache
