//! Provenance: who acted, and what a person was shown before approving.
//!
//! Two records make the journal say this after a restart, not only while the broker
//! runs:
//!
//! - `SESSION_OPENED`, appended (fsynced) when an agent's bridge connects and before
//!   that connection may run an invocation: the agent process (executable path and the
//!   blake3 of its bytes, pid, start time, uid and user name, cwd), its parents and the
//!   transport. It never holds request data, and it holds no command line: arguments
//!   can carry tokens, and the executable digest identifies the program better than its
//!   argv.
//! - What is known for certain is kept apart from what the agent side claims (issue
//!   26). The uid (the kernel's, through the socket and /proc), the user name, the pid
//!   and the start time are certain. The executable and its digest are certain only when
//!   the broker read them itself; a broker running as another user cannot (the kernel
//!   lets only the process's own user, or a process that may trace it, read
//!   `/proc/PID/exe`), and the record then says why. What the bridge reports about the
//!   agent ([`BridgeReport`]) is recorded beside it as the bridge's claim: an agent can
//!   start any program in the bridge's place.
//! - The approval card: [`ApprovalCard`] is exactly what the console displays for a
//!   pending approval. APPROVAL_REQUESTED carries the card and its digest; the answer
//!   (APPROVAL_GRANTED / APPROVAL_DENIED) carries the digest of the card the person
//!   answered, so a grant is bound to what was on the screen.
//!
//! Session records are not invocations. They are stored under a reserved key,
//! [`session_key`] (`session:<id>`), that never names an invocation (invocation ids are
//! assigned by the broker as `inv_…`), have no row in the `invocations` table (so
//! listings, search, stats and exports never see them), and fold to a projection that
//! is not an invocation and is never "interrupted".

use std::io::Read;
use std::path::Path;

use rusqlite::Connection;

use crate::approvals::ApprovalRequest;
use crate::display::escape_text;
use crate::journal::events::{Event, EventBody};
use crate::journal::{Journal, JournalError, load_events};
use crate::platform;

/// The prefix of the journal key session records are stored under.
pub const SESSION_KEY_PREFIX: &str = "session:";

/// How many ancestors of the agent a session record lists.
pub const MAX_ANCESTORS: usize = 8;

/// The journal key (the events table's `invocation_id` column) of `session`'s records.
pub fn session_key(session: &str) -> String {
    format!("{SESSION_KEY_PREFIX}{session}")
}

/// Whether a journal key is a session record rather than an invocation.
pub fn is_session_key(key: &str) -> bool {
    key.starts_with(SESSION_KEY_PREFIX)
}

// ----- the session record ---------------------------------------------------------------

pub use crate::record::approval::{ApprovalCard, CardAgent};
pub use crate::record::session::{
    Ancestor, BridgeReport, ExecutableDigest, ProcessIdentity, SessionOpened, Transport,
};

/// The longest path a bridge report may carry (bytes), and the longest reason.
const MAX_REPORTED_PATH: usize = 4096;
const MAX_REPORTED_REASON: usize = 512;

/// Why a bridge report was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the bridge report is malformed: {0}")]
pub struct MalformedReport(pub &'static str);

impl BridgeReport {
    /// What this bridge can say about its parent and itself (blocking: it hashes the
    /// parent's executable).
    pub fn of_this_process() -> Option<BridgeReport> {
        let me = std::process::id();
        let (parent_pid, _) = platform::process_start(me)?;
        Some(BridgeReport {
            parent_pid,
            parent_executable: platform::process_executable(parent_pid),
            parent_executable_digest: image_digest(parent_pid),
            bridge_executable: platform::process_executable(me),
        })
    }

    /// Checks what a report may hold: paths and reasons of bounded length, a digest of
    /// 64 lowercase hex digits.
    ///
    /// # Errors
    ///
    /// [`MalformedReport`] naming the first field that is not.
    pub fn validate(&self) -> Result<(), MalformedReport> {
        let path_ok = |p: &Option<String>| p.as_ref().is_none_or(|p| p.len() <= MAX_REPORTED_PATH);
        if !path_ok(&self.parent_executable) {
            return Err(MalformedReport("parent_executable is too long"));
        }
        if !path_ok(&self.bridge_executable) {
            return Err(MalformedReport("bridge_executable is too long"));
        }
        match &self.parent_executable_digest {
            ExecutableDigest::Blake3 { hex }
                if hex.len() != 64
                    || !hex
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
            {
                Err(MalformedReport(
                    "parent_executable_digest is not a blake3 hex digest",
                ))
            }
            ExecutableDigest::Unreadable { reason } if reason.len() > MAX_REPORTED_REASON => {
                Err(MalformedReport("the unreadable reason is too long"))
            }
            _ => Ok(()),
        }
    }
}

/// Why a session could not be recorded.
#[derive(Debug, thiserror::Error)]
pub enum ProvenanceError {
    #[cfg_attr(
        target_os = "linux",
        error("the agent process {pid} is gone or its /proc entry is unreadable")
    )]
    #[cfg_attr(
        not(target_os = "linux"),
        error("the agent process {pid} is gone or cannot be read")
    )]
    ProcessGone { pid: u32 },
    #[error("the session record could not be written: {0}")]
    Journal(#[from] JournalError),
}

