//! The Debian package, installed as a person would install it: `dpkg -i` on the .deb
//! that `scripts/package.sh` built (`POSTERN_DEB` names it; `scripts/test.sh` builds it
//! once and sets it), then what it put where, the single-user daemon started from its
//! user unit's ExecStart line (CI has no user systemd), one agent call through the
//! installed `postern mcp`, the installer for the privilege-separated mode from its
//! packaged place, and `dpkg --purge` leaving none of the package's files behind.
//!
//! It installs into the real system, so it needs root and refuses to run over a
//! `postern` package that is already installed. Not root: it says so and passes. No
//! `POSTERN_DEB`: it fails when `POSTERN_REQUIRE_PACKAGE_TEST=1` (scripts/test.sh), and
//! otherwise says so and passes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use postern_tests::adversary::{Adversary, Behavior};
use postern_tests::agent::{self, structured};
use postern_tests::fixture::test_service;

const CANARY: &str = "pstn-package-canary-0c7a";
const PACKAGE: &str = "postern";

/// What the package installs (besides the icons).
const FILES: &[&str] = &[
    "/usr/bin/postern",
    "/usr/bin/postern-console",
    "/usr/share/applications/Postern.desktop",
    "/usr/lib/systemd/system/postern.service",
    "/usr/lib/systemd/user/postern.service",
    "/usr/lib/postern/install-system",
    "/usr/share/doc/postern/README.md",
    "/usr/share/doc/postern/examples/postern.toml",
];

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:\t0\t"))
}

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"))
}

fn installed() -> bool {
    let out = run("dpkg-query", &["-W", "-f=${Status}", PACKAGE]);
    String::from_utf8_lossy(&out.stdout).contains("install ok installed")
}

/// The .deb to test, or `None` (said loudly) when this test cannot run here.
fn deb_under_test() -> Option<PathBuf> {
    package_under_test("POSTERN_DEB", "dpkg")
}

/// The package `variable` names, or `None` (said loudly) when this test cannot run
/// here: not root (`installer` cannot install), or no package named.
fn package_under_test(variable: &str, installer: &str) -> Option<PathBuf> {
    if !running_as_root() {
        eprintln!(
            "\n*** the package test SKIPPED: not root, so {installer} cannot install; \
             {variable} is NOT tested here ***\n"
        );
        return None;
    }
    match std::env::var_os(variable).filter(|v| !v.is_empty()) {
        // A relative path is read from the workspace root, where scripts run; the test
        // itself runs in its crate's directory.
        Some(package) => Some(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(package),
        ),
        None => {
            let required =
                std::env::var_os("POSTERN_REQUIRE_PACKAGE_TEST").is_some_and(|v| v == "1");
            assert!(
                !required,
                "POSTERN_REQUIRE_PACKAGE_TEST=1 but {variable} is not set: build the package \
                 with scripts/package.sh and name it in {variable}"
            );
            eprintln!(
                "\n*** the package test SKIPPED: {variable} is not set (scripts/package.sh \
                 builds it; scripts/test.sh sets it) ***\n"
            );
            None
        }
    }
}

/// Purges the package on drop, also when the test fails half-way.
struct Purge;

impl Drop for Purge {
    fn drop(&mut self) {
        if installed() {
            let _ = run("dpkg", &["--purge", PACKAGE]);
        }
    }
}

