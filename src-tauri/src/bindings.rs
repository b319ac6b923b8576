//! Generates `ui/src/lib/bindings.ts`: the contract enums (from the broker's own lists),
//! every IPC type (from [`crate::dto`] via ts-rs), a typed wrapper per command, and the
//! event names with their payloads. The committed file is checked against this output
//! by a test; `POSTERN_UPDATE_BINDINGS=1 cargo test -p postern-desktop bindings`
//! rewrites it.

use postern_broker::contract::{Code, Outcome, Phase, Retry};
use ts_rs::TS;

use crate::dto::*;
use postern_console::protocol::{camel, signatures};

/// Events the backend emits, with their payload types.
pub const EVENTS: &[(&str, &str, &str)] = &[
    ("approvalsChanged", APPROVALS_CHANGED, "ApprovalsChanged"),
    ("journalChanged", JOURNAL_CHANGED, "JournalChanged"),
    ("integrityChanged", INTEGRITY_CHANGED, "IntegrityState"),
    ("pauseChanged", PAUSE_CHANGED, "AgentPauseState"),
];

fn union(name: &str, values: impl Iterator<Item = &'static str>) -> String {
    let parts: Vec<String> = values.map(|v| format!("\"{v}\"")).collect();
    format!(
        "export type {name} = {};\nexport const {}: {name}[] = [{}];\n",
        parts.join(" | "),
        const_name(name),
        parts.join(", ")
    )
}

fn const_name(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out.push_str("_VALUES");
    out
}

/// The whole generated file.
pub fn typescript() -> String {
    let mut out = String::from(
        "// Generated from the Rust types by `src-tauri/src/bindings.rs`. Do not edit:\n\
         // `POSTERN_UPDATE_BINDINGS=1 cargo test -p postern-desktop bindings` rewrites it.\n\
         import { invoke } from \"@tauri-apps/api/core\";\n\
         import { listen, type UnlistenFn } from \"@tauri-apps/api/event\";\n\n",
    );
    out.push_str(&union("Phase", Phase::ALL.iter().map(|p| p.as_str())));
    out.push_str(&union("Outcome", Outcome::ALL.iter().map(|o| o.as_str())));
    out.push_str(&union("Retry", Retry::ALL.iter().map(|r| r.as_str())));
    out.push_str(&union("Code", Code::ALL.iter().map(|c| c.as_str())));
    out.push('\n');
    let decls = [
        Overview::decl(),
        ProcessCard::decl(),
        AgentCard::decl(),
        Ancestor::decl(),
        RecordedAgent::decl(),
        BridgeClaim::decl(),
        ApprovalProof::decl(),
        BodyPreview::decl(),
        HeaderPreview::decl(),
        ApprovalCard::decl(),
        Decision::decl(),
        ActivityRow::decl(),
        ActivityFilter::decl(),
        ActivityPage::decl(),
        ExportFormat::decl(),
        ExportResult::decl(),
        SessionSummary::decl(),
        TimelineEvent::decl(),
        InvocationDetail::decl(),
        Relation::decl(),
        RelatedInvocation::decl(),
        JobState::decl(),
        JobFacts::decl(),
        ConfidenceSource::decl(),
        MemberState::decl(),
        Settlement::decl(),
        Reconciliation::decl(),
        Attestation::decl(),
        PeerIncidentRow::decl(),
        CredentialCard::decl(),
        SetCredential::decl(),
        TargetCard::decl(),
        TargetList::decl(),
        TargetEdit::decl(),
        IntegrityState::decl(),
        ErrorCode::decl(),
        CommandError::decl(),
        ApprovalsChanged::decl(),
        JournalChanged::decl(),
        AgentPauseState::decl(),
    ];
    for decl in decls {
        out.push_str("export ");
        out.push_str(decl.trim());
        out.push_str("\n\n");
    }
    out.push_str(
        "/** Sends one operator command through the app's one command, `operator`. */\n\
         function operator<T>(command: string, args: Record<string, unknown>): Promise<T> {\n  \
         return invoke<T>(\"operator\", { request: { command, args } });\n}\n\n",
    );
    out.push_str("/** Every console command, typed. Errors reject with a `CommandError`. */\n");
    out.push_str("export const commands = {\n");
    for s in signatures() {
        let params: Vec<String> = s.args.iter().map(|(n, t)| format!("{n}: {t}")).collect();
        let names: Vec<&str> = s.args.iter().map(|(n, _)| n.as_str()).collect();
        let args = if names.is_empty() {
            "{}".to_string()
        } else {
            format!("{{ {} }}", names.join(", "))
        };
        let call = format!("operator<{}>(\"{}\", {args})", s.returns, s.name);
        out.push_str(&format!(
            "  {}: ({}): Promise<{}> => {call},\n",
            camel(s.name),
            params.join(", "),
            s.returns
        ));
    }
    out.push_str("};\n\n");
    out.push_str("/** Backend events and their payloads. */\nexport const events = {\n");
    for (key, name, payload) in EVENTS {
        out.push_str(&format!(
            "  {key}: (handler: (payload: {payload}) => void): Promise<UnlistenFn> =>\n    \
             listen<{payload}>(\"{name}\", (e) => handler(e.payload)),\n"
        ));
    }
    out.push_str("};\n");
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn committed_path() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../ui/src/lib/bindings.ts")
    }

    #[test]
    fn bindings_match_the_committed_file() {
        let generated = typescript();
        let path = committed_path();
        if std::env::var_os("POSTERN_UPDATE_BINDINGS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "ui/src/lib/bindings.ts is out of date with the Rust types; run \
             POSTERN_UPDATE_BINDINGS=1 cargo test -p postern-desktop bindings"
        );
    }

    #[test]
    fn every_registered_command_has_a_signature_and_a_permission() {
        // The webview's one command carries every operator command: the wrappers are
        // made from the protocol's own table, so they and the socket's list are one.
        assert_eq!(crate::commands_list::COMMANDS, ["operator"]);
        let names: Vec<&str> = signatures().iter().map(|s| s.name).collect();
        assert_eq!(names, postern_console::dispatch::COMMANDS);
        let capability: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("capabilities/main-window.json"),
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(capability["windows"], serde_json::json!(["main"]));
        let granted: Vec<String> = capability["permissions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap().to_string())
            .collect();
        for name in crate::commands_list::COMMANDS {
            let permission = format!("allow-{}", name.replace('_', "-"));
            assert!(granted.contains(&permission), "{permission} is not granted");
        }
        // Nothing beyond the app's own commands and event listening is granted.
        for p in &granted {
            assert!(
                p.starts_with("allow-") || p.starts_with("core:event:allow-"),
                "unexpected permission {p}"
            );
        }
    }
}