/// Hashes a file's bytes with blake3, or says why it could not.
///
/// Every agent session hashes its executable, and agents are few binaries run many
/// times (an interpreter can be 100 MB): a digest is reused while the file's identity
/// and its modification and change times are what they were. The change time cannot be
/// set by a user, so a file rewritten in place is hashed again.
pub fn digest_file(path: &Path) -> ExecutableDigest {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static SEEN: Mutex<Option<HashMap<platform::FileStamp, String>>> = Mutex::new(None);
    const MAX_SEEN: usize = 256;
    // Where the platform gives no stamp (Windows), every digest is computed afresh.
    let Some(before) = std::fs::metadata(path)
        .ok()
        .and_then(|m| platform::file_stamp(&m))
    else {
        return hash_file(path);
    };
    if let Some(hex) = SEEN
        .lock()
        .ok()
        .and_then(|seen| seen.as_ref()?.get(&before).cloned())
    {
        return ExecutableDigest::Blake3 { hex };
    }
    let digest = hash_file(path);
    // Kept only if the file did not change while it was read.
    if let ExecutableDigest::Blake3 { hex } = &digest
        && std::fs::metadata(path)
            .ok()
            .and_then(|after| platform::file_stamp(&after))
            .is_some_and(|after| after == before)
        && let Ok(mut seen) = SEEN.lock()
    {
        let seen = seen.get_or_insert_with(HashMap::new);
        if seen.len() >= MAX_SEEN {
            seen.clear();
        }
        seen.insert(before, hex.clone());
    }
    digest
}

fn hash_file(path: &Path) -> ExecutableDigest {
    let mut hasher = blake3::Hasher::new();
    let read = std::fs::File::open(path).and_then(|f| {
        let mut f = f;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            hasher.update(&buf[..n]);
        }
    });
    match read {
        Ok(()) => ExecutableDigest::Blake3 {
            hex: hasher.finalize().to_hex().to_string(),
        },
        Err(e) => ExecutableDigest::Unreadable {
            reason: e.to_string(),
        },
    }
}

/// The digest of the executable process `pid` runs ([`platform::process_image`]), or
/// why there is none.
fn image_digest(pid: u32) -> ExecutableDigest {
    match platform::process_image(pid) {
        Some(image) => digest_file(&image),
        None => ExecutableDigest::Unreadable {
            reason: "the platform did not name the executable".to_string(),
        },
    }
}

/// Reads process `pid` (from /proc on Linux; see [`crate::platform`] elsewhere) and
/// hashes its executable. `None` when the process is gone, or when it is no longer the
/// process that started at `expected_start_ticks` (a recycled pid).
pub fn observe_process(pid: u32, expected_start_ticks: Option<u64>) -> Option<ProcessIdentity> {
    let (_, start_ticks) = platform::process_start(pid)?;
    if expected_start_ticks.is_some_and(|t| t != start_ticks) {
        return None;
    }
    let executable_digest = image_digest(pid);
    let uid = platform::process_uid(pid);
    let sid = platform::process_sid(pid);
    let user = match (uid, &sid) {
        (Some(uid), _) => Some(platform::UserId::Uid(uid)),
        (None, Some(sid)) => Some(platform::UserId::Sid(sid.clone())),
        (None, None) => None,
    };
    let identity = ProcessIdentity {
        pid,
        uid,
        user_name: user.as_ref().and_then(platform::user_name),
        sid,
        start_ticks,
        started_at_ms: platform::start_to_unix_ms(start_ticks),
        executable: platform::process_executable(pid),
        executable_digest,
        cwd: platform::process_cwd(pid),
    };
    // Read again: the pid must still be the same process after the (slow) hash.
    match platform::process_start(pid) {
        Some((_, again)) if again == start_ticks => Some(identity),
        _ => None,
    }
}

