#!/usr/bin/env bash
# Runs every check and test of the workspace: installs what is missing, checks format
# and lints, then runs the tests inside a private D-Bus session with an unlocked
# gnome-keyring (Secret Service) and a private kernel session keyring. Safe to run twice.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

ensure_apt_packages build-essential pkg-config libdbus-1-dev dbus dbus-bin gnome-keyring keyutils \
    openssh-server openssh-client
ensure_rust_tools

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
step "cargo build (tests)"
cargo test --workspace --locked --no-run

step "cargo test (private D-Bus session + gnome-keyring + keyutils session)"
# dbus-run-session ends the bus when its child exits; the child stops the keyring
# daemon it started, by PID.
dbus-run-session -- keyctl session - bash scripts/with-keyring.sh \
    cargo test --workspace --locked
