# edgehub: the two commands of the README, and the steps they stand on.
#   make run    set up .venv and start the hub on its embedded defaults ($upstream lands in ./data/landing)
#   make ingest run the Spark job once over ./data/landing into ./data/lake and print what the tables hold
#   make demo   devices -> hub -> 64 kbit/s link with a 60 s outage -> landing -> Spark; a table and demo-out/demo.png
#   make test   set up .venv (and the Debian packages the tests need, the Azure IoT device SDK's own venv and the
#               Node SDK's node_modules),
#               then lint, type-check, check the layer contracts, build the docs, run the whole suite, and run
#               the hub on aarch64 (what CI runs)
#   make check  the quick loop: lint, types, contracts, docs, and the tests that need no Spark, no subprocess hub,
#               no foreign client or broker and no root (all but the folders in OUTSIDE_CHECK), on 2 workers
#   make test-arm64  the hub on aarch64 under qemu-user in an arm64 Debian root, MQTT and AMQP (docs/development.md;
#               needs root; ~15 minutes the first time on a fresh machine, 8 of them building python-qpid-proton,
#               then the root and that wheel cached in ~/.cache/edgehub-arm64: ~45 s)
# To add a Python dependency: pyproject.toml. To add a Debian package: APT_PACKAGES below. Nothing else.

PYTHON      ?= $(shell command -v python3.11 || command -v python3)
VENV        := .venv
BIN         := $(VENV)/bin
STAMP       := $(VENV)/.installed
EXTRAS      := dev,spark,demo,docs
# Debian packages the tests need: Mosquitto (the peer broker and its clients), iproute2 (tc, netns), valgrind
# (bench.instructions' callgrind, run at its smoke size in tests/bench), and what python-qpid-proton's build needs
# (PyPI has no Linux wheel for it): a C compiler, Python's headers, OpenSSL's headers and pkg-config (the AMQP head
# does its own SASL, so libsasl2-dev is not needed). Not rabbitmq-server: bench.ingest's optional peer, which
# brings Erlang (21 packages, 35 MB to fetch) and takes seconds to start in every run; the benchmarks report null
# figures for it where it is missing.
APT_PACKAGES := mosquitto mosquitto-clients iproute2 valgrind openssl gcc python3-dev libssl-dev pkg-config tinyproxy
PYTEST_ARGS ?=
# The test folders `make check` leaves out, each for what its tests need: a hub or SDK in a subprocess (e2e), a
# foreign client or broker (interop), root for mounts, network namespaces and tc (privileged), Spark and Java
# (spark_upload), the benchmarks at their smoke size (bench). `make test` runs every folder.
OUTSIDE_CHECK := tests/e2e tests/interop tests/privileged tests/spark_upload tests/bench
CHECK_WORKERS ?= 2
# The Azure IoT device SDK for Python, for the interop tests (tests/e2e/test_azure_sdk.py). It pins paho-mqtt<2
# and edgehub uses 2.x, so it has a venv of its own, which the tests run as a subprocess.
SDK_VENV    := .venv-azure-sdk
SDK_STAMP   := $(SDK_VENV)/.installed
SDK_PACKAGE := azure-iot-device>=2.12,<3
# The Azure IoT device SDK for Node (its Amqp and Mqtt transports), for tests/e2e/test_node_sdk.py: versions pinned
# in the lockfile, installed by `npm ci` into tests/e2e/node_sdk/node_modules (ignored). Node and npm are installed
# from Debian where the commands are missing (checked by command, not by package: NodeSource's nodejs bundles npm,
# and Debian's npm package would fight it). Debian 12's node 18 runs this SDK (some of its @azure dependencies ask
# for node 20, which npm only warns about).
NODE_SDK_DIR   := tests/e2e/node_sdk
NODE_SDK_STAMP := $(NODE_SDK_DIR)/node_modules/.installed

DATA        ?= data

.PHONY: run ingest demo docs test check test-arm64 venv sdk-venv node-sdk apt lint typecheck contracts pytest pytest-check bench clean

run: $(STAMP)
	$(BIN)/edgehub run --data-dir $(DATA)

ingest: $(STAMP)
	$(BIN)/python -m spark_upload.report --landing $(DATA)/landing --lake $(DATA)/lake --checkpoint $(DATA)/checkpoint

# The documentation site (mkdocs.yml, docs/): --strict makes a broken link or a page left out of nav an error.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir build/site

# Mosquitto plays the cloud broker (apt); matplotlib draws the PNG (the `demo` extra, in EXTRAS).
demo: apt $(STAMP)
	$(BIN)/python -m bench.demo --out demo-out

test: apt $(STAMP) lint typecheck contracts docs pytest test-arm64

check: $(STAMP) lint typecheck contracts docs pytest-check

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $(STAMP)

sdk-venv: $(SDK_STAMP)

$(SDK_STAMP):
	$(PYTHON) -m venv $(SDK_VENV)
	$(SDK_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(SDK_VENV)/bin/python -m pip install --quiet '$(SDK_PACKAGE)'
	touch $(SDK_STAMP)

node-sdk: $(NODE_SDK_STAMP)

$(NODE_SDK_STAMP): $(NODE_SDK_DIR)/package.json $(NODE_SDK_DIR)/package-lock.json
	@missing=""; command -v node >/dev/null || missing="nodejs"; command -v npm >/dev/null || missing="$$missing npm"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	cd $(NODE_SDK_DIR) && npm ci --no-audit --no-fund --loglevel=error
	touch $(NODE_SDK_STAMP)

# Installs only what is missing, so a developer machine that has it all is not touched.
apt:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

contracts: $(STAMP)
	$(BIN)/lint-imports

pytest: $(STAMP) $(SDK_STAMP) $(NODE_SDK_STAMP)
	$(BIN)/pytest $(PYTEST_ARGS)

pytest-check: $(STAMP)
	$(BIN)/pytest -n $(CHECK_WORKERS) $(addprefix --ignore=,$(OUTSIDE_CHECK)) $(PYTEST_ARGS)

# binfmt_misc and chroot need root, as apt does.
test-arm64:
	@SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; $$SUDO hardware/arm64/test-arm64.sh

clean:
	rm -rf $(VENV) $(SDK_VENV) $(NODE_SDK_DIR)/node_modules build *.egg-info .mypy_cache .pytest_cache .ruff_cache
