/// The one command the console's webview may invoke: `operator`, carrying a typed
/// operator command. The build script makes its permission and
/// `capabilities/main-window.json` grants it to the main window only; a test checks this
/// list against the registered handler.
pub const COMMANDS: &[&str] = &["operator"];
