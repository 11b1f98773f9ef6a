# moat: make demo runs the lab demo, make test runs every test. Both install
# what they need first (scripts/setup.sh, Debian 12, as root).
SHELL := /bin/bash
export PATH := /usr/local/go/bin:/usr/local/bin:$(PATH)
export GOFLAGS := -buildvcs=false

BIN := bin/moat

.PHONY: all deps build generate test demo bench clean

all: build

deps:
	@bash scripts/setup.sh

build: deps
	go build -o $(BIN) ./cmd/moat
	go build -o bin/moat-demo ./cmd/moat-demo

# The generated bindings are committed; regenerate after changing bpf/.
generate: deps
	MOAT_SETUP_GENERATE=1 bash scripts/setup.sh
	go generate ./...

test: build
	go vet ./...
	go test -count=1 -timeout 15m ./...

demo: build
	./bin/moat-demo

bench: build
	MOAT_SETUP_BENCH=1 bash scripts/setup.sh
	go run ./cmd/moat-bench -out bench

clean:
	rm -rf bin
