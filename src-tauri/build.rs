//! Tauri's build step, with `tauri.conf.json` at the repository root. tauri-build reads
//! the config, the icons, `Cargo.toml` and the capabilities relative to the working
//! directory and writes generated schemas and permissions there, so it runs in a
//! staging directory inside OUT_DIR whose entries link to the real files: the generated
//! files stay out of the source tree.

use std::path::{Path, PathBuf};

fn link(target: &Path, link: &Path) -> std::io::Result<()> {
    if std::fs::symlink_metadata(link).is_ok() {
        std::fs::remove_file(link).or_else(|_| std::fs::remove_dir(link))?;
    }
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(target, link)
    }
    // Windows tells file and directory links apart (creating them needs Developer Mode
    // or an administrator, as on CI runners).
    #[cfg(windows)]
    {
        if target.is_dir() {
            std::os::windows::fs::symlink_dir(target, link)
        } else {
            std::os::windows::fs::symlink_file(target, link)
        }
    }
}

fn stage() -> std::io::Result<PathBuf> {
    let crate_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let root = crate_dir.join("..").canonicalize()?;
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    let staging = out.join("tauri-root");
    std::fs::create_dir_all(&staging)?;
    for name in ["tauri.conf.json", "icons", "ui"] {
        link(&root.join(name), &staging.join(name))?;
    }
    for name in ["Cargo.toml", "capabilities"] {
        link(&crate_dir.join(name), &staging.join(name))?;
    }
    Ok(staging)
}

fn main() {
    println!("cargo:rerun-if-changed=../tauri.conf.json");
    println!("cargo:rerun-if-changed=../icons");
    println!("cargo:rerun-if-changed=capabilities");
    println!("cargo:rerun-if-changed=src/commands_list.rs");
    let entered = stage().and_then(std::env::set_current_dir);
    if let Err(e) = entered {
        eprintln!("cannot stage the Tauri build directory: {e}");
        std::process::exit(1);
    }
    // The app's own commands get permissions (`allow-<command>`), so the capability file
    // grants them to the main window only.
    let manifest = tauri_build::AppManifest::new().commands(postern_commands::COMMANDS);
    let result = tauri_build::try_build(tauri_build::Attributes::new().app_manifest(manifest));
    if let Err(e) = result {
        eprintln!("tauri build: {e:#}");
        std::process::exit(1);
    }
}

mod postern_commands {
    include!("src/commands_list.rs");
}
