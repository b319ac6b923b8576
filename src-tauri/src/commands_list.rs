/// Every command the console's webview may invoke. The build script makes one
/// permission per name and `capabilities/main-window.json` grants them to the main
/// window only; a test checks this list against the registered handlers.
pub const COMMANDS: &[&str] = &include!("../../crates/console/src/command_names.in");