/// One ancestor's pid and executable path.
pub fn observe_ancestor(pid: u32) -> Ancestor {
    Ancestor {
        pid,
        executable: platform::process_executable(pid),
    }
}

impl SessionOpened {
    /// Reads the agent behind a bridge connection ([`observe_process`]). `agent_start_ticks` is the
    /// start time the session id was derived from; `ancestors` are the agent's parents,
    /// nearest first, as already walked by the caller; `bridge_report` is what the
    /// bridge claimed, if it sent a report.
    pub fn observe(
        session: &str,
        agent_pid: u32,
        agent_start_ticks: u64,
        ancestors: &[u32],
        bridge_pid: u32,
        bridge_report: Option<BridgeReport>,
    ) -> Result<SessionOpened, ProvenanceError> {
        let agent = observe_process(agent_pid, Some(agent_start_ticks))
            .ok_or(ProvenanceError::ProcessGone { pid: agent_pid })?;
        Ok(SessionOpened {
            session: session.to_string(),
            transport: Transport {
                kind: platform::TRANSPORT_KIND.into(),
                bridge_pid,
                bridge_executable: platform::process_executable(bridge_pid),
            },
            agent,
            parent_chain: ancestors
                .iter()
                .take(MAX_ANCESTORS)
                .map(|pid| observe_ancestor(*pid))
                .collect(),
            bridge_report,
            confinement: Default::default(),
        })
    }
}

/// Appends SESSION_OPENED for `opened` and returns its sequence number once it is on
/// disk (fsynced). A session must not run an invocation unless this succeeded.
///
/// # Errors
///
/// [`ProvenanceError::Journal`] when the journal refuses or cannot write it.
pub fn record_session(journal: &Journal, opened: SessionOpened) -> Result<u64, ProvenanceError> {
    let key = session_key(&opened.session);
    let body = EventBody::SessionOpened(opened);
    // Session records bypass the invocation projection check (they are not invocation
    // events); the chain, the sequence and the checkpoints are the writer's as for any
    // event.
    Ok(journal.write(true, move |ctx| ctx.append_record(&key, &body))?)
}

/// A session as the journal recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedSession {
    /// The first SESSION_OPENED of the session.
    pub seq: u64,
    pub at_ms: i64,
    pub opened: SessionOpened,
    /// How many bridge connections the session opened (one record each).
    pub connections: u32,
}

fn recorded_from(events: Vec<Event>) -> Option<RecordedSession> {
    let mut first: Option<RecordedSession> = None;
    for event in events {
        if let EventBody::SessionOpened(opened) = event.body {
            match &mut first {
                Some(r) => r.connections += 1,
                None => {
                    first = Some(RecordedSession {
                        seq: event.seq,
                        at_ms: event.recorded_at_ms,
                        opened,
                        connections: 1,
                    });
                }
            }
        }
    }
    first
}

/// The recorded identity of `session`, read on `conn`; `None` if the journal has no
/// SESSION_OPENED for it (sessions from before this record existed, or direct callers
/// of the engine that never connected over the socket).
///
/// # Errors
///
/// [`JournalError`] if the journal cannot be read or a record does not decode.
pub fn recorded_session(
    conn: &Connection,
    session: &str,
) -> Result<Option<RecordedSession>, JournalError> {
    Ok(recorded_from(load_events(conn, &session_key(session))?))
}

