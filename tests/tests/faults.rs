//! A faulty environment: a full disk (a small tmpfs this test mounts and unmounts), also
//! one that fills while a request is in flight and its complete answer is too large to
//! store, a journal whose last page was cut off, a zeroed page outside the events. In
//! each case the broker must report what its records prove — never "unknown" for a
//! request it did not send, never a stored result it does not have — and must refuse to
//! extend or bless a damaged record.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use postern_broker::approvals::Approvals;
use postern_broker::audit::{AuditError, verify_file};
use postern_broker::channel::http::{HttpOutcome, HttpRequest};
use postern_broker::contract::{Code, Outcome, Phase, Retry};
use postern_broker::delivery::{self, DeliveryError};
use postern_broker::invocation::CallContext;
use postern_broker::journal::JournalError;
use postern_broker::journal::space::{RESERVE_BYTES, reserve_path};
use postern_broker::sealed_store::VaultKey;
use postern_broker::vault::{CredentialKind, KeychainBackend, Secret};
use postern_broker::{Broker as BrokerCore, BrokerOptions, OperatorApi};
use postern_console::console::{Console, Paths};
use postern_mcp::server::Sessions;
use postern_tests::adversary::{Adversary, Behavior};
use postern_tests::disk::{Tmpfs, fill};
use postern_tests::fixture::{Broker, open_broker, test_service};
use postern_tests::{open_journal, run_lifecycle, test_signing_key};

const CANARY: &str = "pstn-canary-disk-4be1";

fn config(fast: &str, slow: &str) -> String {
    format!(
        r#"
[[http]]
name = "api"
base_url = "{fast}/v1"
methods = ["GET"]
credential = "api-key"
inject = {{ header = "Authorization", format = "Bearer {{secret}}" }}
approval = "none"
idempotent_methods = ["GET"]
timeout_ms = 5000

[[http]]
name = "slow"
base_url = "{slow}/v1"
methods = ["POST"]
credential = "api-key"
inject = {{ header = "Authorization", format = "Bearer {{secret}}" }}
approval = "none"
timeout_ms = 20000
"#
    )
}

fn get(url: String) -> HttpRequest {
    HttpRequest {
        url,
        method: "GET".into(),
        ..Default::default()
    }
}

async fn run(broker: &Broker, request: HttpRequest) -> HttpOutcome {
    broker
        .channel
        .execute(request, &CallContext::default())
        .await
}

