#!/usr/bin/env bash
# Runs the benchmarks, inside the same private D-Bus session and gnome-keyring the tests
# use (the HTTP channel reads its credential from the Secret Service). With no
# arguments it also measures the release console's cold start and idle memory under a
# private X display. Arguments go to `cargo bench` (e.g. `--bench activity`).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_apt_packages build-essential pkg-config libdbus-1-dev dbus dbus-bin gnome-keyring keyutils \
    "${DESKTOP_PACKAGES[@]}" xvfb xauth webkit2gtk-driver
ensure_rust_tools
ensure_tauri_driver
build_ui
dbus-run-session -- keyctl session - bash scripts/with-keyring.sh \
    cargo bench --workspace --locked "$@"
if [ $# -eq 0 ]; then
    step "console cold start and idle memory (release build, Xvfb)"
    cargo build --release --locked -p postern-desktop
    dbus-run-session -- bash scripts/with-keyring.sh bash scripts/with-display.sh \
        bash scripts/console-startup.sh "$PWD/target/release/postern-console" 5
    step "console idle memory by WebKit setting (docs/benchmarks.md)"
    dbus-run-session -- bash scripts/with-keyring.sh bash scripts/with-display.sh \
        bash scripts/console-memory.sh "$PWD/target/release/postern-console" 3
    step "console idle memory with the window open, closed to the tray, started in the tray"
    cargo build --release --locked -p postern-tests --bin console_tray_memory
    dbus-run-session -- keyctl session - bash scripts/with-keyring.sh bash scripts/with-display.sh \
        target/release/console_tray_memory "$PWD/target/release/postern-console" 3
fi