/// The sessions the journal has records of, the most recently connected first (at most
/// `limit`), each with its first record. Walks the `events_by_invocation` index over the
/// reserved key range only.
///
/// # Errors
///
/// As [`recorded_session`].
pub fn recorded_sessions(
    conn: &Connection,
    limit: usize,
) -> Result<Vec<RecordedSession>, JournalError> {
    // Every key starting with "session:" sorts in ["session:", "session;").
    let keys: Vec<String> = conn
        .prepare_cached(
            "SELECT invocation_id FROM events
             WHERE invocation_id >= 'session:' AND invocation_id < 'session;'
             GROUP BY invocation_id ORDER BY max(seq) DESC LIMIT ?1",
        )?
        .query_map([i64::try_from(limit).unwrap_or(i64::MAX)], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut out = Vec::new();
    for key in keys {
        if let Some(recorded) = recorded_from(load_events(conn, &key)?) {
            out.push(recorded);
        }
    }
    Ok(out)
}

/// [`recorded_session`] through the broker's own reader.
///
/// # Errors
///
/// As [`recorded_session`].
pub fn recorded_session_in(
    journal: &Journal,
    session: &str,
) -> Result<Option<RecordedSession>, JournalError> {
    Ok(recorded_from(journal.events(&session_key(session))?))
}

// ----- the approval card ----------------------------------------------------------------

/// The card's agent for `session`, from its SESSION_OPENED record. `None` without a
/// session, without a record, or when the journal cannot be read: the card then says
/// the agent is unknown, and its digest binds that.
pub fn card_agent_of(journal: &Journal, session: Option<&str>) -> Option<CardAgent> {
    let recorded = recorded_session_in(journal, session?).ok()??;
    Some(CardAgent::of(&recorded.opened))
}

/// Domain separation for card digests (a version bump changes every digest).
const CARD_DOMAIN: &[u8] = b"postern/approval-card/v1\0";

impl ApprovalCard {
    /// The card for `request`.
    pub fn of(request: &ApprovalRequest) -> ApprovalCard {
        let r = request;
        ApprovalCard {
            invocation_id: r.invocation_id.clone(),
            mode: r.mode.to_string(),
            target: escape_text(&r.target),
            summary: escape_text(&r.summary),
            method: r.detail.method.as_deref().map(escape_text),
            url: r.detail.url.as_deref().map(escape_text),
            body: r.detail.body.clone(),
            ssh_destination: r.detail.ssh_destination.as_deref().map(escape_text),
            // Already escaped by the channel (see `ApprovalDetail`).
            command: r.detail.command.clone(),
            host_key: r.detail.host_key.clone(),
            resolved: r.detail.resolved.as_deref().map(escape_text),
            proxy: r.detail.proxy.as_deref().map(escape_text),
            // Built escaped by the channel, like the command.
            cautions: r.detail.cautions.clone(),
            covers: r.covers.clone(),
            headers: r.detail.headers.clone(),
            added: r.detail.added.clone(),
            stdin: r.detail.stdin.clone(),
            credential_id: r.credential_id.clone(),
            credential_version: r.credential_version.clone(),
            injection_mode: r.injection_mode.clone(),
            idempotency_key: r.idempotency_key.as_deref().map(escape_text),
            fingerprint: r.fingerprint.clone(),
            agent: r.agent.clone(),
        }
    }

    /// blake3 (lowercase hex) over the domain tag and the card's canonical JSON (fields
    /// in declaration order, no maps).
    pub fn digest(&self) -> String {
        let mut hasher = blake3::Hasher::new();
        hasher.update(CARD_DOMAIN);
        // Serializing plain structs of strings and numbers cannot fail; an empty
        // encoding would still be bound to the domain tag and never match a real card.
        let json = serde_json::to_vec(self).unwrap_or_default();
        hasher.update(&json);
        hasher.finalize().to_hex().to_string()
    }
}

/// How a person answered an approval, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedAnswer {
    pub granted: bool,
    pub by: String,
    /// The digest of the card the person answered; `None` when the answer named no card
    /// (a remembered session approval, or an answer from before cards were recorded).
    pub card_digest: Option<String>,
}

/// What an invocation's record says about its approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRecord {
    pub mode: String,
    /// The card recorded in APPROVAL_REQUESTED, if the record carries it.
    pub card: Option<ApprovalCard>,
    /// The digest recorded beside it.
    pub card_digest: Option<String>,
    /// The recorded card hashes to the recorded digest.
    pub card_intact: bool,
    pub answer: Option<RecordedAnswer>,
}

