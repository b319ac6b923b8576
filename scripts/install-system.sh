#!/usr/bin/env bash
# Installs Postern privilege-separated: the broker runs as the system user `postern`
# (which alone can read its journal, sealed credentials and audit key), agents of every
# local user reach its agent socket, and the people named with --operator reach its
# operator socket. Safe to run again: what exists is kept (the vault key is never
# replaced), what is missing is made.
#
#   sudo scripts/install-system.sh --operator alice [--binary target/release/postern]
#   sudo /usr/lib/postern/install-system --operator alice    (installed by the package)
#
# Then, as alice (after logging in again, for the new group):
#   postern operator --socket /run/postern/operator.sock overview
# and an agent's MCP server entry: postern mcp --socket /run/postern/agent.sock
#
# --no-start installs without starting (or enabling) the service. The POSTERN_INSTALL_*
# variables move everything (user, group, directories) for the installer's own test.
set -euo pipefail
here="$(cd "$(dirname "$(readlink -f "$0")")" && pwd)"

# From a source tree, the unit comes from packaging/ and the binary is copied to
# /usr/local/bin. From the package (/usr/lib/postern/install-system), the package's own
# binary (/usr/bin/postern) and unit (/usr/lib/systemd/system/postern.service) are used
# where they are: only what differs from them is written.
if [ -e "$here/../packaging/postern.service" ]; then
    cd "$here/.."
    packaged=0
    template="packaging/postern.service"
    default_bin_dir=/usr/local/bin
else
    packaged=1
    template="${POSTERN_INSTALL_UNIT_TEMPLATE:-/usr/lib/systemd/system/postern.service}"
    default_bin_dir=/usr/bin
fi

user="${POSTERN_INSTALL_USER:-postern}"
group="${POSTERN_INSTALL_GROUP:-postern-operators}"
state_dir="${POSTERN_INSTALL_STATE_DIR:-/var/lib/postern}"
etc_dir="${POSTERN_INSTALL_ETC_DIR:-/etc/postern}"
bin_dir="${POSTERN_INSTALL_BIN_DIR:-$default_bin_dir}"
unit_dir="${POSTERN_INSTALL_UNIT_DIR:-/etc/systemd/system}"
binary=""
operators=()
start=1

usage() {
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

while [ $# -gt 0 ]; do
    case "$1" in
        --binary) binary="${2:?--binary needs a path}"; shift 2 ;;
        --operator) operators+=("${2:?--operator needs a user name}"); shift 2 ;;
        --no-start) start=0; shift ;;
        -h|--help) usage 0 ;;
        *) echo "install-system.sh: unknown argument $1" >&2; usage 2 ;;
    esac
done

