//! Provenance: the SESSION_OPENED record of an agent process, and approval cards whose
//! digest the request and the answer record.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use postern_broker::approvals::{AnswerError, Approvals, Pending};
use postern_broker::audit;
use postern_broker::channel::http::{HttpChannel, HttpRequest};
use postern_broker::clock::SystemClock;
use postern_broker::config::{Config, ConfigHandle};
use postern_broker::contract::{Code, Outcome};
use postern_broker::invocation::CallContext;
#[cfg(target_os = "linux")]
use postern_broker::invocation::Recorder;
use postern_broker::journal::JournalError;
use postern_broker::journal::events::{Event, EventBody};
use postern_broker::journal::query::{self, Filter};
#[cfg(target_os = "linux")]
use postern_broker::provenance::ExecutableDigest;
use postern_broker::provenance::{
    self, ApprovalRecord, SessionOpened, observe_process, session_key,
};
use postern_broker::vault::{CredentialKind, Keychain, KeychainBackend, Secret, Vault};

use crate::support::*;

const SESSION: &str = "session-1";

/// This test process, observed as an agent whose bridge is also this process.
fn this_process_opened(session: &str) -> SessionOpened {
    let me = std::process::id();
    let start = observe_process(me, None).unwrap().start_ticks;
    let (parent, _) = postern_broker::platform::process_start(me).unwrap();
    SessionOpened::observe(session, me, start, &[parent], me, None).unwrap()
}

#[cfg(target_os = "linux")]
fn own_uid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().nth(1))
        .unwrap()
        .parse()
        .unwrap()
}

fn read_conn(f: &Fixture) -> rusqlite::Connection {
    rusqlite::Connection::open_with_flags(f.db(), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap()
}

// Checked against /proc read independently; the macOS and Windows readings are checked
// against std's facts in `platform`'s own tests.
#[test]
#[cfg(target_os = "linux")]
fn a_session_record_precedes_the_sessions_first_acceptance_and_names_the_agent() {
    let f = Fixture::new();
    let opened_seq = provenance::record_session(&f.journal, this_process_opened(SESSION)).unwrap();
    let rec = Recorder::accept(&f.journal, new_invocation("inv_1", None)).unwrap();
    let accepted_seq = f.journal.events(rec.id()).unwrap()[0].seq;
    assert!(opened_seq < accepted_seq);

    let recorded = provenance::recorded_session(&read_conn(&f), SESSION)
        .unwrap()
        .unwrap();
    assert_eq!(recorded.seq, opened_seq);
    assert_eq!(recorded.connections, 1);
    let agent = &recorded.opened.agent;
    let exe = std::env::current_exe().unwrap();
    let independent = blake3::hash(&std::fs::read(&exe).unwrap());
    assert_eq!(agent.executable.as_deref(), exe.to_str());
    assert_eq!(
        agent.executable_digest,
        ExecutableDigest::Blake3 {
            hex: independent.to_hex().to_string()
        }
    );
    assert_eq!(agent.pid, std::process::id());
    assert_eq!(agent.uid, Some(own_uid()));
    assert_eq!(
        agent.cwd.as_deref(),
        std::env::current_dir().unwrap().to_str()
    );
    assert!(agent.start_ticks > 0);
    assert_eq!(
        recorded.opened.parent_chain[0].pid,
        std::os::unix::process::parent_id()
    );
    assert_eq!(recorded.opened.transport.kind, "unix_socket");
    assert_eq!(recorded.opened.transport.bridge_pid, std::process::id());
    // Nothing of the command line is recorded.
    let text: String = read_conn(&f)
        .query_row(
            "SELECT body FROM events WHERE kind = 'SESSION_OPENED'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(!text.contains("--test-threads") && !text.contains("\"command\""));
    assert_eq!(
        f.journal.events(&session_key(SESSION)).unwrap()[0]
            .body
            .kind(),
        "SESSION_OPENED"
    );
}