impl ApprovalRecord {
    /// The latest approval of an invocation, from its events.
    pub fn of(events: &[Event]) -> Option<ApprovalRecord> {
        let mut record: Option<ApprovalRecord> = None;
        for event in events {
            match &event.body {
                EventBody::ApprovalRequested {
                    mode,
                    card,
                    card_digest,
                    ..
                } => {
                    record = Some(ApprovalRecord {
                        mode: mode.clone(),
                        card_intact: match (card, card_digest) {
                            (Some(card), Some(digest)) => card.digest() == *digest,
                            _ => false,
                        },
                        card: card.as_deref().cloned(),
                        card_digest: card_digest.clone(),
                        answer: None,
                    });
                }
                EventBody::ApprovalGranted {
                    approver,
                    card_digest,
                    ..
                }
                | EventBody::ApprovalDenied {
                    approver,
                    card_digest,
                    ..
                } => {
                    if let Some(r) = &mut record {
                        r.answer = Some(RecordedAnswer {
                            granted: matches!(event.body, EventBody::ApprovalGranted { .. }),
                            by: approver.clone(),
                            card_digest: card_digest.clone(),
                        });
                    }
                }
                _ => {}
            }
        }
        record
    }

    /// Whether the answer names the recorded card: `Some(true)` when the answered
    /// digest equals the requested one and the card is intact, `Some(false)` when it
    /// names another card, `None` when there is no answer or it named no card.
    pub fn answer_matches_card(&self) -> Option<bool> {
        let answered = self.answer.as_ref()?.card_digest.as_ref()?;
        Some(self.card_intact && self.card_digest.as_ref() == Some(answered))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::session::{Confinement, ShieldConfinement};

    #[test]
    fn this_process_is_observed_with_the_digest_of_its_binary() {
        let me = observe_process(std::process::id(), None).unwrap();
        let exe = std::env::current_exe().unwrap();
        let bytes = std::fs::read(&exe).unwrap();
        assert_eq!(
            me.executable_digest.hex(),
            Some(blake3::hash(&bytes).to_hex().as_str())
        );
        assert!(me.started_at_ms.is_some_and(|ms| ms > 1_500_000_000_000));
        assert_eq!(me.executable.as_deref(), exe.to_str());
    }

    #[test]
    fn a_recycled_pid_is_not_observed_as_the_old_process() {
        let me = observe_process(std::process::id(), None).unwrap();
        assert!(observe_process(std::process::id(), Some(me.start_ticks + 1)).is_none());
    }

    // The reason is the operating system's own words, which differ on Windows.
    #[test]
    #[cfg(unix)]
    fn an_unreadable_executable_records_why() {
        let digest = digest_file(Path::new("/nonexistent/postern-test-binary"));
        match digest {
            ExecutableDigest::Unreadable { reason } => assert!(reason.contains("No such file")),
            other => panic!("expected unreadable, got {other:?}"),
        }
    }

    #[test]
    fn a_file_rewritten_in_place_is_hashed_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent");
        std::fs::write(&path, b"first build").unwrap();
        let first = digest_file(&path);
        assert_eq!(digest_file(&path), first, "the same file, the same digest");
        std::fs::write(&path, b"other build").unwrap();
        let second = digest_file(&path);
        assert_ne!(second, first);
        assert_eq!(
            second,
            ExecutableDigest::Blake3 {
                hex: blake3::hash(b"other build").to_hex().to_string()
            }
        );
    }

    #[test]
    fn session_keys_never_look_like_invocations() {
        assert_eq!(session_key("sess_1_2"), "session:sess_1_2");
        assert!(is_session_key("session:sess_1_2"));
        assert!(!is_session_key("inv_0123"));
    }

    #[test]
    fn this_bridge_reports_its_parent_as_the_platform_reads_it() {
        let report = BridgeReport::of_this_process().unwrap();
        let (parent, _) = platform::process_start(std::process::id()).unwrap();
        assert_eq!(report.parent_pid, parent);
        assert_eq!(
            report.parent_executable,
            platform::process_executable(parent)
        );
        if let Some(image) = platform::process_image(parent) {
            assert_eq!(report.parent_executable_digest, digest_file(&image));
        }
        assert_eq!(
            report.bridge_executable,
            platform::process_executable(std::process::id())
        );
        report.validate().unwrap();
    }

