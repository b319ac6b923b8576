#!/usr/bin/env bash
# Inside a private D-Bus session: start an unlocked gnome-keyring with a throwaway
# HOME (never a user's real keyring), run the given command, stop the daemon by PID.
set -euo pipefail

export CARGO_HOME="${CARGO_HOME:-$HOME/.cargo}"
export RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}"
keyring_home="$(mktemp -d)"
export HOME="$keyring_home"
export XDG_DATA_HOME="$keyring_home/.local/share"
export XDG_RUNTIME_DIR="$keyring_home/run"
mkdir -p "$XDG_DATA_HOME" "$XDG_RUNTIME_DIR"
chmod 700 "$XDG_RUNTIME_DIR"

keyring_pid=""
cleanup() {
    if [ -n "$keyring_pid" ] && kill -0 "$keyring_pid" 2>/dev/null; then
        kill "$keyring_pid" 2>/dev/null || true
        wait "$keyring_pid" 2>/dev/null || true
    fi
    rm -rf "$keyring_home"
}
trap cleanup EXIT

# --foreground keeps the daemon our child, so its PID is ours to stop.
printf 'postern-test' | gnome-keyring-daemon --foreground --unlock --components=secrets \
    >"$keyring_home/keyring.log" 2>&1 &
keyring_pid=$!

for _ in $(seq 1 100); do
    if dbus-send --session --print-reply --dest=org.freedesktop.DBus /org/freedesktop/DBus \
        org.freedesktop.DBus.NameHasOwner string:org.freedesktop.secrets 2>/dev/null \
        | grep -q 'boolean true'; then
        break
    fi
    sleep 0.1
done
if ! kill -0 "$keyring_pid" 2>/dev/null; then
    echo "gnome-keyring-daemon did not start:" >&2
    cat "$keyring_home/keyring.log" >&2
    exit 1
fi

export POSTERN_TEST_KEYUTILS=1
"$@"
