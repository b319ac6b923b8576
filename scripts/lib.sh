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