// Regression: issue 10. On a full disk, 1,192 of 1,200 calls came back
// unknown / RESULT_STORE_FAILED / remote_execution with dispatch_started false, and
// get_invocation said "no invocation".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_new_requests_as_not_attempted_and_recovers_when_space_returns() {
    let Some(fs) = Tmpfs::mount("16m") else {
        return;
    };
    let fast = Adversary::start(Behavior::ok_json(r#"{"ok":true}"#))
        .await
        .unwrap();
    let slow = Adversary::start(Behavior::Stall).await.unwrap();
    let data = fs.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let broker = open_broker(
        &data,
        &config(&fast.base_url(), &slow.base_url()),
        &test_service(),
    )
    .unwrap();
    broker.set_secret("api-key", CANARY).unwrap();
    let reserve = reserve_path(&data.join("journal.db"));
    assert_eq!(
        std::fs::metadata(&reserve).unwrap().len(),
        RESERVE_BYTES,
        "the journal keeps its reserve"
    );

    // A request in flight when the disk fills: sent, and the server holds its answer.
    let in_flight = {
        let channel = broker.channel.clone();
        let url = slow.url("/v1/payments");
        tokio::spawn(async move {
            let request = HttpRequest {
                url,
                method: "POST".into(),
                body: b"{\"amount\":1}".to_vec(),
                ..Default::default()
            };
            channel.execute(request, &CallContext::default()).await
        })
    };
    assert!(slow.wait_for_effects(1, Duration::from_secs(10)).await);

    let filler = fs.path().join("filler");
    fill(&filler).unwrap();

    // Every call now either completes (the WAL may still have room of its own) or is
    // refused as not attempted; none is called unknown, and a refused one sent nothing.
    let mut committed = 0u64;
    let mut refused = Vec::new();
    for _ in 0..3000 {
        let outcome = run(&broker, get(fast.url("/v1/items"))).await;
        match outcome.outcome {
            Outcome::Committed => committed += 1,
            Outcome::NotAttempted => refused.push(outcome),
            other => panic!("a call on a full disk came back {other:?}: {outcome:?}"),
        }
        if refused.len() >= 20 {
            break;
        }
    }
    assert!(refused.len() >= 20, "the disk never filled up");
    assert!(
        broker.journal.low_space(),
        "the journal says it is short of space"
    );
    for outcome in &refused {
        let env = outcome.error.as_ref().unwrap();
        assert_eq!(
            (env.error.phase, env.error.retry, env.error.code),
            (Phase::Validation, Retry::Backoff, Code::BrokerUnavailable),
            "{env:#?}"
        );
        assert!(!env.evidence.dispatch_started, "{env:#?}");
        assert!(
            env.error.message.contains("disk is full"),
            "the message says why: {}",
            env.error.message
        );
        // What get_invocation reads: the record, closed as not attempted, or the answer
        // remembered for an invocation the journal could not take at all.
        match broker.journal.projection(&outcome.invocation_id) {
            Ok(p) => {
                assert_eq!(p.outcome, Outcome::NotAttempted);
                assert!(!p.ever_dispatched);
            }
            Err(JournalError::UnknownInvocation(_)) => {
                let remembered = broker
                    .journal
                    .unrecorded(&outcome.invocation_id)
                    .expect("an unrecorded invocation is remembered");
                assert_eq!(remembered.envelope.error, env.error);
            }
            Err(e) => panic!("reading a refused invocation failed: {e}"),
        }
    }
    assert_eq!(
        fast.requests().len() as u64,
        committed,
        "a refused request reached the server"
    );

    // The request in flight settles in the space the reserve gave back.
    slow.release();
    let settled = in_flight.await.unwrap();
    assert_eq!(settled.outcome, Outcome::Committed, "{settled:?}");
    assert_eq!(settled.result.as_ref().unwrap().status, 200);

    // Space comes back: the journal takes its reserve again and serves.
    std::fs::remove_file(&filler).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..50 {
        let outcome = run(&broker, get(fast.url("/v1/items"))).await;
        assert_eq!(outcome.outcome, Outcome::Committed, "{outcome:?}");
    }
    assert!(!broker.journal.low_space());
    assert_eq!(std::fs::metadata(&reserve).unwrap().len(), RESERVE_BYTES);

    let key = broker.journal.verifying_key();
    let db = broker.journal.path().to_path_buf();
    broker.forget(&["api-key"]);
    drop(broker);
    verify_file(&db, &key).unwrap();
    assert!(postern_tests::files_containing(&data, CANARY.as_bytes()).is_empty());
}

/// A closed journal with a few complete invocations.
fn written_journal(dir: &Path) -> PathBuf {
    let db = dir.join("journal.db");
    let journal = open_journal(&db).unwrap();
    write_invocations(&journal);
    journal.close().unwrap();
    db
}

/// A complete invocation, then 40 commits of a stored request large enough to grow the
/// file by several pages.
fn write_invocations(journal: &postern_broker::journal::Journal) {
    run_lifecycle(journal, |_| {}).unwrap();
    for _ in 0..40 {
        journal
            .store_request(
                "inv_crash",
                serde_json::json!({"pad": "x".repeat(2000)}),
                vec![7; 4000],
            )
            .unwrap();
        journal.flush().unwrap();
    }
}

fn page_size(db: &Path) -> u64 {
    let header = std::fs::read(db).unwrap();
    match u16::from_be_bytes([header[16], header[17]]) {
        1 => 65_536,
        n => u64::from(n),
    }
}

// Regression: issue 10. A journal with a cut last page started silently and was signed
// over at shutdown.
#[test]
fn a_journal_with_its_last_page_cut_off_is_refused_and_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let db = written_journal(dir.path());
    let len = std::fs::metadata(&db).unwrap().len();
    let cut = len - page_size(&db);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&db)
        .unwrap()
        .set_len(cut)
        .unwrap();
    let before = std::fs::read(&db).unwrap();

    let err = open_journal(&db).err().expect("a cut journal is refused");
    assert!(matches!(err, JournalError::Damaged { .. }), "{err}");
    let message = err.to_string();
    assert!(message.contains(&db.display().to_string()), "{message}");
    assert!(message.contains("cut off"), "{message}");
    assert!(message.contains("postern audit verify"), "{message}");
    assert_eq!(std::fs::read(&db).unwrap(), before, "the file was changed");

    let err = verify_file(&db, &test_signing_key().verifying_key()).unwrap_err();
    assert!(
        matches!(err, AuditError::Damaged { .. } | AuditError::Broken { .. }),
        "{err}"
    );
}

