#!/usr/bin/env bash
# Runs Postern's broker headless (the desktop console replaces this later): installs
# what is missing, builds the `postern` binary, puts an example config in the data dir
# on first run, and serves agents on the local socket until Ctrl-C. Safe to run twice.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

ensure_apt_packages build-essential pkg-config libdbus-1-dev dbus dbus-bin gnome-keyring keyutils
ensure_rust_tools

step "building postern"
cargo build --release --locked -p postern-cli
postern="$PWD/target/release/postern"

data_dir="${POSTERN_DATA_DIR:-${XDG_DATA_HOME:-$HOME/.local/share}/postern}"
config="${POSTERN_CONFIG:-$data_dir/postern.toml}"
mkdir -p "$data_dir" && chmod 700 "$data_dir"
if [ ! -f "$config" ]; then
    cp examples/postern.toml "$config"
    echo "wrote an example config to $config (edit it; check with: $postern config check $config)"
fi
"$postern" config check "$config" >/dev/null

socket="$data_dir/run/postern.sock"
echo "agents connect with: $postern mcp --socket $socket"
if [ -n "${DBUS_SESSION_BUS_ADDRESS:-}" ]; then
    # A desktop session: the Secret Service (gnome-keyring, KWallet, ...).
    step "postern daemon (Secret Service keychain, data in $data_dir)"
    exec "$postern" daemon --data-dir "$data_dir" --config "$config"
fi
# Headless: the kernel keyring, in a named session keyring that `postern vault` joins
# the same way: keyctl session postern postern vault set NAME --keychain keyutils
step "postern daemon (kernel keyring 'postern', data in $data_dir)"
exec keyctl session postern "$postern" daemon --data-dir "$data_dir" --config "$config" \
    --keychain keyutils
