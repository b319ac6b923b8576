#!/usr/bin/env bash
# Runs every check and test of the workspace: installs what is missing, builds and tests
# the console's UI, checks format and lints, then runs the tests inside a private D-Bus
# session with an unlocked gnome-keyring (Secret Service), a private kernel session
# keyring, and a private X display with tauri-driver for the end-to-end tests. Safe to
# run twice.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

ensure_apt_packages build-essential pkg-config libdbus-1-dev dbus dbus-bin gnome-keyring keyutils \
    util-linux passwd \
    openssh-server openssh-client "${DESKTOP_PACKAGES[@]}" xvfb xauth webkit2gtk-driver rpm \
    bubblewrap libsecret-tools python3-secretstorage
ensure_rust_tools
ensure_tauri_driver

build_ui
step "UI tests (vitest)"
(cd ui && npm test --silent)

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
# A Unix-only call must not land unnoticed: the crates that ship on Windows are linted
# for it too (built, not run: macOS and Windows are not tested here).
ensure_windows_target
step "cargo clippy -D warnings (Windows: $WINDOWS_TARGET)"
cargo clippy --locked --target "$WINDOWS_TARGET" \
    -p postern-broker -p postern-mcp -p postern-console -p postern-cli -- -D warnings
step "cargo build (tests)"
cargo test --workspace --locked --no-run

# The package tests (tests/tests/package.rs) install the .deb with dpkg, start the
# daemon from its user unit, make one MCP call and purge it, and install and erase the
# RPM in a scratch root: they need root, so the packages are built here only then, from
# the debug build the tests already use (a release build would compile everything
# again). Set POSTERN_SKIP_PACKAGE=1 to leave them out (the tests then say they did not
# run).
if [ "$(id -u)" -eq 0 ] && [ "${POSTERN_SKIP_PACKAGE:-0}" != 1 ]; then
    step "building the packages (scripts/package.sh --debug)"
    bash scripts/package.sh --debug
    # Absolute: the test runs in its own crate's directory.
    POSTERN_DEB="$PWD/$(ls -t target/debug/bundle/deb/*.deb | head -n 1)"
    POSTERN_RPM="$PWD/$(ls -t target/debug/bundle/rpm/*.rpm | head -n 1)"
    export POSTERN_DEB POSTERN_RPM
    export POSTERN_REQUIRE_PACKAGE_TEST=1
fi

# The privilege separation tests (crates/cli/tests/privsep.rs) create throwaway users
# and run the broker, an agent and an operator as them: they need root, and fail rather
# than skip when this says they are required. Set it to 0 to run the suite as a normal
# user (they then print that they did not run).
export POSTERN_REQUIRE_PRIVSEP_TESTS="${POSTERN_REQUIRE_PRIVSEP_TESTS:-1}"
# The shield tests (crates/cli/tests/shield.rs) run agents in bubblewrap sandboxes and
# try every way out of them, with secret-tool and Python's secretstorage among the
# attackers: installed above, so here they fail rather than skip.
export POSTERN_REQUIRE_SHIELD_TESTS="${POSTERN_REQUIRE_SHIELD_TESTS:-1}"

step "cargo test (private D-Bus session + gnome-keyring + keyutils session)"
# Audit anchors go to a private state directory, never the user's own.
state_dir="$(mktemp -d)"
trap 'rm -rf "$state_dir"' EXIT
# dbus-run-session ends the bus when its child exits; the wrappers stop the keyring
# daemon, Xvfb and tauri-driver they started, by PID.
XDG_STATE_HOME="$state_dir" dbus-run-session -- keyctl session - bash scripts/with-keyring.sh \
    bash scripts/with-display.sh cargo test --workspace --locked