// Regression: a broker killed while a checkpoint copied the WAL into the journal (page
// 1, with the new size, written first; the pages that extend the file not yet) was
// refused at restart as "cut off", although the WAL still held every missing page.
#[test]
fn a_checkpoint_killed_after_its_first_page_is_completed_from_the_wal_not_refused() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    std::fs::create_dir(&live).unwrap();
    let db = live.join("journal.db");
    let journal = open_journal(&db).unwrap();
    write_invocations(&journal);
    // The files as a SIGKILL would leave them, before any checkpoint of these commits;
    // and the same files checkpointed, for the page 1 a checkpoint writes first.
    let snapshot = |name: &str| {
        let to = dir.path().join(name);
        std::fs::create_dir(&to).unwrap();
        for file in ["journal.db", "journal.db-wal"] {
            std::fs::copy(live.join(file), to.join(file)).unwrap();
        }
        to.join("journal.db")
    };
    let crashed = snapshot("crashed");
    let checkpointed = snapshot("checkpointed");
    journal.close().unwrap();
    let conn = rusqlite::Connection::open(&checkpointed).unwrap();
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    drop(conn);
    let full = std::fs::read(&checkpointed).unwrap();
    let page = usize::try_from(page_size(&checkpointed)).unwrap();
    {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&crashed)
            .unwrap();
        file.write_all_at(&full[..page], 0).unwrap();
    }
    let short = std::fs::metadata(&crashed).unwrap().len();
    assert!(
        short < full.len() as u64,
        "the case needs a file shorter than its header ({short} of {})",
        full.len()
    );
    // Without the WAL, the same file is cut: refused.
    let cut = dir.path().join("cut");
    std::fs::create_dir(&cut).unwrap();
    std::fs::copy(&crashed, cut.join("journal.db")).unwrap();
    let err = open_journal(&cut.join("journal.db"))
        .err()
        .expect("refused");
    assert!(matches!(err, JournalError::Damaged { .. }), "{err}");

    let reopened = open_journal(&crashed).unwrap();
    let (_, body) = reopened.load_request("inv_crash").unwrap().expect("kept");
    assert_eq!(body, vec![7; 4000]);
    reopened.close().unwrap();
    verify_file(&crashed, &test_signing_key().verifying_key()).unwrap();
}

