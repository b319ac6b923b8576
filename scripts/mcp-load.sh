#!/usr/bin/env bash
# Throughput and CPU per action through a third-party MCP client: the official Python SDK
# (`mcp`, in a venv this script makes under target/), one `postern mcp` bridge per
# session, pre-approved GETs to a loopback origin in its own process, the release build,
# inside the same private D-Bus session, gnome-keyring and kernel keyring the tests use.
# Arguments go to scripts/mcp_load.py, e.g.
#   scripts/mcp-load.sh                                  # every phase, Secret Service
#   scripts/mcp-load.sh --phases serial sessions_32 sessions_64 --seconds 10
#   scripts/mcp-load.sh --keychain keyutils
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_apt_packages build-essential pkg-config libdbus-1-dev dbus dbus-bin gnome-keyring keyutils \
    python3 python3-venv
ensure_rust_tools

# The SDK version the figures in docs/benchmarks.md were taken with.
MCP_SDK_VERSION="${MCP_SDK_VERSION:-2.3.0}"
venv="target/mcp-load-venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c \
    "import importlib.metadata as m, sys; sys.exit(m.version('mcp') != '$MCP_SDK_VERSION')" 2>/dev/null; then
    step "python venv with mcp==$MCP_SDK_VERSION"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "mcp==$MCP_SDK_VERSION"
fi

step "cargo build --release -p postern-cli"
cargo build --release --locked -p postern-cli

step "load through the Python MCP SDK"
dbus-run-session -- keyctl session - bash scripts/with-keyring.sh \
    "$PWD/$venv/bin/python" scripts/mcp_load.py --postern "$PWD/target/release/postern" "$@"
