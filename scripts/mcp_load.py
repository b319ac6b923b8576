#!/usr/bin/env python3
"""Load generator for `postern daemon` through a third-party MCP client.

It drives the broker the way a user's agents would: the official Python MCP SDK (`mcp`)
launches one `postern mcp` bridge per session over stdio, and the calls are pre-approved
GETs to a loopback origin that runs in its own process. Run it through
`scripts/mcp-load.sh`, which makes the venv, builds the release binary and provides a
private keychain; this file does the rest:

  1. starts the origin (this script, `origin` mode: a plain HTTP/1.1 server on 127.0.0.1);
  2. stores the credential with `postern vault set`, writes the targets file, starts
     `postern daemon` on a fresh data dir;
  3. runs each phase (a tool, a number of sessions, calls in flight per session) for a
     fixed time, bounded in calls too, and reports calls/s, latency, the daemon's CPU per
     call (utime+stime of its process over the phase / calls; stime alone as its kernel
     share) and the bridges' CPU;
  4. measures the serial path: one call at a time, against a direct GET to the same
     origin and the cost of one fsync on the data dir's filesystem, and the gaps between
     the journal's stage records of those invocations.

Every call checks its answer (`outcome` committed); a phase with failures says so and
the script exits 1. Nothing but 127.0.0.1 is ever contacted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")

# --------------------------------------------------------------------------------------
# The origin: a loopback HTTP/1.1 server in its own process.
# --------------------------------------------------------------------------------------

BODY = b'{"ok":true}'
RESPONSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
    + str(len(BODY)).encode()
    + b"\r\n\r\n"
    + BODY
)


async def _serve_origin(port_file: Path) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:].strip() or b"0")
                if length:
                    await reader.readexactly(length)
                writer.write(RESPONSE)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(str(port))
    tmp.rename(port_file)
    async with server:
        await server.serve_forever()


def start_origin(work: Path) -> tuple[subprocess.Popen, int]:
    port_file = work / "origin.port"
    proc = subprocess.Popen(
        [sys.executable, __file__, "origin", "--port-file", str(port_file)],
        stdin=subprocess.DEVNULL,
    )
    for _ in range(200):
        if port_file.exists():
            return proc, int(port_file.read_text())
        if proc.poll() is not None:
            raise SystemExit("the origin did not start")
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("the origin did not start in 10 s")


# --------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------


def cpu_ms(pid: int) -> float:
    """utime+stime of a process (all its threads), in milliseconds."""
    return sum(user_sys_ms(pid))


def user_sys_ms(pid: int) -> tuple[float, float]:
    """(utime, stime) of a process (all its threads), in milliseconds: its own code, and
    the kernel working for it (system calls; the loopback network stack it drives)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) * 1000.0 / CLK_TCK, int(fields[12]) * 1000.0 / CLK_TCK


def io_counts(pid: int) -> tuple[int, int]:
    """(write syscalls, bytes written) by a process so far, from /proc/PID/io: what it
    handed the kernel, page cache included."""
    counts = {}
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            key, _, value = line.partition(":")
            counts[key] = int(value)
    return counts["syscw"], counts["wchar"]


def named_cpu_ms(names: tuple[str, ...]) -> float:
    """utime+stime of every process whose name is one of `names` (the keychain's
    services: gnome-keyring-daemon and the session bus), in milliseconds."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if stat.split("(", 1)[1].rsplit(")", 1)[0] in names:
            fields = stat.rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) * 1000.0 / CLK_TCK
    return total


KEYCHAIN_PROCESSES = ("gnome-keyring-d", "dbus-daemon")


def machine_busy_ms() -> tuple[float, float]:
    """(busy, total) CPU time of the whole machine so far, in milliseconds."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    total = sum(fields[:8])
    return (total - idle) * 1000.0 / CLK_TCK, total * 1000.0 / CLK_TCK


