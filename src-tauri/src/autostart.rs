//! Start at login: an XDG autostart entry (`$XDG_CONFIG_HOME/autostart/postern-console.desktop`,
//! see the freedesktop Desktop Application Autostart Specification) that starts this
//! console in the tray (`--background`) with the options it was started with. Written
//! and removed from the tray menu or with `postern-console --autostart enable|disable`;
//! nothing else writes it.

use std::path::{Path, PathBuf};

/// The entry's file name inside the autostart directory.
pub const ENTRY_FILE: &str = "postern-console.desktop";

/// Why the entry could not be read, written or removed.
#[derive(Debug, thiserror::Error)]
pub enum AutostartError {
    #[error("no config directory: neither XDG_CONFIG_HOME nor HOME is set to an absolute path")]
    NoConfigHome,
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    /// A desktop entry's Exec line cannot carry this argument (a control character).
    #[error("an argument of the console's command line cannot go into a desktop entry: {0:?}")]
    BadArgument(String),
}

/// The autostart directory of one config home.
#[derive(Debug, Clone)]
pub struct Autostart {
    dir: PathBuf,
}

impl Autostart {
    /// `$XDG_CONFIG_HOME/autostart`, or `~/.config/autostart` when XDG_CONFIG_HOME is
    /// unset or not absolute (as the specification says).
    pub fn from_env() -> Result<Autostart, AutostartError> {
        let absolute = |v: std::ffi::OsString| {
            let p = PathBuf::from(v);
            p.is_absolute().then_some(p)
        };
        let home = std::env::var_os("XDG_CONFIG_HOME")
            .and_then(absolute)
            .or_else(|| {
                std::env::var_os("HOME")
                    .and_then(absolute)
                    .map(|h| h.join(".config"))
            })
            .ok_or(AutostartError::NoConfigHome)?;
        Ok(Autostart::in_config_home(&home))
    }

    /// The autostart directory of the config home `config_home`.
    pub fn in_config_home(config_home: &Path) -> Autostart {
        Autostart {
            dir: config_home.join("autostart"),
        }
    }

    /// Where the entry lives.
    pub fn entry(&self) -> PathBuf {
        self.dir.join(ENTRY_FILE)
    }

    /// Whether the entry is there and not switched off (`Hidden=true`, or a desktop's
    /// own `X-GNOME-Autostart-enabled=false`).
    pub fn is_enabled(&self) -> bool {
        match std::fs::read_to_string(self.entry()) {
            Ok(text) => !text.lines().any(|l| {
                let l = l.trim();
                l == "Hidden=true" || l == "X-GNOME-Autostart-enabled=false"
            }),
            Err(_) => false,
        }
    }

    /// Writes the entry that runs `command` (the program, then its arguments) at login;
    /// replaces one that is there. Written to a temporary file and renamed, so a reader
    /// never sees half an entry.
    pub fn enable(&self, command: &[String]) -> Result<PathBuf, AutostartError> {
        let text = desktop_entry(command)?;
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| AutostartError::Io { path, source }
        };
        std::fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
        let entry = self.entry();
        let partial = self.dir.join(format!(".{ENTRY_FILE}.partial"));
        std::fs::write(&partial, text).map_err(io(&partial))?;
        std::fs::rename(&partial, &entry).map_err(io(&entry))?;
        Ok(entry)
    }

    /// Removes the entry; whether there was one.
    pub fn disable(&self) -> Result<bool, AutostartError> {
        let entry = self.entry();
        match std::fs::remove_file(&entry) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(AutostartError::Io {
                path: entry.display().to_string(),
                source,
            }),
        }
    }
}

/// The desktop entry that runs `command` at login.
pub fn desktop_entry(command: &[String]) -> Result<String, AutostartError> {
    let exec = command
        .iter()
        .map(|a| exec_argument(a))
        .collect::<Result<Vec<_>, _>>()?
        .join(" ");
    Ok(format!(
        "[Desktop Entry]\n\
         Type=Application\n\
         Name=Postern\n\
         Comment=Secret broker and approval console for AI agents, started in the tray\n\
         Exec={exec}\n\
         Icon=postern-console\n\
         Terminal=false\n\
         X-GNOME-Autostart-enabled=true\n"
    ))
}

