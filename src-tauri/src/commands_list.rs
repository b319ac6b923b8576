/// Every command the console's webview may invoke. The build script makes one
/// permission per name and `capabilities/main-window.json` grants them to the main
/// window only; a test checks this list against the registered handlers.
pub const COMMANDS: &[&str] = &[
    "overview",
    "list_approvals",
    "answer_approval",
    "list_sessions",
    "session_timeline",
    "query_activity",
    "export_activity",
    "invocation_detail",
    "needs_reconciliation",
    "run_reconcile_query",
    "attest_outcome",
    "list_credentials",
    "set_credential",
    "remove_credential",
    "list_targets",
    "update_target",
    "integrity",
];
