#!/usr/bin/env bash
# Builds the Linux packages with the Tauri bundler: target/release/bundle/deb/*.deb and
# target/release/bundle/rpm/*.rpm. Each holds the desktop console (with its menu entry
# and icons), the `postern` command on PATH, a user unit for the single-user daemon, the
# privilege-separated system unit and its installer (/usr/lib/postern/install-system).
# Installs what it needs (system packages, the UI's npm packages, among them the Tauri
# CLI) when missing; safe to run twice. Install the result with
#   sudo apt install ./target/release/bundle/deb/Postern_<version>_amd64.deb
#
# `--debug` builds the same packages from the debug profile instead (under
# target/debug/bundle/): what the test suite installs, because it reuses the suite's own
# build rather than compiling everything again with optimisations.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

profile=release
case "${1:-}" in
    "") ;;
    --debug) profile=debug ;;
    *)
        echo "usage: scripts/package.sh [--debug]" >&2
        exit 2
        ;;
esac
cargo_profile=()
[ "$profile" = release ] && cargo_profile=(--release)

ensure_apt_packages build-essential pkg-config libdbus-1-dev "${DESKTOP_PACKAGES[@]}"
ensure_rust_tools

# The UI's npm packages include the Tauri CLI (@tauri-apps/cli, a prebuilt binary).
build_ui
# Both binaries in one build: built apart, the dependencies they share would be built
# twice with different features.
step "building postern and the console ($profile)"
cargo build "${cargo_profile[@]}" --locked -p postern-cli -p postern-desktop

# The Tauri CLI reads its configuration from the app crate's directory, with paths
# relative to it; the project's one configuration is the repository's tauri.conf.json.
# Hand the CLI a copy with absolute paths (the UI is already built), and remove it after.
cli_config="src-tauri/tauri.conf.json"
trap 'rm -f "$cli_config"' EXIT
node - "$PWD" "$profile" > "$cli_config" <<'JS'
const fs = require("fs");
const path = require("path");
const [root, profile] = process.argv.slice(2);
const config = JSON.parse(fs.readFileSync(path.join(root, "tauri.conf.json"), "utf8"));
const abs = (p) => path.resolve(root, p);
config.build.frontendDist = abs(config.build.frontendDist);
config.build.beforeBuildCommand = "";
config.bundle.icon = config.bundle.icon.map(abs);
for (const kind of ["deb", "rpm"]) {
  const c = config.bundle.linux[kind];
  c.files = Object.fromEntries(
    Object.entries(c.files).map(([to, from]) => [to, abs(from.replace(/^target\/release\//, `target/${profile}/`))]),
  );
  for (const key of ["preInstallScript", "postInstallScript", "preRemoveScript", "postRemoveScript"]) {
    if (c[key]) c[key] = abs(c[key]);
  }
}
process.stdout.write(JSON.stringify(config, null, 2));
JS

step "building the console and the packages (tauri build)"
tauri_flags=(--ci --bundles deb,rpm)
[ "$profile" = debug ] && tauri_flags+=(--debug)
(cd src-tauri && ../ui/node_modules/.bin/tauri build "${tauri_flags[@]}" -- --locked)

echo
for package in target/$profile/bundle/deb/*.deb target/$profile/bundle/rpm/*.rpm; do
    [ -e "$package" ] && echo "built $package"
done
echo "install: sudo apt install ./$(ls target/$profile/bundle/deb/*.deb | head -n 1)"
