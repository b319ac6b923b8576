#!/usr/bin/env bash
# What each WebKit setting costs: the release console's idle memory (PSS summed over the
# app and its WebKit processes, from /proc/PID/smaps_rollup) and first paint, under the
# private keychain and X display the caller set up (scripts/bench.sh does), with one
# setting changed at a time against the console with none of its own settings
# (POSTERN_WEBVIEW_SETTINGS=none; see src-tauri/src/webview.rs), then as the console
# ships. Each line is the median of RUNS runs (default 3) of scripts/console-startup.sh.
set -euo pipefail
app="${1:?usage: console-memory.sh PATH-TO-RELEASE-CONSOLE [RUNS]}"
runs="${2:-3}"
here="$(dirname "$0")"

median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

measure() { # label, then env assignments
    local label=$1 out
    shift
    out=$(env "$@" bash "$here/console-startup.sh" "$app" "$runs" | grep '^run')
    local pss rss app_pss paint web net
    pss=$(sed -n 's/.*PSS \([0-9]*\) MiB (app.*/\1/p' <<<"$out" | median)
    rss=$(sed -n 's/.*processes) RSS \([0-9]*\) MiB.*/\1/p' <<<"$out" | median)
    app_pss=$(sed -n 's/.*(app \([0-9]*\) MiB;.*/\1/p' <<<"$out" | median)
    web=$(grep -o 'WebKitWebProces=[0-9]*' <<<"$out" | cut -d= -f2 | median)
    net=$(grep -o 'WebKitNetworkPr=[0-9]*' <<<"$out" | cut -d= -f2 | median)
    paint=$(sed -n 's/.*first paint \([0-9]*\) ms.*/\1/p' <<<"$out" | median)
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$label" "$pss" "$app_pss" "${web:--}" "${net:--}" \
        "$rss" "$paint"
}

echo "| setting | total PSS MiB | app | WebKitWebProcess | WebKitNetworkProcess | total RSS MiB | first paint ms |"
echo "|---|---|---|---|---|---|---|"
base=(POSTERN_WEBVIEW_SETTINGS=none)
measure "WebKit defaults (no setting)" "${base[@]}"
measure "WEBKIT_DISABLE_COMPOSITING_MODE=1" "${base[@]}" WEBKIT_DISABLE_COMPOSITING_MODE=1
measure "WEBKIT_DISABLE_DMABUF_RENDERER=1" "${base[@]}" WEBKIT_DISABLE_DMABUF_RENDERER=1
measure "WEBKIT_SKIA_ENABLE_CPU_RENDERING=1" "${base[@]}" WEBKIT_SKIA_ENABLE_CPU_RENDERING=1
measure "JSC_useJIT=0 (no JavaScript JIT)" "${base[@]}" JSC_useJIT=0
measure "MALLOC_ARENA_MAX=2 (glibc arenas)" "${base[@]}" MALLOC_ARENA_MAX=2
measure "cache model DOCUMENT_VIEWER (API)" POSTERN_WEBVIEW_SETTINGS=cache-model
measure "hardware acceleration NEVER (API)" POSTERN_WEBVIEW_SETTINGS=no-acceleration
measure "acceleration NEVER + WEBKIT_DISABLE_DMABUF_RENDERER=1" \
    POSTERN_WEBVIEW_SETTINGS=no-acceleration WEBKIT_DISABLE_DMABUF_RENDERER=1
measure "as shipped (src-tauri/src/webview.rs SHIPPED)" POSTERN_WEBVIEW_SETTINGS=shipped
measure "shipped + JSC_useJIT=0" POSTERN_WEBVIEW_SETTINGS=shipped JSC_useJIT=0
