# Shared helpers for the scripts; sourced, not run.

step() { printf '\n==> %s\n' "$*"; }

# Installs the Debian/Ubuntu packages that are missing (root, or via sudo).
ensure_apt_packages() {
    local missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
            || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    step "installing ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# The Rust toolchain must already be there (rustup); add the components we use.
ensure_rust_tools() {
    if ! command -v cargo >/dev/null; then
        echo "cargo not found: install Rust with rustup (https://rustup.rs) first" >&2
        exit 1
    fi
    if command -v rustup >/dev/null; then
        for component in rustfmt clippy; do
            rustup component list --installed 2>/dev/null | grep -q "^$component" \
                || rustup component add "$component"
        done
    fi
}

# The Windows target and its C cross-compiler, to check that the engine, the MCP
# layer, the console and the CLI still build for Windows (nothing here runs them).
WINDOWS_TARGET=x86_64-pc-windows-gnu
ensure_windows_target() {
    ensure_apt_packages gcc-mingw-w64-x86-64
    if command -v rustup >/dev/null; then
        rustup target list --installed 2>/dev/null | grep -qx "$WINDOWS_TARGET" \
            || rustup target add "$WINDOWS_TARGET"
    fi
}

# What the desktop console builds and runs against (Tauri v2 on WebKitGTK).
DESKTOP_PACKAGES=(libwebkit2gtk-4.1-dev libgtk-3-dev librsvg2-dev libayatana-appindicator3-dev
    libssl-dev pkg-config build-essential libxdo-dev)

# Node.js and npm build the console's UI.
ensure_node() {
    if ! command -v npm >/dev/null; then
        ensure_apt_packages nodejs npm
    fi
}

# Installs the UI's npm packages (exactly the lockfile) when they are missing or stale,
# then builds ui/dist, which the console binary embeds.
build_ui() {
    ensure_node
    if [ ! -d ui/node_modules ] || [ ui/package-lock.json -nt ui/node_modules/.package-lock.json ]; then
        step "npm ci (ui)"
        (cd ui && npm ci --no-audit --no-fund)
    fi
    step "building the UI (vite)"
    (cd ui && npm run --silent build)
}

# tauri-driver drives the console in the end-to-end tests.
ensure_tauri_driver() {
    if ! command -v tauri-driver >/dev/null \
        || ! cargo install --list 2>/dev/null | grep -q '^tauri-driver v2\.1\.0'; then
        step "installing tauri-driver 2.1.0"
        cargo install tauri-driver --version 2.1.0 --locked
    fi
}
