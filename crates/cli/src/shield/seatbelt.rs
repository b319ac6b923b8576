//! The macOS shield: a Seatbelt profile for `sandbox-exec` with the Linux shield's
//! intent (no keychain, no Postern data, no display server, no start-up files, the
//! working directory writable, Postern's agent socket reachable). Written and checked for
//! form here; not yet exercised on a Mac, and a session started this way is recorded as
//! unconfined, because the broker cannot inspect a Seatbelt sandbox the way it inspects a
//! Linux one.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// What the profile is made from.
#[derive(Debug, Clone)]
pub struct SeatbeltHost {
    pub home: PathBuf,
    pub cwd: PathBuf,
    pub agent_socket: PathBuf,
    /// Postern's data dir, config and anchors, and the user's other secrets.
    pub hidden: Vec<PathBuf>,
    pub writable: Vec<PathBuf>,
    pub broker_only: bool,
}

/// The mach services that would hand the agent a secret or the screen: the keychain's
/// (securityd), the pasteboard, the window server and the accessibility API.
const DENIED_SERVICES: &[&str] = &[
    "com.apple.SecurityServer",
    "com.apple.securityd.xpc",
    "com.apple.security.agent",
    "com.apple.security.authhost",
    "com.apple.pasteboard.1",
    "com.apple.windowserver.active",
    "com.apple.accessibility.AXBackingStore",
];

/// A quoted SBPL string.
fn quoted(path: &Path) -> String {
    let text = path.display().to_string();
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The profile text (SBPL). Later rules win over earlier ones.
pub fn profile(host: &SeatbeltHost) -> String {
    let mut p = String::from("(version 1)\n(allow default)\n");
    let _ = writeln!(p, "(deny file-write* (subpath {}))", quoted(&host.home));
    let mut writable = vec![host.cwd.clone()];
    writable.extend(host.writable.iter().cloned());
    for w in &writable {
        let _ = writeln!(p, "(allow file-write* (subpath {}))", quoted(w));
    }
    for rel in super::plan::STARTUP {
        let _ = writeln!(
            p,
            "(deny file-write* (subpath {}))",
            quoted(&host.home.join(rel))
        );
    }
    let keychains = host.home.join("Library/Keychains");
    for hidden in host.hidden.iter().chain(std::iter::once(&keychains)) {
        let _ = writeln!(
            p,
            "(deny file-read* file-write* (subpath {}))",
            quoted(hidden)
        );
    }
    for service in DENIED_SERVICES {
        let _ = writeln!(p, "(deny mach-lookup (global-name \"{service}\"))");
    }
    let _ = writeln!(p, "(deny signal (target others))");
    let _ = writeln!(p, "(deny process-info* (target others))");
    if host.broker_only {
        let _ = writeln!(p, "(deny network-outbound (remote ip))");
    }
    let socket = quoted(&host.agent_socket);
    let _ = writeln!(p, "(allow file-read* file-write* (literal {socket}))");
    let _ = writeln!(
        p,
        "(allow network-outbound (remote unix-socket (path-literal {socket})))"
    );
    p
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn host() -> SeatbeltHost {
        SeatbeltHost {
            home: "/Users/u".into(),
            cwd: "/Users/u/src/app".into(),
            agent_socket: "/Users/u/Library/Application Support/postern/run/postern.sock".into(),
            hidden: vec!["/Users/u/Library/Application Support/postern".into()],
            writable: vec!["/Users/u/.claude".into()],
            broker_only: true,
        }
    }

    #[test]
    fn the_profile_is_balanced_and_lets_in_only_the_agent_socket() {
        let p = profile(&host());
        let depth = p.chars().try_fold(0i32, |d, c| {
            let d = d + i32::from(c == '(') - i32::from(c == ')');
            (d >= 0).then_some(d)
        });
        assert_eq!(depth, Some(0), "{p}");
        assert!(p.starts_with("(version 1)\n(allow default)\n"));
        assert!(p.contains("(deny mach-lookup (global-name \"com.apple.SecurityServer\"))"));
        assert!(p.contains(
            "(deny file-read* file-write* (subpath \"/Users/u/Library/Application Support/postern\"))"
        ));
        assert!(p.contains("(deny network-outbound (remote ip))"));
        // The socket is allowed after the data dir is denied: the later rule wins.
        let deny = p.find("(deny file-read* file-write* (subpath \"/Users/u/Library/Application Support/postern\"))").unwrap();
        let allow = p
            .find("(allow network-outbound (remote unix-socket")
            .unwrap();
        assert!(deny < allow);
        assert!(p.contains("(deny file-write* (subpath \"/Users/u/.zshrc\"))"));
    }

    #[test]
    fn a_quote_in_a_path_cannot_end_the_string() {
        assert_eq!(quoted(Path::new("/a\"b\\c")), "\"/a\\\"b\\\\c\"");
    }
}
