"""An agent taken over by a prompt injection: tries every route to what Postern guards
and prints, as one JSON object, which ones were open. Run by crates/cli/tests/shield.rs
inside a shield and, as the control, outside one (where the routes must be open, or
the test proves nothing).

Argument: one JSON object naming what the attacker knows (paths, the bus address, the
display, the broker's pid, the keychain service, a loopback port)."""

import ctypes
import json
import os
import socket
import subprocess
import sys

known = json.loads(sys.argv[1])
results = {}


def attempt(name, fn):
    try:
        detail = fn()
        results[name] = {"open": True, "detail": str(detail)[:300]}
    except Exception as e:  # every failure is the route being closed
        results[name] = {"open": False, "detail": f"{type(e).__name__}: {e}"[:300]}


def connect_unix(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    s.connect(path)
    s.close()
    return f"connected to {path!r}"


def bus_env():
    env = dict(os.environ)
    env["DBUS_SESSION_BUS_ADDRESS"] = known["bus_address"]
    return env


def secret_tool():
    out = subprocess.run(
        ["secret-tool", "search", "--all", "service", known["service"]],
        env=bus_env(), capture_output=True, text=True, errors="replace", timeout=20,
    )
    if out.returncode != 0 or not out.stdout.strip():
        raise PermissionError(f"secret-tool exit {out.returncode}: {out.stderr.strip()[:200]}")
    return out.stdout


def secretstorage_items():
    os.environ["DBUS_SESSION_BUS_ADDRESS"] = known["bus_address"]
    import secretstorage
    conn = secretstorage.dbus_init()
    found = []
    for item in secretstorage.search_items(conn, {"service": known["service"]}):
        found.append(item.get_secret().decode(errors="replace"))
    if not found:
        raise PermissionError("no items")
    return found


libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def keyctl(*args):
    nr = {"x86_64": 250, "aarch64": 219}[os.uname().machine]
    r = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


def keyrings():
    # KEYCTL_GET_KEYRING_ID of the session (-3) and user (-4) keyrings, then the keys
    # linked in them (KEYCTL_READ = 11).
    ids = []
    for spec in (-3, -4):
        ring = keyctl(0, spec, 0)
        buf = ctypes.create_string_buffer(4096)
        n = libc.syscall(250 if os.uname().machine == "x86_64" else 219,
                         ctypes.c_long(11), ctypes.c_long(ring), buf, ctypes.c_long(4096))
        ids.append((ring, n))
    return ids


def read_file(path):
    with open(path, "rb") as f:
        return f.read(64)


def listing(path):
    entries = os.listdir(path)
    if not entries:
        raise FileNotFoundError("empty")
    return entries


def data_dir():
    entries = set(os.listdir(known["data_dir"]))
    if entries <= {"run"}:
        inside = set(os.listdir(os.path.join(known["data_dir"], "run")))
        if inside <= {"postern.sock"}:
            raise PermissionError(f"only {sorted(entries | inside)}")
    return sorted(entries)


def broker_memory():
    pid = known["broker_pid"]
    with open(f"/proc/{pid}/maps") as maps:
        first = maps.readline()
    start = int(first.split("-")[0], 16)
    with open(f"/proc/{pid}/mem", "rb") as mem:
        mem.seek(start)
        return mem.read(16).hex()


def signal_broker():
    os.kill(known["broker_pid"], 0)
    return "signal 0 delivered"


def append(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        f.write("# an attacker was here\n")
    return f"wrote {path}"


def loopback():
    s = socket.create_connection(("127.0.0.1", known["loopback_port"]), timeout=2)
    s.close()
    return "connected"


def x11(abstract):
    display = known.get("display")
    if not display:
        raise LookupError("no display in this environment")
    n = display.lstrip(":").split(".")[0]
    path = f"/tmp/.X11-unix/X{n}"
    return connect_unix(("\0" + path) if abstract else path)


home = known["home"]
attempt("secret_service_socket", lambda: connect_unix(known["bus_path"]))
attempt("secret_tool", secret_tool)
attempt("python_secretstorage", secretstorage_items)
attempt("kernel_keyrings", keyrings)
attempt("journal", lambda: read_file(os.path.join(known["data_dir"], "journal.db")))
attempt("data_dir", data_dir)
attempt("targets_file", lambda: read_file(known["config"]))
attempt("audit_anchor", lambda: listing(known["anchor_dir"]))
attempt("keyring_files", lambda: listing(known["keyrings_dir"]))
attempt("operator_socket", lambda: connect_unix(known["operator_socket"]))
attempt("x11_socket", lambda: x11(False))
attempt("x11_abstract_socket", lambda: x11(True))
attempt("broker_memory", broker_memory)
attempt("signal_broker", signal_broker)
attempt("write_bashrc", lambda: append(os.path.join(home, ".bashrc")))
attempt("write_autostart", lambda: append(os.path.join(home, ".config/autostart/x.desktop")))
attempt("ssh_key", lambda: read_file(os.path.join(home, ".ssh/id_ed25519")))
attempt("loopback_listener", loopback)
print(json.dumps(results))
