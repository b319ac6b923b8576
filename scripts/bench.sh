#!/usr/bin/env bash
# Runs the benchmarks, inside the same private D-Bus session and gnome-keyring the tests
# use (the HTTP channel reads its credential from the Secret Service).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_apt_packages build-essential pkg-config libdbus-1-dev dbus dbus-bin gnome-keyring keyutils
ensure_rust_tools
dbus-run-session -- keyctl session - bash scripts/with-keyring.sh \
    cargo bench --workspace --locked "$@"
