//! Tauri's build step, with `tauri.conf.json` at the repository root: tauri-build reads
//! the config (and the icons it names) relative to the working directory, so it runs
//! from the root; the capabilities stay with this crate.

fn main() {
    let crate_dir =
        std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let root = crate_dir.join("..");
    if let Err(e) = std::env::set_current_dir(&root) {
        eprintln!("cannot enter the repository root {}: {e}", root.display());
        std::process::exit(1);
    }
    println!("cargo:rerun-if-changed=../tauri.conf.json");
    println!("cargo:rerun-if-changed=capabilities");
    println!("cargo:rerun-if-changed=src/commands_list.rs");
    // The app's own commands get permissions (`allow-<command>`), so the capability file
    // grants them to the main window only.
    let manifest = tauri_build::AppManifest::new().commands(postern_commands::COMMANDS);
    let result = tauri_build::try_build(
        tauri_build::Attributes::new()
            .capabilities_path_pattern("./src-tauri/capabilities/**/*")
            .app_manifest(manifest),
    );
    if let Err(e) = result {
        eprintln!("tauri build: {e:#}");
        std::process::exit(1);
    }
}

mod postern_commands {
    include!("src/commands_list.rs");
}
