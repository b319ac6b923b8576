#!/usr/bin/env bash
# Measures the release console: cold start to first paint and idle memory, under the
# private keychain and X display the caller set up (scripts/bench.sh does). Each run
# starts the app in a new, empty data dir; first paint is when the main page finished
# loading (the UI mounts from its module script), from the moment the process was
# spawned. Idle memory is taken 10 s later: RSS and PSS summed over the app and the
# WebKit processes it started, and PSS per process. Extra arguments go to the console.
set -euo pipefail
app="${1:?usage: console-startup.sh PATH-TO-RELEASE-CONSOLE [RUNS [CONSOLE-ARGS...]]}"
runs="${2:-5}"
shift $(( $# < 2 ? $# : 2 ))

descendants() {
    local pid=$1
    echo "$pid"
    for child in $(cat "/proc/$pid/task/"*/children 2>/dev/null); do
        descendants "$child"
    done
}

sum_field() { # field-name pids...
    local field=$1 total=0 kb
    shift
    for pid in "$@"; do
        kb=$(awk -v f="$field:" '$1 == f { print $2 }' "/proc/$pid/smaps_rollup" 2>/dev/null || echo 0)
        total=$((total + ${kb:-0}))
    done
    echo "$total"
}

for run in $(seq 1 "$runs"); do
    data="$(mktemp -d)"
    start_ms=$(date +%s%3N)
    POSTERN_STARTUP_TRACE=1 "$app" --data-dir "$data" --keychain-service "postern-bench-$run-$$" \
        "$@" 2>"$data/stderr.log" &
    pid=$!
    paint_ms=""
    for _ in $(seq 1 300); do
        line=$(grep -o 'page-loaded-epoch-ms=[0-9]*' "$data/stderr.log" 2>/dev/null || true)
        if [ -n "$line" ]; then
            paint_ms=$(( ${line#*=} - start_ms ))
            break
        fi
        sleep 0.05
    done
    if [ -z "$paint_ms" ]; then
        echo "run $run: no first paint within 15 s" >&2
        cat "$data/stderr.log" >&2
        kill "$pid" 2>/dev/null || true
        exit 1
    fi
    sleep 10
    pids=$(descendants "$pid")
    # shellcheck disable=SC2086
    rss=$(sum_field Rss $pids)
    # shellcheck disable=SC2086
    pss=$(sum_field Pss $pids)
    app_rss=$(sum_field Rss "$pid")
    app_pss=$(sum_field Pss "$pid")
    nprocs=$(echo "$pids" | wc -w)
    # PSS of each process but the app, by name (WebKitWebProcess, WebKitNetworkProcess,
    # and the sandbox's helpers).
    others=""
    for p in $pids; do
        [ "$p" = "$pid" ] && continue
        name=$(cat "/proc/$p/comm" 2>/dev/null || echo gone)
        others="$others $name=$(( $(sum_field Pss "$p") / 1024 ))"
    done
    printf 'run %d: first paint %d ms; idle: app RSS %d MiB; with WebKit (%d processes) RSS %d MiB, PSS %d MiB (app %d MiB;%s)\n' \
        "$run" "$paint_ms" $((app_rss / 1024)) "$nprocs" $((rss / 1024)) $((pss / 1024)) \
        $((app_pss / 1024)) "$others"
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    rm -rf "$data"
done