def fsync_ms(directory: Path, n: int = 40) -> float:
    """Median time of overwriting 4 KiB inside a preallocated file and fdatasync'ing it,
    in milliseconds: what a commit to SQLite's (reused) WAL costs, without the file-size
    metadata an append would add."""
    path = directory / ".fsync-probe"
    times = []
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        block = b"\0" * 4096
        os.write(fd, block * 256)
        os.fsync(fd)
        for i in range(n):
            os.pwrite(fd, block, (i % 256) * 4096)
            t = time.perf_counter()
            os.fdatasync(fd)
            times.append((time.perf_counter() - t) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(times)


def direct_get_ms(port: int, n: int = 200) -> float:
    """Median latency of a GET on a fresh connection, as the broker makes one."""
    request = (
        f"GET /v1/items HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nconnection: close\r\n\r\n"
    ).encode()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(request)
            got = b""
            while not got.endswith(BODY):
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def journal_rows(db: Path, after_seq: int):
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(
            "SELECT seq, invocation_id, kind, recorded_at_ms FROM events WHERE seq > ? "
            "ORDER BY seq",
            (after_seq,),
        ).fetchall()
    finally:
        conn.close()


def last_seq(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0]
    finally:
        conn.close()


def stage_gaps(db: Path, after_seq: int) -> dict[str, float]:
    """Mean gap (ms) from each stage record to the next, over the invocations recorded
    after `after_seq` (one at a time, so each gap is that invocation's own)."""
    by_inv: dict[str, list[tuple[str, int]]] = {}
    for _, inv, kind, at in journal_rows(db, after_seq):
        if inv.startswith("inv_"):
            by_inv.setdefault(inv, []).append((kind, at))
    sums: dict[str, list[int]] = {}
    order: list[str] = []
    for events in by_inv.values():
        for (k0, t0), (k1, t1) in zip(events, events[1:]):
            key = f"{k0} -> {k1}"
            if key not in sums:
                order.append(key)
            sums.setdefault(key, []).append(t1 - t0)
    return {k: statistics.mean(sums[k]) for k in order}


# --------------------------------------------------------------------------------------
# The MCP side: the official Python SDK
# --------------------------------------------------------------------------------------


class Load:
    def __init__(self, postern: str, socket_path: Path, url: str):
        self.postern = postern
        self.socket = socket_path
        self.url = url

    async def open_sessions(self, stack: AsyncExitStack, n: int):
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        params = StdioServerParameters(
            command=self.postern, args=["mcp", "--socket", str(self.socket)]
        )

        async def one():
            read, write = await stack.enter_async_context(stdio_client(params))
            session = await stack.enter_async_context(ClientSession(read, write))
            await session.initialize()
            await session.list_tools()
            return session

        # One after another, in this task: anyio requires each context to be left in the
        # task that entered it.
        return [await one() for _ in range(n)]

    def arguments(self, tool: str):
        if tool == "http_request":
            return {"url": self.url, "method": "GET"}
        return {}

    async def run(self, sessions, tool: str, per_session: int, seconds: float, max_calls: int):
        args = self.arguments(tool)
        latencies: list[float] = []
        failures: list[str] = []
        deadline = time.perf_counter() + seconds
        budget = [max_calls]

        async def worker(session):
            while time.perf_counter() < deadline and budget[0] > 0:
                budget[0] -= 1
                t = time.perf_counter()
                result = await session.call_tool(tool, args)
                latencies.append(time.perf_counter() - t)
                if tool == "http_request":
                    outcome = (result.structured_content or {}).get("outcome")
                    if result.is_error or outcome != "committed":
                        failures.append(json.dumps(result.structured_content)[:300])

        start = time.perf_counter()
        await asyncio.gather(*(worker(s) for s in sessions for _ in range(per_session)))
        elapsed = time.perf_counter() - start
        return latencies, failures, elapsed


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


def bridge_pids(daemon_pid: int) -> list[int]:
    """`postern mcp` processes that are children of this script."""
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == daemon_pid:
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == me and "postern" in stat.split("(", 1)[1].split(")", 1)[0]:
                pids.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return pids


async def phase(load: Load, daemon_pid: int, origin_pid: int, db: Path, name: str, tool: str,
                sessions: int, per_session: int, seconds: float, max_calls: int,
                warmup: float) -> dict:
    async with AsyncExitStack() as stack:
        opened = await load.open_sessions(stack, sessions)
        if warmup > 0:
            await load.run(opened, tool, per_session, warmup, max_calls)
        bridges = bridge_pids(daemon_pid)
        seq0 = last_seq(db)
        (user0, sys0) = user_sys_ms(daemon_pid)
        writes0, written0 = io_counts(daemon_pid)
        bcpu0 = sum(cpu_ms(p) for p in bridges)
        ocpu0, me0, (busy0, total0) = cpu_ms(origin_pid), time.process_time(), machine_busy_ms()
        kcpu0 = named_cpu_ms(KEYCHAIN_PROCESSES)
        latencies, failures, elapsed = await load.run(opened, tool, per_session, seconds, max_calls)
        (user1, sys1) = user_sys_ms(daemon_pid)
        writes1, written1 = io_counts(daemon_pid)
        bcpu1 = sum(cpu_ms(p) for p in bridges)
        ocpu1, me1, (busy1, total1) = cpu_ms(origin_pid), time.process_time(), machine_busy_ms()
        kcpu1 = named_cpu_ms(KEYCHAIN_PROCESSES)
        calls = len(latencies)
        result = {
            "phase": name,
            "tool": tool,
            "sessions": sessions,
            "in_flight_per_session": per_session,
            "calls": calls,
            "seconds": round(elapsed, 2),
            "calls_per_s": round(calls / elapsed, 1),
            "p50_ms": round(percentile(latencies, 0.5) * 1000, 2),
            "p99_ms": round(percentile(latencies, 0.99) * 1000, 2),
            "daemon_cpu_ms_per_call": round((user1 + sys1 - user0 - sys0) / max(calls, 1), 3),
            # Of that, the kernel's share (stime).
            "daemon_sys_ms_per_call": round((sys1 - sys0) / max(calls, 1), 3),
            # Write syscalls and KiB the daemon handed the kernel (journal WAL frames,
            # sockets), per call.
            "daemon_writes_per_call": round((writes1 - writes0) / max(calls, 1), 1),
            "daemon_kib_written_per_call": round((written1 - written0) / 1024 / max(calls, 1), 1),
            "bridge_cpu_ms_per_call": round((bcpu1 - bcpu0) / max(calls, 1), 3),
            "client_cpu_ms_per_call": round((me1 - me0) * 1000 / max(calls, 1), 3),
            "origin_cpu_ms_per_call": round((ocpu1 - ocpu0) / max(calls, 1), 3),
            # gnome-keyring-daemon and the session bus it is reached through.
            "keychain_cpu_ms_per_call": round((kcpu1 - kcpu0) / max(calls, 1), 3),
            # Every process and the kernel, both cores, per call.
            "machine_cpu_ms_per_call": round((busy1 - busy0) / max(calls, 1), 3),
            # Of both cores: 1.0 is the machine saturated.
            "machine_busy": round((busy1 - busy0) / max(total1 - total0, 1), 2),
            "failures": len(failures),
            "first_seq": seq0,
        }
        if failures:
            result["first_failure"] = failures[0]
        return result


PHASES = {
    # name: (tool, sessions, in flight per session)
    "list_targets_32": ("list_targets", 32, 1),
    # One call at a time of a tool that runs nothing: the MCP round trip alone (client,
    # bridge, framing), to tell it apart from what an action adds in `serial`.
    "list_targets_serial": ("list_targets", 1, 1),
    "serial": ("http_request", 1, 1),
    "one_session_8": ("http_request", 1, 8),
    "one_session_32": ("http_request", 1, 32),
    "sessions_8": ("http_request", 8, 1),
    "sessions_16": ("http_request", 16, 1),
    "sessions_32": ("http_request", 32, 1),
    "sessions_64": ("http_request", 64, 1),
}


async def main_async(args) -> int:
    work = Path(tempfile.mkdtemp(prefix="postern-load-", dir=args.work_dir))
    data = work / "data"
    service = f"postern-load-{os.getpid()}-{time.time_ns()}"
    origin, port = start_origin(work)
    daemon = None
    results = []
    try:
        keychain = ["--keychain", args.keychain, "--keychain-service", service]
        data.mkdir(mode=0o700)
        subprocess.run(
            [args.postern, "vault", "set", "api-key", "--data-dir", str(data), *keychain],
            input=b"load-secret-value\n", check=True, stdout=subprocess.DEVNULL,
        )
        config = work / "postern.toml"
        config.write_text(
            f'[[http]]\nname = "api"\nbase_url = "http://127.0.0.1:{port}/v1"\n'
            'methods = ["GET"]\ncredential = "api-key"\n'
            'inject = { header = "Authorization", format = "Bearer {secret}" }\n'
            'approval = "none"\nidempotent_methods = ["GET"]\n'
        )
        sock = data / "run" / "postern.sock"
        env = dict(os.environ)
        env["XDG_STATE_HOME"] = str(work / "state")
        daemon = subprocess.Popen(
            [args.postern, "daemon", "--data-dir", str(data), "--config", str(config), *keychain],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=open(work / "daemon.log", "wb"), env=env,
        )
        for _ in range(300):
            if sock.exists():
                break
            if daemon.poll() is not None:
                raise SystemExit("the daemon exited: " + (work / "daemon.log").read_text())
            time.sleep(0.05)
        load = Load(args.postern, sock, f"http://127.0.0.1:{port}/v1/items")
        db = data / "journal.db"
        if args.perf_phase:
            print(f"daemon pid {daemon.pid}", flush=True)

        for name in args.phases:
            tool, sessions, per_session = PHASES[name]
            seconds = args.seconds
            r = await phase(load, daemon.pid, origin.pid, db, name, tool, sessions, per_session,
                            seconds, args.max_calls, args.warmup)
            if name == "serial":
                r["stage_gaps_ms"] = {k: round(v, 3) for k, v in
                                      stage_gaps(db, r["first_seq"]).items()}
                r["direct_get_ms"] = round(direct_get_ms(port), 3)
                r["fsync_ms"] = round(fsync_ms(data), 3)
                r["overhead_ms"] = round(r["p50_ms"] - r["direct_get_ms"], 3)
            del r["first_seq"]
            results.append(r)
            print(json.dumps(r), flush=True)
    finally:
        if daemon is not None:
            daemon.terminate()
            try:
                daemon.wait(10)
            except subprocess.TimeoutExpired:
                daemon.kill()
            subprocess.run(
                [args.postern, "vault", "rm", "api-key", "--data-dir", str(data),
                 "--keychain", args.keychain, "--keychain-service", service],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
        origin.kill()
        origin.wait()
        if not args.keep:
            subprocess.run(["rm", "-rf", str(work)])

    print()
    print(f"{'phase':<18}{'tool':<14}{'sess':>5}{'inflt':>6}{'calls':>8}{'calls/s':>9}"
          f"{'p50 ms':>8}{'p99 ms':>8}{'daemon':>8}{'kernel':>8}{'bridges':>8}{'client':>8}{'origin':>8}"
          f"{'keychn':>8}{'all':>7}{'busy':>6}{'wr/call':>8}{'KiB/call':>9}")
    print(f"{'':<18}{'':<14}{'':>5}{'':>6}{'':>8}{'':>9}{'':>8}{'':>8}"
          f"{'-- CPU ms per call (kernel: of the daemon; all: whole machine) --':>63}")
    for r in results:
        print(f"{r['phase']:<18}{r['tool']:<14}{r['sessions']:>5}"
              f"{r['sessions'] * r['in_flight_per_session']:>6}{r['calls']:>8}"
              f"{r['calls_per_s']:>9}{r['p50_ms']:>8}{r['p99_ms']:>8}"
              f"{r['daemon_cpu_ms_per_call']:>8}{r['daemon_sys_ms_per_call']:>8}"
              f"{r['bridge_cpu_ms_per_call']:>8}"
              f"{r['client_cpu_ms_per_call']:>8}{r['origin_cpu_ms_per_call']:>8}"
              f"{r['keychain_cpu_ms_per_call']:>8}{r['machine_cpu_ms_per_call']:>7}"
              f"{r['machine_busy']:>6}{r['daemon_writes_per_call']:>8}"
              f"{r['daemon_kib_written_per_call']:>9}")
    for r in results:
        if r["phase"] == "serial":
            print(f"\nserial: p50 {r['p50_ms']} ms through MCP, direct GET {r['direct_get_ms']} ms,"
                  f" overhead {r['overhead_ms']} ms; one fsync {r['fsync_ms']} ms")
            for k, v in r["stage_gaps_ms"].items():
                print(f"  {k:<50} {v:>7} ms")
    failed = [r for r in results if r["failures"]]
    for r in failed:
        print(f"FAILED calls in {r['phase']}: {r['failures']}; first: {r.get('first_failure')}")
    return 1 if failed else 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "origin":
        p = argparse.ArgumentParser()
        p.add_argument("origin")
        p.add_argument("--port-file", type=Path, required=True)
        a = p.parse_args()
        asyncio.run(_serve_origin(a.port_file))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--postern", required=True, help="the postern binary (release build)")
    p.add_argument("--keychain", default="secret-service",
                   choices=["secret-service", "keyutils"])
    p.add_argument("--seconds", type=float, default=10.0, help="measured time per phase")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured time per phase")
    p.add_argument("--max-calls", type=int, default=100_000, help="at most this many per phase")
    p.add_argument("--phases", nargs="+", default=list(PHASES), choices=list(PHASES))
    p.add_argument("--work-dir", default=None, help="where the temporary data dir goes")
    p.add_argument("--keep", action="store_true", help="keep the data dir")
    p.add_argument("--perf-phase", action="store_true", help="print the daemon's pid")
    args = p.parse_args()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