/// One argument as the Exec key needs it (Desktop Entry Specification, "The Exec key"):
/// quoted when it holds a reserved character, with `"`, `` ` ``, `$` and `\` escaped
/// inside the quotes, `%` doubled (field codes), and then every backslash doubled again
/// because the whole value is also a string value with its own escapes.
fn exec_argument(arg: &str) -> Result<String, AutostartError> {
    if arg.is_empty() || arg.chars().any(char::is_control) {
        return Err(AutostartError::BadArgument(arg.to_string()));
    }
    const RESERVED: &[char] = &[
        ' ', '\t', '"', '\'', '\\', '>', '<', '~', '|', '&', ';', '$', '*', '?', '#', '(', ')', '`',
    ];
    let doubled_percent = arg.replace('%', "%%");
    let quoted = if arg.contains(RESERVED) {
        let mut q = String::from("\"");
        for c in doubled_percent.chars() {
            if matches!(c, '"' | '`' | '$' | '\\') {
                q.push('\\');
            }
            q.push(c);
        }
        q.push('"');
        q
    } else {
        doubled_percent
    };
    Ok(quoted.replace('\\', "\\\\"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn plain_arguments_go_in_as_they_are() {
        let entry = desktop_entry(&args(&[
            "/usr/bin/postern-console",
            "--background",
            "--data-dir",
            "/home/ada/.local/share/postern",
        ]))
        .unwrap();
        assert!(
            entry.contains(
                "\nExec=/usr/bin/postern-console --background --data-dir \
                 /home/ada/.local/share/postern\n"
            ),
            "{entry}"
        );
        assert!(entry.starts_with("[Desktop Entry]\nType=Application\n"));
    }

    #[test]
    fn reserved_characters_are_quoted_and_escaped_twice() {
        // A space quotes; `$` and `"` are escaped inside the quotes; the backslashes that
        // escape them are doubled for the string-value level; `%` is doubled.
        assert_eq!(
            exec_argument("/opt/my apps/x").unwrap(),
            "\"/opt/my apps/x\""
        );
        assert_eq!(exec_argument("a$b").unwrap(), "\"a\\\\$b\"");
        assert_eq!(
            exec_argument("say \"hi\"").unwrap(),
            "\"say \\\\\"hi\\\\\"\""
        );
        assert_eq!(exec_argument("c:\\d").unwrap(), "\"c:\\\\\\\\d\"");
        assert_eq!(exec_argument("50%").unwrap(), "50%%");
        assert_eq!(exec_argument("--k=v").unwrap(), "--k=v");
    }

    #[test]
    fn control_characters_and_empty_arguments_are_refused() {
        assert!(matches!(
            exec_argument("a\nHidden=true"),
            Err(AutostartError::BadArgument(_))
        ));
        assert!(matches!(
            exec_argument(""),
            Err(AutostartError::BadArgument(_))
        ));
        let dir = tempfile::tempdir().unwrap();
        let autostart = Autostart::in_config_home(dir.path());
        assert!(autostart.enable(&args(&["/bin/x", "a\rb"])).is_err());
        assert!(!autostart.entry().exists(), "nothing is written");
    }

    #[test]
    fn enable_writes_the_entry_and_disable_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        let autostart = Autostart::in_config_home(dir.path());
        assert!(!autostart.is_enabled());
        let path = autostart
            .enable(&args(&["/usr/bin/postern-console", "--background"]))
            .unwrap();
        assert_eq!(path, dir.path().join("autostart").join(ENTRY_FILE));
        assert!(autostart.is_enabled());
        // Enabling again replaces it.
        autostart
            .enable(&args(&["/usr/bin/postern-console", "--background"]))
            .unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path().join("autostart"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(ENTRY_FILE)]);
        assert!(autostart.disable().unwrap());
        assert!(!autostart.is_enabled());
        assert!(!autostart.disable().unwrap(), "nothing left to remove");
    }

    #[test]
    fn an_entry_a_desktop_switched_off_is_not_enabled() {
        let dir = tempfile::tempdir().unwrap();
        let autostart = Autostart::in_config_home(dir.path());
        autostart.enable(&args(&["/bin/postern-console"])).unwrap();
        let text = std::fs::read_to_string(autostart.entry()).unwrap();
        std::fs::write(
            autostart.entry(),
            text.replace(
                "X-GNOME-Autostart-enabled=true",
                "X-GNOME-Autostart-enabled=false",
            ),
        )
        .unwrap();
        assert!(!autostart.is_enabled());
    }
}
