#!/usr/bin/env bash
# Runs the given command with a private X display (Xvfb) and tauri-driver listening for
# the end-to-end tests (TAURI_DRIVER_URL); stops both by PID afterwards.
set -euo pipefail

display_number=""
for n in $(seq 91 140); do
    if [ ! -e "/tmp/.X11-unix/X$n" ] && [ ! -e "/tmp/.X$n-lock" ]; then
        display_number=$n
        break
    fi
done
if [ -z "$display_number" ]; then
    echo "no free X display number between :91 and :140" >&2
    exit 1
fi

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
driver_port=""
for p in $(seq 4444 2 4500); do
    if port_free "$p" && port_free "$((p + 1))"; then
        driver_port=$p
        break
    fi
done
if [ -z "$driver_port" ]; then
    echo "no free port pair for tauri-driver between 4444 and 4501" >&2
    exit 1
fi

log_dir="$(mktemp -d)"
xvfb_pid=""
driver_pid=""
cleanup() {
    for pid in "$driver_pid" "$xvfb_pid"; do
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    rm -rf "$log_dir"
}
trap cleanup EXIT

# Waits up to 10 s for NAME (PID, logging to LOG) to be ready (the rest of the arguments,
# a command); fails with its log if it died.
wait_started() {
    local name=$1 pid=$2 log=$3
    shift 3
    for _ in $(seq 1 100); do
        "$@" && break
        sleep 0.1
    done
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "$name did not start:" >&2
        cat "$log" >&2
        exit 1
    fi
}
port_taken() { ! port_free "$1"; }

Xvfb ":$display_number" -screen 0 1280x860x24 -nolisten tcp >"$log_dir/xvfb.log" 2>&1 &
xvfb_pid=$!
wait_started Xvfb "$xvfb_pid" "$log_dir/xvfb.log" test -e "/tmp/.X11-unix/X$display_number"
export DISPLAY=":$display_number"

# The consoles tauri-driver starts keep WebKit's accelerated compositing on: without it
# (how the console ships, see src-tauri/src/webview.rs) WebKitWebDriver's clicks never
# complete (WebKitGTK 2.50). The tray test clicks the shipped console with real input.
POSTERN_WEBVIEW_SETTINGS=none tauri-driver --port "$driver_port" --native-port "$((driver_port + 1))" \
    >"$log_dir/tauri-driver.log" 2>&1 &
driver_pid=$!
wait_started tauri-driver "$driver_pid" "$log_dir/tauri-driver.log" port_taken "$driver_port"
export TAURI_DRIVER_URL="http://127.0.0.1:$driver_port"

"$@"