say() { printf '==> %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
    echo "install-system.sh: run as root (it creates a system user and a service)" >&2
    exit 2
fi

if [ -z "$binary" ] && [ "$packaged" -eq 1 ]; then
    binary="/usr/bin/postern"
fi
if [ -z "$binary" ]; then
    for candidate in target/release/postern target/debug/postern; do
        if [ -x "$candidate" ]; then binary="$candidate"; break; fi
    done
fi
if [ -z "$binary" ] || [ ! -x "$binary" ]; then
    echo "install-system.sh: no postern binary: build it (cargo build --release -p postern-cli) or pass --binary PATH" >&2
    exit 2
fi
for person in "${operators[@]}"; do
    if ! id "$person" >/dev/null 2>&1; then
        echo "install-system.sh: no user named $person" >&2
        exit 2
    fi
done

# Users and groups.
if ! getent group "$group" >/dev/null; then
    say "creating group $group"
    groupadd --system "$group"
fi
if ! id "$user" >/dev/null 2>&1; then
    say "creating system user $user"
    useradd --system --user-group --no-create-home --home-dir "$state_dir" \
        --shell /usr/sbin/nologin "$user"
fi
# The broker gives its operator socket to the group, which needs membership.
usermod -a -G "$group" "$user"

# Directories: the state dir is the broker's alone.
install -d -m 0700 -o "$user" -g "$user" "$state_dir"
chown "$user:$user" "$state_dir"
chmod 0700 "$state_dir"
install -d -m 0755 -o root -g root "$etc_dir"
install -d -m 0755 "$bin_dir"
if [ "$binary" -ef "$bin_dir/postern" ]; then
    say "using $bin_dir/postern where it is"
else
    install -m 0755 -o root -g root "$binary" "$bin_dir/postern"
fi

if [ ! -e "$state_dir/postern.toml" ]; then
    say "creating an empty targets file $state_dir/postern.toml"
    install -m 0600 -o "$user" -g "$user" /dev/null "$state_dir/postern.toml"
    printf '%s\n' "# Postern targets (see examples/postern.toml in the source)." \
        > "$state_dir/postern.toml"
fi

# The vault key: 32 random bytes, made once. Encrypted with systemd-creds (TPM2 or the
# host key) when it can, else a file only the broker's user can read.
dropin_dir="$unit_dir/postern.service.d"
key="$etc_dir/vault.key"
cred="$etc_dir/vault.key.cred"
if [ -e "$cred" ]; then
    say "keeping the encrypted vault key $cred"
elif [ -e "$key" ]; then
    say "keeping the vault key $key"
    chown "$user:$user" "$key"
    chmod 0400 "$key"
else
    tmp="$(umask 077 && mktemp)"
    trap 'rm -f "$tmp"' EXIT
    head -c 32 /dev/urandom > "$tmp"
    if command -v systemd-creds >/dev/null \
        && systemd-creds encrypt --name=postern-vault-key "$tmp" "$cred" 2>/dev/null; then
        say "vault key encrypted with systemd-creds: $cred"
        chmod 0400 "$cred"
    else
        say "vault key (systemd-creds unavailable): $key, 0400 $user"
        install -m 0400 -o "$user" -g "$user" "$tmp" "$key"
    fi
    rm -f "$tmp"
fi

# The unit, with this installation's names and paths. The package's unit already has
# the default ones: a copy is written only when something differs from it.
install -d -m 0755 "$unit_dir"
sed -e "s|^User=postern$|User=$user|" \
    -e "s|^Group=postern$|Group=$user|" \
    -e "s|postern-operators|$group|g" \
    -e "s|/usr/bin/postern|$bin_dir/postern|" \
    -e "s|/var/lib/postern|$state_dir|g" \
    -e "s|/etc/postern/vault.key|$key|" \
    "$template" > "$unit_dir/postern.service.new"
chmod 0644 "$unit_dir/postern.service.new"
unit="$unit_dir/postern.service"
if [ "$packaged" -eq 1 ] && cmp -s "$unit_dir/postern.service.new" "$template"; then
    rm -f "$unit_dir/postern.service.new"
    unit="$template"
    say "using the package's unit $template"
    if [ -e "$unit_dir/postern.service" ]; then
        say "note: $unit_dir/postern.service (an earlier install's) overrides it; remove that file to use the package's"
    fi
else
    mv "$unit_dir/postern.service.new" "$unit"
fi
if [ -e "$cred" ]; then
    install -d -m 0755 "$dropin_dir"
    printf '%s\n' "[Service]" "LoadCredential=" \
        "LoadCredentialEncrypted=postern-vault-key:$cred" > "$dropin_dir/credential.conf"
    chmod 0644 "$dropin_dir/credential.conf"
fi
if command -v systemd-analyze >/dev/null; then
    say "checking the unit (systemd-analyze verify)"
    systemd-analyze verify "$unit"
fi

for person in "${operators[@]}"; do
    if id -nG "$person" | tr ' ' '\n' | grep -qx "$group"; then
        say "$person already operates Postern ($group)"
    else
        say "adding $person to $group (takes effect at their next login)"
        usermod -a -G "$group" "$person"
    fi
done

if [ "$start" -eq 1 ]; then
    if [ -d /run/systemd/system ]; then
        systemctl daemon-reload
        systemctl enable --now postern.service
        systemctl restart postern.service
        say "postern.service is running: agents use postern mcp --socket /run/postern/agent.sock"
    else
        say "systemd is not running here: the unit is installed but not started"
    fi
fi