// Regression: issue 10. A zeroed page outside `events` passed `audit verify`.
#[test]
fn a_zeroed_page_outside_the_events_fails_verification() {
    let dir = tempfile::tempdir().unwrap();
    let db = written_journal(dir.path());
    let key = test_signing_key().verifying_key();
    verify_file(&db, &key).unwrap();
    let root: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row(
            "SELECT rootpage FROM sqlite_master WHERE name = 'requests'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let size = page_size(&db);
    let mut bytes = std::fs::read(&db).unwrap();
    let at = usize::try_from((root as u64 - 1) * size).unwrap();
    bytes[at..at + size as usize].fill(0);
    std::fs::write(&db, &bytes).unwrap();

    let err = verify_file(&db, &key).unwrap_err();
    assert!(matches!(err, AuditError::Damaged { .. }), "{err}");
    assert!(err.to_string().contains("damaged"), "{err}");
}

// Regression: issue 10. The unsigned tail after a crash could be cut at the chain level
// (rows deleted past the last checkpoint) and the broker went on extending it.
#[test]
fn events_deleted_after_the_last_checkpoint_are_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let db = written_journal(dir.path());
    let conn = rusqlite::Connection::open(&db).unwrap();
    let (last, checkpoint): (i64, i64) = conn
        .query_row(
            "SELECT (SELECT max(seq) FROM events), (SELECT max(seq) FROM checkpoints)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(last >= 2);
    // Drop the signed head's own row: the checkpoint now names an event that is gone.
    conn.execute("DELETE FROM events WHERE seq >= ?1", [checkpoint])
        .unwrap();
    drop(conn);
    let err = open_journal(&db).err().expect("a cut chain is refused");
    assert!(matches!(err, JournalError::Damaged { .. }), "{err}");
}

/// Larger than the journal's reserve, so the space a full disk gives back cannot hold
/// it, and not a multiple of a chunk.
const LARGE_BODY: usize = 6 * 1024 * 1024 + 4321;

fn large_body() -> Vec<u8> {
    (0..LARGE_BODY).map(|i| (i * 31 % 251) as u8).collect()
}

/// A whole broker (what the console runs over), its data dir on the tmpfs, the targets
/// file and the keychain in it too (the file keychain: no session bus needed).
fn open_full_broker(data: &Path, origin: &str) -> OperatorApi {
    std::fs::create_dir(data).unwrap();
    let config = data.join("postern.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[[http]]
name = "reports"
base_url = "{origin}/v1"
methods = ["GET", "POST"]
credential = "api-key"
inject = {{ header = "Authorization", format = "Bearer {{secret}}" }}
approval = "none"
timeout_ms = 30000
"#
        ),
    )
    .unwrap();
    let opened = BrokerCore::open(BrokerOptions {
        data_dir: data.to_path_buf(),
        config,
        keychain: KeychainBackend::File,
        service: "postern".into(),
        approver: None,
        anchor: None,
        vault_key: Some(VaultKey::from_bytes(&[9; 32]).unwrap()),
    })
    .unwrap();
    let broker = opened.operator;
    broker
        .vault()
        .set(
            "api-key",
            CredentialKind::Token,
            &Secret::from(CANARY.to_string()),
            broker.journal().now_ms(),
        )
        .unwrap();
    broker
}

fn console_over(broker: &OperatorApi, data: &Path) -> Console {
    Console::new(
        broker.clone(),
        Arc::new(Sessions::default()),
        Arc::new(Approvals::new(
            Duration::from_secs(5),
            Arc::new(postern_broker::clock::SystemClock),
        )),
        Paths {
            data_dir: data.to_path_buf(),
            config: data.join("postern.toml"),
            socket: data.join("postern.sock"),
            keychain: "file".into(),
        },
    )
}

/// A POST the origin has read completely (so DISPATCH_STARTED is on disk) and whose
/// answer it holds back.
async fn dispatched_post(
    broker: &OperatorApi,
    origin: &Adversary,
) -> tokio::task::JoinHandle<HttpOutcome> {
    let in_flight = {
        let broker = broker.clone();
        let url = origin.url("/v1/reports");
        tokio::spawn(async move {
            let request = HttpRequest {
                url,
                method: "POST".into(),
                body: b"{\"report\":\"quarterly\"}".to_vec(),
                ..Default::default()
            };
            broker
                .http()
                .execute(request, &CallContext::default())
                .await
        })
    };
    assert!(origin.wait_for_effects(1, Duration::from_secs(10)).await);
    in_flight
}

