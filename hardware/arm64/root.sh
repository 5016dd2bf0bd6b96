#!/usr/bin/env bash
# An arm64 Debian root that runs edgehub on its own aarch64 wheels, on an x86-64 host, through qemu-user.
#
#   hardware/arm64/root.sh            make (or reuse) the root; print its path on the last line
#
# Idempotent, and each step is skipped when already done, so `make test-arm64` pays for the root once:
#   1. Debian's qemu-user-static, mmdebstrap and arch-test (which mmdebstrap needs for --arch), from apt, if missing.
#   2. binfmt_misc mounted, and qemu-user-static's aarch64 entry (/usr/lib/binfmt.d/qemu-aarch64.conf) written to
#      its register file: the kernel then runs any aarch64 ELF through /usr/libexec/qemu-binfmt/aarch64-binfmt-P.
#      The entry has the F flag (the interpreter is opened when registered), so it works inside a chroot too.
#   3. `mmdebstrap --arch=arm64` bookworm with Python 3.11 into $EDGEHUB_ARM64_CACHE/root
#      (default ~/.cache/edgehub-arm64, outside the git tree), with the host's CA bundle, pip configuration,
#      resolv.conf and an /etc/hosts naming localhost copied in (package installs go the way they go on the host).
#   4. A venv at /opt/edgehub in the root with edgehub's dependencies from pyproject.toml as aarch64 wheels
#      (rocksdict, msgspec, uvloop, cryptography, pydantic-core, ...), redone when those dependencies change.
#   5. python-qpid-proton (the AMQP head's engine), which PyPI has as an sdist only: built once into an aarch64
#      wheel in the root (gcc, python3-dev, libssl-dev and pkg-config installed there for it), the wheel kept in
#      $EDGEHUB_ARM64_CACHE/wheels beside the root, so a remade root or venv installs it without building again.
# Root is needed (binfmt_misc, chroot).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="${EDGEHUB_ARM64_CACHE:-$HOME/.cache/edgehub-arm64}"
root="$cache/root"
suite=bookworm
mirror="${EDGEHUB_ARM64_MIRROR:-http://deb.debian.org/debian}"

step() { printf 'arm64: %s (%ds)\n' "$*" "$SECONDS" >&2; }

if [ "$(id -u)" != 0 ]; then
  echo "arm64: needs root (binfmt_misc registration and chroot)" >&2
  exit 2
fi

# 1. the tools: arch-test is only a Recommends of mmdebstrap, which needs it for a foreign architecture
missing=""
command -v mmdebstrap >/dev/null || missing="$missing mmdebstrap"
command -v arch-test >/dev/null || missing="$missing arch-test"
[ -e /usr/lib/binfmt.d/qemu-aarch64.conf ] || missing="$missing qemu-user-static"
if [ -n "$missing" ]; then
  step "installing$missing"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# 2. binfmt_misc and the aarch64 entry
binfmt=/proc/sys/fs/binfmt_misc
if [ ! -e "$binfmt/register" ]; then
  step "mounting binfmt_misc"
  mount -t binfmt_misc binfmt_misc "$binfmt"
fi
if [ ! -e "$binfmt/qemu-aarch64" ]; then
  step "registering qemu-aarch64 with binfmt_misc"
  grep -v '^#' /usr/lib/binfmt.d/qemu-aarch64.conf | grep . > "$binfmt/register"
fi
grep -q '^enabled' "$binfmt/qemu-aarch64" || { echo "arm64: the qemu-aarch64 binfmt entry is disabled" >&2; exit 1; }

# 3. the Debian root
if [ ! -e "$root/.edgehub-root-ok" ]; then
  step "making the arm64 Debian root in $root"
  rm -rf "$root"
  mkdir -p "$cache"
  mmdebstrap --quiet --arch=arm64 --variant=apt \
    --include=python3,python3-venv,ca-certificates \
    --aptopt='Acquire::Check-Valid-Until "false"' \
    "$suite" "$root" "$mirror"
  touch "$root/.edgehub-root-ok"