    #[test]
    fn a_bridge_report_with_an_oversized_path_or_a_bad_digest_is_refused() {
        let good = BridgeReport {
            parent_pid: 7,
            parent_executable: Some("/usr/bin/agent".into()),
            parent_executable_digest: ExecutableDigest::Blake3 {
                hex: "ab".repeat(32),
            },
            bridge_executable: Some("/usr/bin/postern".into()),
        };
        good.validate().unwrap();
        let long_path = BridgeReport {
            parent_executable: Some("/a".repeat(MAX_REPORTED_PATH)),
            ..good.clone()
        };
        assert_eq!(
            long_path.validate(),
            Err(MalformedReport("parent_executable is too long"))
        );
        let long_bridge = BridgeReport {
            bridge_executable: Some("b".repeat(MAX_REPORTED_PATH + 1)),
            ..good.clone()
        };
        assert!(long_bridge.validate().is_err());
        for hex in [
            "AB".repeat(32),
            "ab".repeat(31),
            "zz".repeat(32),
            "ab".repeat(33),
        ] {
            let bad = BridgeReport {
                parent_executable_digest: ExecutableDigest::Blake3 { hex },
                ..good.clone()
            };
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        let long_reason = BridgeReport {
            parent_executable_digest: ExecutableDigest::Unreadable {
                reason: "r".repeat(MAX_REPORTED_REASON + 1),
            },
            ..good
        };
        assert!(long_reason.validate().is_err());
    }

    /// SESSION_OPENED for this test process as the agent, named `user_name`, with the
    /// bridge's `report`.
    fn this_process_opened(user_name: Option<&str>, report: Option<BridgeReport>) -> SessionOpened {
        let me = observe_process(std::process::id(), None).unwrap();
        SessionOpened {
            session: "sess_u1_2_3".into(),
            transport: Transport {
                kind: "unix_socket".into(),
                bridge_pid: 2,
                bridge_executable: None,
            },
            agent: ProcessIdentity {
                user_name: user_name.map(str::to_string),
                ..me
            },
            parent_chain: Vec::new(),
            bridge_report: report,
            confinement: Confinement::None,
        }
    }

    #[test]
    fn the_card_escapes_the_bridges_claim_and_names_the_user() {
        let opened = this_process_opened(
            Some("ada"),
            Some(BridgeReport {
                parent_pid: 9,
                parent_executable: Some("/usr/local/bin/claude\u{202e}edoc".into()),
                parent_executable_digest: ExecutableDigest::Unreadable {
                    reason: "denied\u{2028}approved".into(),
                },
                bridge_executable: Some("/opt/\u{00ad}postern".into()),
            }),
        );
        let opened = SessionOpened {
            confinement: Confinement::Shield(ShieldConfinement {
                shield: "shd_0123456789abcdef".into(),
                profile_digest: format!("blake3:{}", "0".repeat(64)),
                network: "full".into(),
                ssh_agent: false,
                writable: vec!["/home/ada/src/\u{202e}evil".into()],
            }),
            ..opened
        };
        let card = CardAgent::of(&opened);
        // The working directory's name is the agent's to choose: escaped like the rest.
        let Confinement::Shield(shield) = &card.confinement else {
            panic!("the card shows the confinement");
        };
        assert!(!shield.writable[0].contains('\u{202e}'), "{shield:?}");
        assert_eq!(card.user_name.as_deref(), Some("ada"));
        let claim = card.bridge_report.unwrap();
        for text in [
            claim.parent_executable.unwrap(),
            claim.bridge_executable.unwrap(),
            match claim.parent_executable_digest {
                ExecutableDigest::Unreadable { reason } => reason,
                other => panic!("{other:?}"),
            },
        ] {
            assert!(
                !text.contains(['\u{202e}', '\u{2028}', '\u{00ad}']),
                "escaped: {text}"
            );
        }
    }

    #[test]
    fn a_record_without_the_new_fields_reads_and_its_card_keeps_its_digest_bytes() {
        let opened = this_process_opened(None, None);
        let json = serde_json::to_value(&opened).unwrap();
        assert!(json.get("bridge_report").is_none());
        assert!(json.get("confinement").is_none());
        assert!(json["agent"].get("user_name").is_none());
        let back: SessionOpened = serde_json::from_value(json).unwrap();
        assert_eq!(back, opened);
        let card = serde_json::to_value(CardAgent::of(&opened)).unwrap();
        assert!(card.get("user_name").is_none() && card.get("bridge_report").is_none());
        assert!(card.get("confinement").is_none());
    }
}
