#!/usr/bin/env bash
# `make test-arm64`: edgehub on aarch64, here. Makes (or reuses) the arm64 Debian root (root.sh), copies this
# checkout's code into it, and runs hardware/arm64/check.py there with the root's own Python and aarch64 wheels:
# the hub starts with MQTT and AMQP over TLS, a device publishes over MQTT and the message lands, a module's message
# goes round a route over AMQP, the hub's RSS is reported (under qemu-user, translator included: not a footprint
# figure). The run happens in its own mount and pid namespaces, so /proc
# mounted for it and any process left behind go away with it.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
start=$SECONDS
root="$("$here/root.sh" | tail -n 1)"

# this checkout's code, fresh each run (the wheels stay in the root's venv)
rm -rf "$root/src"
mkdir -p "$root/src"
(cd "$repo" && tar -cf - --exclude=__pycache__ edgehub protocol_heads deployment hardware pyproject.toml) | tar -xf - -C "$root/src"

echo "arm64: running the check in $root (qemu-user)" >&2
unshare --mount --pid --fork --kill-child -- sh -ec '
  root="$1"
  mount -t proc proc "$root/proc"
  exec chroot "$root" /usr/bin/env -i PATH=/opt/edgehub/bin:/usr/bin:/bin HOME=/root PYTHONPATH=/src \
    PYTHONDONTWRITEBYTECODE=1 LANG=C.UTF-8 timeout 600 /opt/edgehub/bin/python /src/hardware/arm64/check.py
' sh "$root"
echo "arm64: done in $((SECONDS - start)) s (the root made or reused, the wheels installed or reused, the check)" >&2