/// No stored result for `invocation_id`: no row claims one, and reading it back is a
/// typed refusal, never a partial body.
fn assert_nothing_stored(broker: &OperatorApi, invocation_id: &str) {
    let p = broker.journal().projection(invocation_id).unwrap();
    assert_eq!(p.result_id, None, "{p:#?}");
    assert!(
        matches!(
            delivery::piece(broker.journal(), &p, None, None),
            Err(DeliveryError::NoResult)
        ),
        "fetch_result must refuse: nothing was stored"
    );
    let recorded = broker.http().recorded_projection(&p).unwrap();
    assert!(recorded.result.is_none(), "a read-back claimed a body");
    let conn = rusqlite::Connection::open_with_flags(
        broker.journal().path(),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let rows: i64 = conn
        .query_row(
            "SELECT count(*) FROM results WHERE invocation_id = ?1",
            [invocation_id],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        rows, 0,
        "a result row exists for a result that was not stored"
    );
    let chunks: i64 = conn
        .query_row("SELECT count(*) FROM result_chunks", [], |r| r.get(0))
        .unwrap();
    assert_eq!(chunks, 0, "chunks of a result that was not stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_response_too_large_for_a_full_disk_is_recorded_in_result_delivery_and_alerts_the_operator()
 {
    let Some(fs) = Tmpfs::mount("24m") else {
        return;
    };
    let body = large_body();
    let origin = Adversary::start(Behavior::StallThenRespond {
        status: 200,
        body: body.clone(),
    })
    .await
    .unwrap();
    let data = fs.path().join("data");
    let broker = open_full_broker(&data, &origin.base_url());
    let console = console_over(&broker, &data);
    assert_eq!(console.overview().unwrap().result_store_failures, 0);

    let in_flight = dispatched_post(&broker, &origin).await;
    let filler = fs.path().join("filler");
    fill(&filler).unwrap();

    // The origin answers completely. The journal gives its reserve back for the commit,
    // but the result is larger than the reserve.
    origin.release();
    let outcome = in_flight.await.unwrap();
    let id = outcome.invocation_id.clone();

    // The caller gets the complete response it got, the only copy left.
    assert_eq!(outcome.outcome, Outcome::Committed, "{outcome:?}");
    let response = outcome
        .result
        .as_ref()
        .expect("the caller gets the response");
    assert_eq!(response.status, 200);
    assert!(
        response.body == body,
        "the caller's body is not the origin's"
    );
    let env = outcome
        .error
        .as_ref()
        .expect("the failure to store is reported");
    assert_eq!(
        (
            env.error.code,
            env.error.phase,
            env.error.outcome,
            env.error.retry
        ),
        (
            Code::ResultStoreFailed,
            Phase::ResultDelivery,
            Outcome::Committed,
            Retry::Never
        ),
        "{env:#?}"
    );
    assert!(env.evidence.dispatch_started && env.evidence.response_complete);
    assert!(broker.journal().low_space(), "the disk was full");
    // Regression: SQLite rolled the whole transaction back on the full disk, and the
    // record blamed "cannot commit - no transaction is active" instead.
    assert!(
        env.error.message.contains("disk is full"),
        "the message says why: {}",
        env.error.message
    );

    // The record proves the same: the remote answered completely, the result is lost.
    let p = broker.journal().projection(&id).unwrap();
    let now = broker.journal().now_ms();
    assert_eq!(
        (p.outcome, p.phase, p.code, p.retry(now), p.terminal),
        (
            Outcome::Committed,
            Phase::ResultDelivery,
            Some(Code::ResultStoreFailed),
            Retry::Never,
            true
        ),
        "{p:#?}"
    );
    let kinds: Vec<&str> = broker
        .journal()
        .events(&id)
        .unwrap()
        .iter()
        .map(|e| e.body.kind())
        .collect();
    assert!(kinds.contains(&"DISPATCH_STARTED"), "{kinds:?}");
    assert_eq!(
        kinds[kinds.len() - 2..],
        ["REMOTE_RESPONSE_COMPLETE", "FAILED"],
        "{kinds:?}"
    );
    assert!(!kinds.contains(&"RESULT_COMMITTED"), "{kinds:?}");
    assert_nothing_stored(&broker, &id);

    // The operator is told, from the journal, while the disk is still full.
    let failures = broker.journal().store_failures().unwrap();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].invocation_id, id);
    assert!(failures[0].recorded);
    assert!(failures[0].detail.contains("disk is full"), "{failures:?}");
    let overview = console.overview().unwrap();
    assert_eq!(overview.result_store_failures, 1);
    assert_eq!(
        overview.result_store_failure_latest.as_deref(),
        Some(id.as_str())
    );

    // Space comes back: the record and the alert stay as they were, and nothing claims
    // a stored result; the chain verifies.
    std::fs::remove_file(&filler).unwrap();
    assert_nothing_stored(&broker, &id);
    assert_eq!(console.overview().unwrap().result_store_failures, 1);
    let key = broker.journal().verifying_key();
    let db = broker.journal().path().to_path_buf();
    drop(console);
    broker.journal().clone().close().unwrap();
    drop(broker);
    verify_file(&db, &key).unwrap();
    assert!(postern_tests::files_containing(&data, CANARY.as_bytes()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_response_whose_failure_cannot_be_recorded_either_stays_unknown_and_alerts_the_operator()
 {
    let Some(fs) = Tmpfs::mount("24m") else {
        return;
    };
    let body = large_body();
    let origin = Adversary::start(Behavior::StallThenRespond {
        status: 200,
        body: body.clone(),
    })
    .await
    .unwrap();
    let data = fs.path().join("data");
    let broker = open_full_broker(&data, &origin.base_url());
    let console = console_over(&broker, &data);
    let reserve = reserve_path(broker.journal().path());

    let in_flight = dispatched_post(&broker, &origin).await;
    let filler = fs.path().join("filler");
    fill(&filler).unwrap();
    // A new request on the full disk makes the journal give its reserve back (and is
    // refused, sent nowhere); then the disk is filled again, so not one page is left.
    let refused = broker
        .http()
        .execute(
            HttpRequest {
                url: origin.url("/v1/reports"),
                method: "GET".into(),
                ..Default::default()
            },
            &CallContext::default(),
        )
        .await;
    assert_eq!(refused.outcome, Outcome::NotAttempted, "{refused:?}");
    assert!(broker.journal().low_space());
    assert!(!reserve.exists(), "the reserve was given back");
    let more = fs.path().join("filler-2");
    fill(&more).unwrap();

    origin.release();
    let outcome = in_flight.await.unwrap();
    let id = outcome.invocation_id.clone();

    // Nothing could be recorded: the answer says the outcome is unknown (the record
    // proves only the dispatch), in result_delivery, and still carries the response.
    assert_eq!(outcome.outcome, Outcome::Unknown, "{outcome:?}");
    let env = outcome.error.as_ref().expect("the failure is reported");
    assert_eq!(
        (env.error.code, env.error.phase, env.error.outcome),
        (
            Code::ResultStoreFailed,
            Phase::ResultDelivery,
            Outcome::Unknown
        ),
        "{env:#?}"
    );
    let response = outcome
        .result
        .as_ref()
        .expect("the caller gets the response");
    assert_eq!(response.status, 200);
    assert!(
        response.body == body,
        "the caller's body is not the origin's"
    );

    assert!(
        env.error.message.contains("disk is full"),
        "the message says why: {}",
        env.error.message
    );
    // The record claims nothing it cannot prove: dispatched, outcome unknown, no result.
    let p = broker.journal().projection(&id).unwrap();
    assert!(p.ever_dispatched);
    assert_eq!(p.outcome, Outcome::Unknown, "{p:#?}");
    let kinds: Vec<&str> = broker
        .journal()
        .events(&id)
        .unwrap()
        .iter()
        .map(|e| e.body.kind())
        .collect();
    assert!(!kinds.contains(&"REMOTE_RESPONSE_COMPLETE"), "{kinds:?}");
    assert!(!kinds.contains(&"RESULT_COMMITTED"), "{kinds:?}");
    assert_nothing_stored(&broker, &id);

    // The operator is told all the same (this process saw it).
    let failures = broker.journal().store_failures().unwrap();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].invocation_id, id);
    assert!(!failures[0].recorded);
    let overview = console.overview().unwrap();
    assert_eq!(overview.result_store_failures, 1);
    assert_eq!(
        overview.result_store_failure_latest.as_deref(),
        Some(id.as_str())
    );

    std::fs::remove_file(&filler).unwrap();
    std::fs::remove_file(&more).unwrap();
    let key = broker.journal().verifying_key();
    let db = broker.journal().path().to_path_buf();
    drop(console);
    broker.journal().clone().close().unwrap();
    drop(broker);
    verify_file(&db, &key).unwrap();
    assert!(postern_tests::files_containing(&data, CANARY.as_bytes()).is_empty());
}
