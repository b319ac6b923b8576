#!/usr/bin/env bash
# Runs Postern: installs what is missing (system packages, the UI's npm packages), builds
# the UI and the desktop console, and opens the console: the broker runs inside it and
# serves agents on the local socket; the first run opens to onboarding. Without a
# display (a server), it runs the headless broker instead. Safe to run twice.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

ensure_apt_packages build-essential pkg-config libdbus-1-dev dbus dbus-bin gnome-keyring keyutils \
    "${DESKTOP_PACKAGES[@]}"
ensure_rust_tools

data_dir="${POSTERN_DATA_DIR:-${XDG_DATA_HOME:-$HOME/.local/share}/postern}"
config="${POSTERN_CONFIG:-$data_dir/postern.toml}"
mkdir -p "$data_dir" && chmod 700 "$data_dir"

step "building postern (the agent bridge and operator commands)"
cargo build --release --locked -p postern-cli
postern="$PWD/target/release/postern"
socket="$data_dir/run/postern.sock"

if [ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ]; then
    build_ui
    step "building the desktop console"
    cargo build --release --locked -p postern-desktop
    echo "agents connect with: $postern mcp --socket $socket"
    step "Postern console (data in $data_dir)"
    exec "$PWD/target/release/postern-console" --data-dir "$data_dir" --config "$config"
fi

# No display: the headless broker.
if [ ! -f "$config" ]; then
    cp examples/postern.toml "$config"
    echo "wrote an example config to $config (edit it; check with: $postern config check $config)"
fi
"$postern" config check "$config" >/dev/null
echo "no display found: running the headless broker (approvals need the console)"
echo "agents connect with: $postern mcp --socket $socket"
if [ -n "${DBUS_SESSION_BUS_ADDRESS:-}" ]; then
    step "postern daemon (Secret Service keychain, data in $data_dir)"
    exec "$postern" daemon --data-dir "$data_dir" --config "$config"
fi
# The kernel keyring, in a named session keyring that `postern vault` joins the same
# way: keyctl session postern postern vault set NAME --keychain keyutils
step "postern daemon (kernel keyring 'postern', data in $data_dir)"
exec keyctl session postern "$postern" daemon --data-dir "$data_dir" --config "$config" \
    --keychain keyutils
