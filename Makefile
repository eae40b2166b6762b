# inplaced — see README.md. Everything a fresh machine needs is installed by
# hack/install-deps.sh, which every test target runs first.
SHELL := /bin/bash
GO ?= go
OUT := $(CURDIR)/_output
BIN := $(OUT)/bin
# Caches (each overridable; hack/install-deps.sh lists them, with Go's and apt's).
export INPLACED_TOOLS ?= /var/cache/inplaced/tools
export INPLACED_VM_CACHE ?= /var/cache/inplaced/vm
export INPLACED_BIN := $(BIN)
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X github.com/inplaced/inplaced/pkg/version.Version=$(VERSION) -X github.com/inplaced/inplaced/pkg/version.Commit=$(COMMIT)
E2E_TIMEOUT ?= 60m

.PHONY: all build release image deps test test-unit test-arm64 test-e2e test-soak-short test-node test-compat conformance bench soak demo docs docs-check proto proto-check vet clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/inplaced ./cmd/inplaced
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/inplacectl ./cmd/inplacectl
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/kubectl-inplace ./cmd/kubectl-inplace
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/inplaced-installer ./cmd/inplaced-installer

# make release: every binary that ships, static, for each platform, in
# _output/release/<version>/<name>-<os>-<arch>, with SHA256SUMS
# (sha256sum -c SHA256SUMS checks them). A name whose cmd/ directory does
# not exist (yet) is left out; a new binary that ships is one more word in
# RELEASE_CMDS.
RELEASE_CMDS := inplaced inplacectl kubectl-inplace inplaced-installer
RELEASE_PLATFORMS := linux/amd64 linux/arm64
RELEASE_DIR := $(OUT)/release/$(VERSION)
release_cmds = $(filter $(notdir $(wildcard cmd/*)),$(RELEASE_CMDS))
release:
	rm -rf $(RELEASE_DIR) && mkdir -p $(RELEASE_DIR)
	set -e; for p in $(RELEASE_PLATFORMS); do for c in $(release_cmds); do \
	  echo "release: $$c $$p"; \
	  CGO_ENABLED=0 GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(RELEASE_DIR)/$$c-$${p%/*}-$${p#*/} ./cmd/$$c; \
	done; done
	cd $(RELEASE_DIR) && sha256sum -- *-* > SHA256SUMS && cat SHA256SUMS

# make image: an OCI image index (the platforms of make release) of the
# binaries in IMAGE_CMDS at /usr/local/bin and the host files under
# /opt/inplaced, built without a container engine (hack/image), written to
# the OCI layout IMAGE_LAYOUT tagged with the version, and pushed to IMAGE
# when given: make image IMAGE=registry.local:5000/inplaced:v1 (add
# IMAGE_INSECURE=1 for a registry on plain HTTP). The installer, when it
# exists, is the entrypoint. File times are the commit's time, so one
# commit gives one digest.
IMAGE_CMDS := inplaced inplacectl inplaced-installer
IMAGE_LAYOUT ?= $(OUT)/image
IMAGE ?=
IMAGE_INSECURE ?=
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
image_cmds = $(filter $(release_cmds),$(IMAGE_CMDS))
image: release
	$(GO) run ./hack/image -bin-dir $(RELEASE_DIR) -platforms '$(RELEASE_PLATFORMS)' -bins '$(image_cmds)' \
	  $(if $(filter inplaced-installer,$(image_cmds)),-entrypoint inplaced-installer) \
	  -version $(VERSION) -commit $(COMMIT) -created $(SOURCE_DATE_EPOCH) -layout $(IMAGE_LAYOUT) \
	  $(if $(IMAGE),-push $(IMAGE)) $(if $(IMAGE_INSECURE),-insecure)

deps:
	hack/install-deps.sh

vet:
	$(GO) vet ./...
	@out=$$(gofmt -l cmd pkg test hack); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# make test: unit tests, the generated-code drift check, then e2e against a
# private containerd 2.4 and containerd 1.6 (both), loopback registry and CNI,
# and a real kubelet for the coherence tests, the 5-minute soak (one backend,
# each fault once), then the node guest.
test: deps build proto-check vet test-unit test-arm64 test-e2e test-soak-short test-node
# Inside CI's 90 minutes on a fresh machine, make test boots the guest once,
# on Debian's own containerd 1.6 (the node a distribution gives); make
# test-node alone boots it on both. The guest's image is built while
# OpenKruise and k3s compile (hack/install-deps.sh).
test: NODE_BACKENDS = 1.6
test: VM_IMAGE = 1
VM_IMAGE ?= 0

test-unit:
	$(GO) test -count=1 -race ./pkg/... ./cmd/... ./hack/... ./test/docs/ ./test/codecheck/

# make test-arm64: the unit tests built for linux/arm64 and run here under
# qemu-user (Debian's qemu-user-static, installed by hack/install-deps.sh),
# called through go test -exec: no binfmt_misc registration needed. No
# -race: it needs cgo, and a cross build has none; no vet: make vet ran it
# on the same code. -tags qemu_user leaves out the tests that need what
# qemu-user does not translate (pkg/hold's network namespace tests:
# sock_diag and nfnetlink). The relay's second pass through grpc-go's
# server (TestThroughGRPCServer) re-executes the test binary, which needs
# binfmt_misc: it is skipped; it is grpc-go's code, the same on every
# architecture, and test-unit runs it.
# Every package under pkg/ takes part but these (each tested natively by
# test-unit):
#   pkg/kubeclient  its tests compare its requests with client-go's, the
#                   same on every architecture, and client-go would be a
#                   third of the arm64 build;
#   pkg/takeover    its tests run runc containers, seccomp user notification
#                   and pidfd_getfd, none of which qemu-user translates (the
#                   seccomp syscalls answer ENOSYS), and re-execute the test
#                   binary; its syscall tables (internal/seccomp) take part.
# Of cmd/, inplacectl: inplaced's tests re-execute the test binary as the
# daemon; kubectl-inplace's and inplaced-installer's are API machinery and
# chart rendering, the same on every architecture.
# docs/performance.md has the time it takes.
ARM64_TEST_PKGS = $(filter-out %/pkg/kubeclient %/pkg/takeover,$(shell $(GO) list ./pkg/...)) ./cmd/inplacectl
test-arm64:
	@command -v qemu-aarch64-static >/dev/null || { echo "no qemu-aarch64-static: run hack/install-deps.sh"; exit 1; }
	GOARCH=arm64 CGO_ENABLED=0 $(GO) test -count=1 -vet=off -tags qemu_user -exec qemu-aarch64-static \
	  -skip '^TestThroughGRPCServer$$' $(ARM64_TEST_PKGS)

test-e2e: build
	INPLACED_WITH_KUBELET=1 INPLACED_WITH_VM_IMAGE=$(VM_IMAGE) hack/install-deps.sh --no-apt
	env -u SOAK_DURATION $(GO) test -p 1 -count=1 -timeout $(E2E_TIMEOUT) -v ./test/... 2>&1 | tee $(OUT)/e2e.log | grep -E '^(=== RUN|\s*--- (FAIL|SKIP)|--- |PASS|FAIL|ok|panic|\s+\S+\.go:[0-9]+:)' ; rc=$${PIPESTATUS[0]}; [ $$rc = 0 ] || hack/fail-excerpt.sh $(OUT)/e2e.log; exit $$rc

# The node guest (docs/node.md): Debian 12 under QEMU (TCG) with systemd as
# PID 1, cgroup v2, containerd with SystemdCgroup = true and kubelet with the
# systemd cgroup driver, registered as a Node to a kube-apiserver the test
# starts on the host (the guest's only network); inplaced installed as the
# README says. The image is built once by hack/vm/build-image.sh and cached
# under $(INPLACED_VM_CACHE).
# The guest's output and console stay in _output/node-*.log.
NODE_TIMEOUT ?= 70m
NODE_BACKENDS ?= 2.4 1.6
test-node: build
	INPLACED_WITH_KUBELET=1 hack/install-deps.sh --no-apt
	INPLACED_NODE=1 INPLACED_NODE_BACKENDS="$(NODE_BACKENDS)" INPLACED_NODE_LOG_DIR=$(OUT) $(GO) test -count=1 -timeout $(NODE_TIMEOUT) -v ./test/node/ 2>&1 | tee $(OUT)/node.log | grep -E '^(guest\| )?(=== RUN|\s*--- (FAIL|SKIP)|--- |PASS|FAIL|ok|panic|\[node\]|\s+\S+\.go:[0-9]+:)' ; rc=$${PIPESTATUS[0]}; [ $$rc = 0 ] || hack/fail-excerpt.sh $(OUT)/node.log; exit $$rc

# The same e2e suite against Debian's containerd 1.6 only.
test-compat: deps build
	INPLACED_BACKENDS=containerd-1.6 $(GO) test -count=1 -timeout $(E2E_TIMEOUT) -v ./test/e2e/...

conformance: deps build
	hack/conformance.sh

bench: deps build
	hack/bench.sh

# The soak (test/soak, docs/reliability.md): a registered kubelet with
# SOAK_PODS pods (110) through inplaced in Kubernetes mode, churn and faults
# for SOAK_DURATION on each backend of INPLACED_BACKENDS (default: both), the
# invariants checked all along; a report per backend in _output/soak-<backend>.md.
SOAK_DURATION ?= 30m
SOAK_TIMEOUT ?= 6h
soak: deps build
	INPLACED_WITH_KUBELET=1 hack/install-deps.sh --no-apt
	SOAK_DURATION=$(SOAK_DURATION) SOAK_REPORT_DIR=$(OUT) $(GO) test -count=1 -timeout $(SOAK_TIMEOUT) -v -run TestSoak ./test/soak/ 2>&1 | tee $(OUT)/soak.log | grep -E '^(=== RUN|\s*--- (FAIL|SKIP)|--- |PASS|FAIL|ok|panic|\s+\S+\.go:[0-9]+:)' ; rc=$${PIPESTATUS[0]}; [ $$rc = 0 ] || hack/fail-excerpt.sh $(OUT)/soak.log; exit $$rc

# make test's soak: 5 minutes on containerd 2.4 with 110 pods, each fault once
# (about 7 minutes in all: docs/reliability.md).
test-soak-short: build
	INPLACED_WITH_KUBELET=1 hack/install-deps.sh --no-apt
	SOAK_DURATION=5m SOAK_PODS=110 INPLACED_BACKENDS=containerd-2.4 SOAK_REPORT_DIR=$(OUT) $(GO) test -count=1 -timeout 30m -v -run TestSoak ./test/soak/ 2>&1 | tee $(OUT)/soak-short.log | grep -E '^(=== RUN|\s*--- (FAIL|SKIP)|--- |PASS|FAIL|ok|panic|\s+\S+\.go:[0-9]+:)' ; rc=$${PIPESTATUS[0]}; [ $$rc = 0 ] || hack/fail-excerpt.sh $(OUT)/soak-short.log; exit $$rc

demo: deps build
	@set -o pipefail; $(GO) test -count=1 -v -run TestDemo ./test/demo/ 2>&1 | sed -e 's/^    demo_test.go:[0-9]*: /==> /' -e '/^=== RUN/d'

proto:
	hack/gen-proto.sh

# docs/*.dot → docs/*.svg (Graphviz from Debian); docs-check fails when a
# committed SVG is not what its source renders to. Not part of make test:
# Graphviz's output depends on its version and the fonts installed, which a
# fresh CI machine need not share with the one that rendered it.
docs:
	hack/render-docs.sh

docs-check:
	@hack/render-docs.sh --check

# Regenerates into a scratch copy and fails when the committed code differs.
proto-check:
	@tmp=$$(mktemp -d) && cp -r proto $$tmp/orig && hack/gen-proto.sh && \
	  if ! diff -r $$tmp/orig proto >/dev/null; then diff -r $$tmp/orig proto | head -20; rm -rf proto && cp -r $$tmp/orig proto; rm -rf $$tmp; \
	    echo "generated code in proto/ is out of date: run make proto and commit"; exit 1; fi; rm -rf $$tmp; echo "proto: generated code up to date"

clean:
	rm -rf $(OUT)
