//! The webview settings that keep the idle console small. What each costs and saves is
//! measured by `scripts/console-memory.sh` and recorded in `docs/benchmarks.md`
//! ("Desktop console memory"); only settings that hold on a real GPU as well as under
//! Xvfb are applied.
//!
//! `POSTERN_WEBVIEW_SETTINGS` is for that benchmark: `none` applies none of them, a
//! comma-separated list of names applies only those; unset (or `shipped`) applies the
//! shipped set.

/// One setting the console can apply to its webview.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    /// WebKit's cache model for a single local page (WebKitWebContext
    /// WEBKIT_CACHE_MODEL_DOCUMENT_VIEWER): no memory cache of pages left behind, smaller
    /// decoded-resource caches. The console is one page served from the app.
    CacheModel,
    /// No accelerated compositing (WEBKIT_HARDWARE_ACCELERATION_POLICY_NEVER).
    NoAcceleration,
    /// No DMABUF renderer (`WEBKIT_DISABLE_DMABUF_RENDERER=1`): without compositing
    /// there is nothing for it to carry, but it still opens an EGL display (Mesa, and
    /// under Xvfb libLLVM) in the app's process. WebKit reads it only from the
    /// environment, before any webview exists: see [`reexec_with_environment`].
    NoDmabufRenderer,
}

impl Setting {
    pub const ALL: &'static [Setting] = &[
        Setting::CacheModel,
        Setting::NoAcceleration,
        Setting::NoDmabufRenderer,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Setting::CacheModel => "cache-model",
            Setting::NoAcceleration => "no-acceleration",
            Setting::NoDmabufRenderer => "no-dmabuf-renderer",
        }
    }
}

/// What the console ships with: no accelerated compositing, which took the idle
/// console from 316 to 239 MiB PSS under Xvfb (the web process from 189 to 111 MiB)
/// and holds on a real GPU too: WebKit then paints on the CPU, which a page of forms and
/// tables does not notice; and, since nothing is composited, no DMABUF renderer (about
/// 10 MiB more, most of it in the app's own process, which stays resident in the tray).
/// The cache model measured no difference, so it is not applied. Without compositing
/// WebKitWebDriver's clicks and screenshots never complete (WebKitGTK 2.50), so the
/// WebDriver test runs with `none`; the tray test clicks the console as shipped with
/// real X input.
pub const SHIPPED: &[Setting] = &[Setting::NoAcceleration, Setting::NoDmabufRenderer];

/// The chosen settings WebKit reads from the environment, as (variable, value).
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
fn environment(settings: &[Setting]) -> Vec<(&'static str, &'static str)> {
    settings
        .iter()
        .filter_map(|s| match s {
            Setting::NoDmabufRenderer => Some(("WEBKIT_DISABLE_DMABUF_RENDERER", "1")),
            Setting::CacheModel | Setting::NoAcceleration => None,
        })
        .collect()
}

/// Applies the chosen settings that WebKit reads from the environment by executing the
/// console again (same process id, same arguments) with them set, before anything else
/// has started: changing this process's own environment would need `unsafe` (other
/// threads may read it). A variable the caller already set is left as it is, which also
/// ends the re-execution. Returns only when there is nothing to set or the new image
/// could not be executed (the console then runs without those settings).
#[cfg(target_os = "linux")]
pub fn reexec_with_environment() {
    use std::os::unix::process::CommandExt;
    let missing: Vec<_> = environment(&configured())
        .into_iter()
        .filter(|(name, _)| std::env::var_os(name).is_none())
        .collect();
    if missing.is_empty() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let error = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .envs(missing)
        .exec();
    eprintln!("postern-console: starting with the webview's environment: {error}");
}

/// Elsewhere the platform's webview reads none of these.
#[cfg(not(target_os = "linux"))]
pub fn reexec_with_environment() {}

/// The settings this process applies: what `POSTERN_WEBVIEW_SETTINGS` chooses.
pub fn configured() -> Vec<Setting> {
    chosen(std::env::var("POSTERN_WEBVIEW_SETTINGS").ok().as_deref())
}

/// The settings to apply, from `POSTERN_WEBVIEW_SETTINGS` (`value`).
pub fn chosen(value: Option<&str>) -> Vec<Setting> {
    match value.map(str::trim) {
        None | Some("") | Some("shipped") => SHIPPED.to_vec(),
        Some("none") => Vec::new(),
        Some(list) => Setting::ALL
            .iter()
            .copied()
            .filter(|s| list.split(',').any(|n| n.trim() == s.name()))
            .collect(),
    }
}

/// Builds the main window (and so its webview and WebKit's processes) from its entry in
/// `tauri.conf.json`, which the app does not create by itself (`create: false`): at start
/// unless it starts in the tray, and again whenever the operator opens a window that
/// closing ended. The webview gets the settings `POSTERN_WEBVIEW_SETTINGS` chooses.
pub fn open_main<R: tauri::Runtime>(
    app: &tauri::AppHandle<R>,
) -> tauri::Result<tauri::WebviewWindow<R>> {
    let config = app
        .config()
        .app
        .windows
        .iter()
        .find(|w| w.label == MAIN)
        .cloned()
        .ok_or_else(|| tauri::Error::WindowNotFound)?;
    let window = tauri::WebviewWindowBuilder::from_config(app, &config)?.build()?;
    apply(&window, configured());
    Ok(window)
}

/// The console's one window.
pub const MAIN: &str = "main";

/// Applies `settings` to the main window's webview.
#[cfg(target_os = "linux")]
pub fn apply<R: tauri::Runtime>(window: &tauri::WebviewWindow<R>, settings: Vec<Setting>) {
    if settings.is_empty() {
        return;
    }
    let _ = window.with_webview(move |webview| {
        use webkit2gtk::{
            CacheModel, HardwareAccelerationPolicy, SettingsExt, WebContextExt, WebViewExt,
        };
        let view = webview.inner();
        for setting in &settings {
            match setting {
                Setting::CacheModel => {
                    if let Some(context) = view.context() {
                        context.set_cache_model(CacheModel::DocumentViewer);
                    }
                }
                Setting::NoAcceleration => {
                    if let Some(s) = WebViewExt::settings(&view) {
                        s.set_hardware_acceleration_policy(HardwareAccelerationPolicy::Never);
                    }
                }
                // Set in the environment at start (reexec_with_environment).
                Setting::NoDmabufRenderer => {}
            }
        }
    });
}

/// Elsewhere the platform's webview keeps its defaults.
#[cfg(not(target_os = "linux"))]
pub fn apply<R: tauri::Runtime>(_window: &tauri::WebviewWindow<R>, _settings: Vec<Setting>) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_dmabuf_setting_goes_through_the_environment() {
        assert_eq!(
            environment(SHIPPED),
            vec![("WEBKIT_DISABLE_DMABUF_RENDERER", "1")]
        );
        assert!(environment(&chosen(Some("none"))).is_empty());
        assert!(environment(&[Setting::NoAcceleration, Setting::CacheModel]).is_empty());
    }

    #[test]
    fn the_benchmark_variable_picks_none_some_or_the_shipped_set() {
        assert_eq!(chosen(None), SHIPPED);
        assert_eq!(chosen(Some("shipped")), SHIPPED);
        assert!(chosen(Some("none")).is_empty());
        assert_eq!(
            chosen(Some("no-acceleration, bogus")),
            vec![Setting::NoAcceleration]
        );
    }
}