#[test]
fn session_records_are_not_invocations_in_any_reading() {
    let f = Fixture::new();
    provenance::record_session(&f.journal, this_process_opened(SESSION)).unwrap();
    commit_200(&ready(&f.journal, "inv_1", false, None));
    // A second connection of the same agent: one more record, same identity.
    provenance::record_session(&f.journal, this_process_opened(SESSION)).unwrap();
    let key = session_key(SESSION);

    // Nothing to recover, before and after a restart.
    assert!(f.journal.interrupted().unwrap().is_empty());
    let f = f.reopen();
    assert!(f.journal.recover_interrupted().unwrap().is_empty());
    assert!(f.journal.events(&key).unwrap().len() == 2);

    // The key is not an invocation: its fold never exists, and no invocation event can
    // be appended to it.
    let p = f.journal.projection(&key).unwrap();
    assert!(!p.exists() && p.session_record && p.session.is_none());
    assert!(matches!(
        f.journal.append(&key, EventBody::ResultDelivered),
        Err(JournalError::UnknownInvocation(_) | JournalError::Impossible(_))
    ));

    // Listings, search, sessions and stats see the invocation only.
    let conn = read_conn(&f);
    let rows = query::list(&conn, &Filter::default(), T0).unwrap();
    assert_eq!(
        rows.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["inv_1"]
    );
    let found = query::list(
        &conn,
        &Filter {
            text: Some("session".into()),
            ..Filter::default()
        },
        T0,
    )
    .unwrap();
    assert!(found.iter().all(|r| r.id == "inv_1"));
    let sessions = query::sessions(&conn, 10).unwrap();
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0].invocations, 1);
    let recorded = provenance::recorded_session(&conn, &sessions[0].session)
        .unwrap()
        .unwrap();
    assert_eq!(recorded.connections, 2);
    // Recorded sessions are listed from their own key range, newest first.
    drop(conn);
    provenance::record_session(&f.journal, this_process_opened("session-2")).unwrap();
    let listed: Vec<String> = provenance::recorded_sessions(&read_conn(&f), 10)
        .unwrap()
        .into_iter()
        .map(|r| r.opened.session)
        .collect();
    assert_eq!(listed, ["session-2", SESSION]);

    // The audit chain covers the session records like every other event.
    let report = audit::verify_file(&f.db(), &signing_key().verifying_key()).unwrap();
    assert!(report.events >= 8, "{report:?}");
}

#[test]
fn approval_records_without_a_card_still_read() {
    let old = r#"{"kind":"APPROVAL_REQUESTED","fingerprint":"blake3:01","mode":"per_call"}"#;
    let body: EventBody = serde_json::from_str(old).unwrap();
    assert_eq!(
        body,
        EventBody::ApprovalRequested {
            fingerprint: "blake3:01".into(),
            mode: "per_call".into(),
            card: None,
            card_digest: None,
        }
    );
    // The same canonical text comes back out, so old and new records hash alike.
    assert_eq!(serde_json::to_string(&body).unwrap(), old);
    let granted = r#"{"kind":"APPROVAL_GRANTED","fingerprint":"blake3:01","approver":"alice"}"#;
    let body: EventBody = serde_json::from_str(granted).unwrap();
    assert_eq!(serde_json::to_string(&body).unwrap(), granted);
    // Unknown fields are still refused.
    let extra = r#"{"kind":"APPROVAL_GRANTED","fingerprint":"x","approver":"a","more":1}"#;
    assert!(serde_json::from_str::<EventBody>(extra).is_err());
    let opened =
        serde_json::to_string(&EventBody::SessionOpened(this_process_opened("s"))).unwrap();
    assert!(serde_json::from_str::<EventBody>(&opened).is_ok());
    let extra = opened.replacen("\"session\":", "\"more\":1,\"session\":", 1);
    assert_ne!(extra, opened);
    assert!(serde_json::from_str::<EventBody>(&extra).is_err());
}

// ----- approval cards through the real HTTP channel -------------------------------------

fn secret_service_enabled() -> bool {
    if std::env::var_os("POSTERN_TEST_SKIP_SECRET_SERVICE").is_some_and(|v| v == "1") {
        eprintln!("skipped: POSTERN_TEST_SKIP_SECRET_SERVICE=1");
        return false;
    }
    true
}

/// A server on 127.0.0.1 that answers every request `200 {}`.
fn ok_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut buf = [0u8; 4096];
            let mut seen = Vec::new();
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
            );
        }
    });
    format!("http://{addr}")
}

struct Channel {
    f: Fixture,
    http: HttpChannel,
    vault: Arc<Vault>,
    approvals: Arc<Approvals>,
    base: String,
}

impl Drop for Channel {
    fn drop(&mut self) {
        let _ = self.vault.remove("api-key");
    }
}

fn channel() -> Channel {
    let f = Fixture::new();
    let base = ok_server();
    let config_path = f.dir.path().join("postern.toml");
    std::fs::write(
        &config_path,
        format!(
            "[[http]]\nname = \"api\"\nbase_url = \"{base}/v1\"\nmethods = [\"POST\"]\n\
             credential = \"api-key\"\ninject = {{ header = \"Authorization\", format = \
             \"Bearer {{secret}}\" }}\napproval = \"per_call\"\n"
        ),
    )
    .unwrap();
    let config = ConfigHandle::new(Config::load(&config_path).unwrap());
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).unwrap();
    let service = format!("postern-test-{}", hex::encode(bytes));
    let keychain = Keychain::new(KeychainBackend::SecretService, service).unwrap();
    let vault = Arc::new(Vault::open(keychain, &f.db()).unwrap());
    vault
        .set(
            "api-key",
            CredentialKind::Token,
            &Secret::from("provenance-canary-secret".to_string()),
            T0,
        )
        .unwrap();
    let http = HttpChannel::new(f.journal.clone(), vault.clone(), config);
    let approvals = Arc::new(Approvals::new(
        Duration::from_secs(10),
        Arc::new(SystemClock),
    ));
    Channel {
        f,
        http,
        vault,
        approvals,
        base,
    }
}