fi
# refreshed every time: cheap, and the host's may have changed
install -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
[ -e /etc/resolv.conf ] && cp -L /etc/resolv.conf "$root/etc/resolv.conf"
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' > "$root/etc/hosts"
[ -e /etc/pip.conf ] && install -m 0644 /etc/pip.conf "$root/etc/pip.conf"
if [ -e "$HOME/.config/pip/pip.conf" ]; then
  # without the host's local wheel folders and file:// indexes: they are not in the root (and hold x86-64 wheels)
  mkdir -p "$root/root/.config/pip"
  grep -v -E '^[[:space:]]*(find-links|extra-index-url)[[:space:]]*=[[:space:]]*(file:|/)' "$HOME/.config/pip/pip.conf" \
    > "$root/root/.config/pip/pip.conf" || true
fi
[ "$(chroot "$root" uname -m)" = aarch64 ] || { echo "arm64: the root does not run as aarch64" >&2; exit 1; }

# 4. the venv with edgehub's dependencies as aarch64 wheels
# python-qpid-proton is left out here: PyPI has no aarch64 wheel for it (step 5 builds and caches one).
reqs="$(python3 -c 'import sys, tomllib; print("\n".join(d for d in tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"] if not d.startswith("python-qpid-proton")))' "$repo/pyproject.toml")"
if [ ! -e "$root/opt/edgehub/.installed" ] || [ "$(cat "$root/opt/edgehub/.installed")" != "$reqs" ]; then
  step "installing edgehub's dependencies into the root's venv (aarch64 wheels)"
  printf '%s\n' "$reqs" > "$root/tmp/edgehub-requirements.txt"
  chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT=180 sh -ec '
      [ -x /opt/edgehub/bin/python ] || python3 -m venv /opt/edgehub
      /opt/edgehub/bin/python -m pip install --quiet --only-binary=:all: -r /tmp/edgehub-requirements.txt
    '
  printf '%s' "$reqs" > "$root/opt/edgehub/.installed"
fi
# 5. python-qpid-proton: pip takes it from the cached wheels (or an aarch64 wheel PyPI may have one day); failing
# that, it is built once under qemu-user (minutes) and the wheel kept in $cache/wheels. --only-binary: pip never
# starts a build itself, so the build happens here, once, where its wheel is kept.
proton_req="$(python3 -c 'import sys, tomllib; print(next(d for d in tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"] if d.startswith("python-qpid-proton")))' "$repo/pyproject.toml")"
wheels="$cache/wheels"
proton_install() {
  mkdir -p "$wheels"
  rm -rf "$root/tmp/edgehub-wheels" && cp -r "$wheels" "$root/tmp/edgehub-wheels"
  chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT=180 \
    /opt/edgehub/bin/python -m pip install --quiet --only-binary=:all: --find-links /tmp/edgehub-wheels "$proton_req"
}
if [ "$(cat "$root/opt/edgehub/.proton-installed" 2>/dev/null)" != "$proton_req" ]; then
  step "installing python-qpid-proton into the root's venv"
  if ! proton_install 2>/dev/null; then
    step "building python-qpid-proton for aarch64 under qemu-user (once; cached in $wheels)"
    chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root DEBIAN_FRONTEND=noninteractive sh -ec '
      apt-get update -qq
      apt-get install -y -qq --no-install-recommends gcc libc6-dev python3-dev libssl-dev pkg-config >/dev/null
    '
    rm -rf "$root/tmp/edgehub-proton-build"
    chroot "$root" /usr/bin/env -i PATH=/opt/edgehub/bin:/usr/bin:/bin HOME=/root \
      SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT=180 \
      /opt/edgehub/bin/python -m pip wheel --quiet --no-deps --no-cache-dir -w /tmp/edgehub-proton-build "$proton_req"
    mkdir -p "$wheels"
    cp "$root"/tmp/edgehub-proton-build/python_qpid_proton-*.whl "$wheels/"
    proton_install
  fi
  printf '%s' "$proton_req" > "$root/opt/edgehub/.proton-installed"
fi
step "root ready"
echo "$root"