/// A process killed (by PID) on drop.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Throwaway accounts removed (by name) on drop.
struct Accounts(Vec<(&'static str, String)>);

impl Drop for Accounts {
    fn drop(&mut self) {
        for (kind, name) in &self.0 {
            let _ = run(
                if *kind == "user" {
                    "userdel"
                } else {
                    "groupdel"
                },
                &[name],
            );
        }
    }
}

/// The ExecStart line of a unit file, continuation lines joined, split into words.
fn exec_start(unit: &str) -> Vec<String> {
    let joined = unit.replace("\\\n", " ");
    let line = joined
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .unwrap_or_else(|| panic!("no ExecStart in\n{unit}"));
    line.split_whitespace().map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deb_installs_serves_an_agent_from_its_user_unit_and_purges_cleanly() {
    let Some(deb) = deb_under_test() else { return };
    assert!(deb.is_file(), "{} is not a file", deb.display());
    assert!(
        !installed(),
        "a {PACKAGE} package is already installed here; this test would replace and then \
         remove it, so it stops"
    );
    let users_before = run("getent", &["passwd"]).stdout;
    let _purge = Purge;

    // Install.
    let out = run("dpkg", &["-i", deb.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "dpkg -i failed (missing dependencies? `apt install ./{}` resolves them): {}",
        deb.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(installed());
    for file in FILES {
        assert!(Path::new(file).is_file(), "{file} was not installed");
    }
    for exe in [
        "/usr/bin/postern",
        "/usr/bin/postern-console",
        "/usr/lib/postern/install-system",
    ] {
        let mode = std::fs::metadata(exe).unwrap().permissions().mode();
        assert_eq!(mode & 0o111, 0o111, "{exe} is not executable ({mode:o})");
    }
    let desktop = std::fs::read_to_string("/usr/share/applications/Postern.desktop").unwrap();
    for line in [
        "Exec=postern-console",
        "Icon=postern-console",
        "Name=Postern",
    ] {
        assert!(desktop.lines().any(|l| l == line), "{line} in\n{desktop}");
    }
    assert!(
        Path::new("/usr/share/icons/hicolor/128x128/apps/postern-console.png").is_file(),
        "no menu icon"
    );
    // `postern` is on PATH.
    let out = Command::new("postern")
        .arg("--version")
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    // Both units run the installed binary; nothing was enabled or created.
    let system = std::fs::read_to_string("/usr/lib/systemd/system/postern.service").unwrap();
    let user = std::fs::read_to_string("/usr/lib/systemd/user/postern.service").unwrap();
    assert_eq!(exec_start(&system)[..2], ["/usr/bin/postern", "daemon"]);
    assert_eq!(exec_start(&user), ["/usr/bin/postern", "daemon"]);
    assert!(!Path::new("/etc/systemd/system/multi-user.target.wants/postern.service").exists());
    assert_eq!(
        run("getent", &["passwd"]).stdout,
        users_before,
        "installing made or changed an account"
    );
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok()
    {
        let out = run(
            "systemd-analyze",
            &["verify", "/usr/lib/systemd/system/postern.service"],
        );
        assert!(out.status.success(), "{out:?}");
    }

    // The single-user daemon, started as its user unit says (with the test's own
    // keychain namespace in the kernel keyring), serves one agent call through the
    // installed `postern mcp`.
    let server = Adversary::start(Behavior::ok_json("{\"ok\":true}"))
        .await
        .unwrap();
    let home = tempfile::tempdir().unwrap();
    let data = home.path().join(".local/share/postern");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(
        data.join("postern.toml"),
        format!(
            "[[http]]\nname = \"api\"\nbase_url = \"{}/v1\"\nmethods = [\"GET\"]\n\
             credential = \"api-key\"\ninject = {{ header = \"Authorization\", format = \
             \"Bearer {{secret}}\" }}\napproval = \"none\"\n",
            server.base_url()
        ),
    )
    .unwrap();
    let service = test_service();
    let keychain = ["--keychain", "keyutils", "--keychain-service", &service];
    let as_user = |program: &str| {
        let mut c = Command::new(program);
        c.env("HOME", home.path())
            .env_remove("XDG_DATA_HOME")
            .env("XDG_STATE_HOME", home.path().join(".local/state"));
        c
    };
    let set = postern_tests::run_with_stdin(
        as_user("/usr/bin/postern")
            .args(["vault", "set", "api-key"])
            .args(keychain),
        CANARY.as_bytes(),
    )
    .unwrap();
    assert!(set.status.success(), "{set:?}");
    let line = exec_start(&user);
    let daemon = Process(
        as_user(&line[0])
            .args(&line[1..])
            .args(keychain)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let socket = data.join("run/postern.sock");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "the daemon never made its socket"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let client = agent::connect(Path::new("/usr/bin/postern"), &socket)
        .await
        .unwrap();
    let answer = agent::call(
        &client,
        "http_request",
        json!({"url": server.url("/v1/items"), "method": "GET"}),
    )
    .await
    .unwrap();
    assert!(answer.is_error != Some(true), "{answer:?}");
    assert_eq!(structured(&answer)["status"], 200, "{answer:?}");
    let seen = server.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {CANARY}").as_str())
    );
    let _ = client.cancel().await;
    drop(daemon);

    // The privilege-separated mode's installer runs from its packaged place, using the
    // package's binary where it is (names and directories moved to throwaway ones).
    let tag = std::process::id() % 100_000;
    let accounts = Accounts(vec![
        ("user", format!("postern-t-pkg-{tag}")),
        ("group", format!("postern-t-pkgops-{tag}")),
    ]);
    let tree = tempfile::tempdir().unwrap();
    let out = Command::new("/usr/lib/postern/install-system")
        .arg("--no-start")
        .env("POSTERN_INSTALL_USER", &accounts.0[0].1)
        .env("POSTERN_INSTALL_GROUP", &accounts.0[1].1)
        .env("POSTERN_INSTALL_STATE_DIR", tree.path().join("state"))
        .env("POSTERN_INSTALL_ETC_DIR", tree.path().join("etc"))
        .env("POSTERN_INSTALL_UNIT_DIR", tree.path().join("units"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("using /usr/bin/postern where it is"),
        "{said}"
    );
    let unit = std::fs::read_to_string(tree.path().join("units/postern.service")).unwrap();
    assert_eq!(exec_start(&unit)[0], "/usr/bin/postern");
    assert!(
        unit.lines()
            .any(|l| l == format!("User={}", accounts.0[0].1))
    );
    assert!(
        tree.path().join("etc/vault.key").exists()
            || tree.path().join("etc/vault.key.cred").exists(),
        "no vault key"
    );
    drop(accounts);

    // Purge: none of the package's files stay.
    let out = run("dpkg", &["--purge", PACKAGE]);
    assert!(out.status.success(), "{out:?}");
    assert!(!installed());
    for file in FILES {
        assert!(!Path::new(file).exists(), "{file} stayed after purge");
    }
    assert!(!Path::new("/usr/lib/postern").exists());
    assert!(!Path::new("/usr/share/icons/hicolor/128x128/apps/postern-console.png").exists());
}

/// The RPM's payload and scriptlets. CI runs Debian, so the RPM is installed with `rpm`
/// into a scratch root (`--root`, its own database, no dependency check) without its
/// scriptlets (a scratch root has no shell to run them in); what they do is checked by
/// reading them.
#[test]
fn the_rpm_holds_what_the_deb_installs_and_its_payload_installs_and_erases_cleanly() {
    let Some(rpm) = package_under_test("POSTERN_RPM", "rpm") else {
        return;
    };
    assert!(rpm.is_file(), "{} is not a file", rpm.display());
    let rpm = rpm.to_str().unwrap();
    let query = |format: &str| {
        let out = run("rpm", &["-qp", "--qf", format, rpm]);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(query("%{NAME}"), PACKAGE);
    // The same files as the .deb, executables executable.
    let listed = query("[%{FILEMODES:perms} %{FILENAMES}\\n]");
    let modes: std::collections::HashMap<&str, &str> = listed
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(mode, path)| (path, mode)))
        .collect();
    for file in FILES {
        assert!(
            modes.contains_key(file),
            "{file} is not in the RPM:\n{listed}"
        );
    }
    for binary in [
        "/usr/bin/postern",
        "/usr/bin/postern-console",
        "/usr/lib/postern/install-system",
    ] {
        assert_eq!(modes[binary], "-rwxr-xr-x", "{binary}");
    }
    // Erasing stops the privilege-separated service first and removes the package's
    // own directories (the bundler lists files, not directories).
    let scripts = String::from_utf8(run("rpm", &["-qp", "--scripts", rpm]).stdout).unwrap();
    assert!(scripts.contains("preuninstall scriptlet"), "{scripts}");
    assert!(
        scripts.contains("systemctl disable --now postern.service"),
        "{scripts}"
    );
    assert!(scripts.contains("postuninstall scriptlet"), "{scripts}");
    assert!(scripts.contains("rmdir"), "{scripts}");

    let root = tempfile::tempdir().unwrap();
    let root_arg = root.path().to_str().unwrap();
    let rpm_in_root = |args: &[&str]| {
        let mut all = vec!["--root", root_arg, "--dbpath", "/var/lib/rpm"];
        all.extend_from_slice(args);
        let out = run("rpm", &all);
        assert!(out.status.success(), "rpm {all:?}: {out:?}");
        out
    };
    rpm_in_root(&["--initdb"]);
    rpm_in_root(&["-i", "--nodeps", "--noscripts", rpm]);
    for file in FILES {
        let at = root.path().join(file.trim_start_matches('/'));
        assert!(at.is_file(), "{file} was not installed");
    }
    let version = rpm_in_root(&["-q", PACKAGE]);
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("postern-"));
    rpm_in_root(&["-e", "--noscripts", PACKAGE]);
    for file in FILES {
        let at = root.path().join(file.trim_start_matches('/'));
        assert!(!at.exists(), "{file} stayed after erase");
    }
}