impl Channel {
    async fn post(&self) -> postern_broker::channel::http::HttpOutcome {
        let request = HttpRequest {
            url: format!("{}/v1/payments", self.base),
            method: "POST".into(),
            body: b"{\"amount\":5}".to_vec(),
            ..Default::default()
        };
        let ctx = CallContext {
            session: Some(SESSION.into()),
            approver: Some(self.approvals.clone()),
            ..Default::default()
        };
        self.http.execute(request, &ctx).await
    }

    async fn pending(&self) -> Pending {
        for _ in 0..500 {
            if let Some(p) = self.approvals.pending().into_iter().next() {
                return p;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no approval became pending");
    }

    fn events(&self, id: &str) -> Vec<Event> {
        self.f.journal.events(id).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recorded_card_digest_is_the_shown_cards_and_the_grant_names_it() {
    if !secret_service_enabled() {
        return;
    }
    let c = channel();
    provenance::record_session(&c.f.journal, this_process_opened(SESSION)).unwrap();
    let (out, shown) = tokio::join!(c.post(), async {
        let p = c.pending().await;
        // What the console displays for this request, and its digest.
        let card = p.request.card();
        let digest = card.digest();
        c.approvals
            .approve_card(
                &p.request.invocation_id,
                &p.request.fingerprint,
                &digest,
                "alice",
            )
            .unwrap();
        (card, digest)
    });
    let (card, digest) = shown;
    assert_eq!(out.outcome, Outcome::Committed, "{out:?}");

    // The card shows the agent from its session record.
    let agent = card.agent.as_ref().unwrap();
    let exe = std::env::current_exe().unwrap();
    assert_eq!(agent.executable.as_deref(), exe.to_str());
    assert_eq!(
        agent.executable_digest.hex(),
        Some(
            blake3::hash(&std::fs::read(&exe).unwrap())
                .to_hex()
                .as_str()
        )
    );
    assert_eq!(card.method.as_deref(), Some("POST"));
    assert_eq!(card.body.as_ref().unwrap().text, "{\"amount\":5}");

    let events = c.events(&out.invocation_id);
    let requested = events
        .iter()
        .find_map(|e| match &e.body {
            EventBody::ApprovalRequested {
                card: Some(recorded),
                card_digest: Some(d),
                ..
            } => Some(((**recorded).clone(), d.clone())),
            _ => None,
        })
        .unwrap();
    assert_eq!(requested, (card.clone(), digest.clone()));
    let granted = events.iter().find_map(|e| match &e.body {
        EventBody::ApprovalGranted { card_digest, .. } => Some(card_digest.clone()),
        _ => None,
    });
    assert_eq!(granted, Some(Some(digest.clone())));
    // The timeline names the card by its digest.
    let described = events
        .iter()
        .find(|e| e.body.kind() == "APPROVAL_REQUESTED")
        .map(|e| postern_broker::evidence::describe(&e.body))
        .unwrap();
    assert!(
        described.contains(&format!("card_digest={digest}")),
        "{described}"
    );
    assert!(!described.contains("card={"), "{described}");
    let record = ApprovalRecord::of(&events).unwrap();
    assert!(record.card_intact);
    assert_eq!(record.answer_matches_card(), Some(true));
    // The card holds no secret.
    let all: String = events
        .iter()
        .map(|e| serde_json::to_string(&e.body).unwrap())
        .collect();
    assert!(!all.contains("provenance-canary-secret"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_naming_another_card_is_refused_and_a_denial_records_its_card() {
    if !secret_service_enabled() {
        return;
    }
    let c = channel();
    let (out, ()) = tokio::join!(c.post(), async {
        let p = c.pending().await;
        let id = &p.request.invocation_id;
        let other = "0".repeat(64);
        let refused = c
            .approvals
            .approve_card(id, &p.request.fingerprint, &other, "alice");
        assert!(
            matches!(refused, Err(AnswerError::CardChanged { .. })),
            "{refused:?}"
        );
        // Still waiting for an answer on the card actually shown.
        assert_eq!(c.approvals.pending().len(), 1);
        let digest = p.request.card().digest();
        c.approvals.deny_card(id, &digest, "alice").unwrap();
    });
    assert_eq!(out.error.as_ref().unwrap().error.code, Code::ApprovalDenied);
    let events = c.events(&out.invocation_id);
    let record = ApprovalRecord::of(&events).unwrap();
    // No session record: the card says the agent is unknown, and binds that.
    assert!(record.card.as_ref().unwrap().agent.is_none());
    let answer = record.answer.as_ref().unwrap();
    assert!(!answer.granted);
    assert_eq!(answer.card_digest, record.card_digest);
    assert_eq!(record.answer_matches_card(), Some(true));
}
