//! Operator queries: the activity log (filters, order, limit) and the phase/outcome/code
//! counts, read through a separate read-only connection as the CLI does.

use postern_broker::clock::Clock;
use postern_broker::contract::*;
use postern_broker::invocation::Recorder;
use postern_broker::journal::NewInvocation;
use postern_broker::journal::events::Channel;
use postern_broker::journal::query::{self, Filter, InvocationRow};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use crate::support::*;

fn read_only(f: &Fixture) -> Connection {
    f.journal.flush().unwrap();
    Connection::open_with_flags(f.db(), OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap()
}

fn accept(f: &Fixture, id: &str, target: &str, session: Option<&str>) -> Recorder {
    Recorder::accept(
        &f.journal,
        NewInvocation {
            invocation_id: id.to_string(),
            channel: Channel::Http,
            target: target.to_string(),
            summary: format!("GET https://{target}.example.test/{id}"),
            session: session.map(str::to_string),
            idempotency_key: None,
            parent: None,
        },
    )
    .unwrap()
}

/// Drives a ready invocation through a complete, delivered 200 response.
fn complete(rec: &Recorder) {
    commit_200(rec);
    rec.delivered().unwrap();
}

/// Five invocations, one second apart:
/// - `inv_1` payments/session-1: committed and delivered (phase remote_execution)
/// - `inv_2` payments/session-1: dispatched, no response (unknown)
/// - `inv_3` search/session-2: DNS failure (not_attempted, connection_setup)
/// - `inv_4` search/no session: rejected in validation
/// - `inv_5` payments/session-1: accepted only (in flight)
fn populated() -> Fixture {
    let f = Fixture::new();
    let rec = ready(&f.journal, "inv_1", false, None);
    complete(&rec);
    f.clock.advance_ms(1000);

    let rec = ready(&f.journal, "inv_2", false, None);
    rec.dispatch_started(FP, None, None).unwrap();
    f.clock.advance_ms(1000);

    let mut rec = accept(&f, "inv_3", "search", Some("session-2"));
    rec.preflight(FP, snapshot(None), operation(true, None))
        .unwrap();
    rec.credential_authorized("payments-key", "v1-abcdef01")
        .unwrap();
    rec.start_attempt("worker-a", 60_000).unwrap();
    rec.fail(
        Phase::ConnectionSetup,
        Code::DnsFailed,
        Retry::Backoff,
        "no such host",
    )
    .unwrap();
    f.clock.advance_ms(1000);

    let rec = accept(&f, "inv_4", "search", None);
    rec.fail(
        Phase::Validation,
        Code::InvalidTarget,
        Retry::AfterCorrection,
        "no target",
    )
    .unwrap();
    f.clock.advance_ms(1000);

    accept(&f, "inv_5", "payments", Some("session-1"));
    f
}

fn ids(rows: &[InvocationRow]) -> Vec<&str> {
    rows.iter().map(|r| r.id.as_str()).collect()
}

#[test]
fn list_is_newest_first_with_folded_status() {
    let f = populated();
    let conn = read_only(&f);
    let rows = query::list(&conn, &Filter::default(), f.clock.now_ms()).unwrap();
    assert_eq!(ids(&rows), ["inv_5", "inv_4", "inv_3", "inv_2", "inv_1"]);

    let by_id = |id: &str| rows.iter().find(|r| r.id == id).unwrap();
    let done = by_id("inv_1");
    assert_eq!(done.accepted_at_ms, T0);
    assert_eq!(done.session.as_deref(), Some("session-1"));
    assert_eq!(done.target, "payments");
    assert_eq!(done.summary, "POST https://api.example.test/v1/payments");
    assert_eq!(done.outcome, Outcome::Committed);
    // A settled result stays in the phase where the broker stopped.
    assert_eq!(done.phase, Phase::RemoteExecution);
    assert_eq!(done.code, None);

    let unknown = by_id("inv_2");
    assert_eq!(unknown.accepted_at_ms, T0 + 1000);
    assert_eq!(unknown.phase, Phase::RemoteExecution);
    assert_eq!(unknown.outcome, Outcome::Unknown);
    assert_eq!(unknown.code, Some(Code::RemoteOutcomeUnknown));
    // A non-idempotent operation without a key contract is never blindly re-run.
    assert_ne!(unknown.retry, Retry::Backoff);
    assert_ne!(unknown.retry, Retry::SameIdempotencyKey);

    let dns = by_id("inv_3");
    assert_eq!(dns.phase, Phase::ConnectionSetup);
    assert_eq!(dns.outcome, Outcome::NotAttempted);
    assert_eq!(dns.retry, Retry::Backoff);
    assert_eq!(dns.code, Some(Code::DnsFailed));
    assert_eq!(dns.summary, "GET https://search.example.test/inv_3");

    let invalid = by_id("inv_4");
    assert_eq!(invalid.session, None);
    assert_eq!(invalid.phase, Phase::Validation);
    assert_eq!(invalid.retry, Retry::AfterCorrection);
    assert_eq!(invalid.code, Some(Code::InvalidTarget));

    let in_flight = by_id("inv_5");
    assert_eq!(in_flight.outcome, Outcome::NotAttempted);
    assert_eq!(in_flight.code, None);
}

#[test]
fn identity_filters_select_by_session_target_and_time() {
    let f = populated();
    let conn = read_only(&f);
    let now = f.clock.now_ms();
    let list = |filter: Filter| ids(&query::list(&conn, &filter, now).unwrap()).join(",");

    let session = |s: &str| Filter {
        session: Some(s.to_string()),
        ..Filter::default()
    };
    assert_eq!(list(session("session-1")), "inv_5,inv_2,inv_1");
    assert_eq!(list(session("session-2")), "inv_3");
    assert_eq!(list(session("nobody")), "");

    let target = Filter {
        target: Some("search".to_string()),
        ..Filter::default()
    };
    assert_eq!(list(target), "inv_4,inv_3");

    // Inclusive lower bound on the acceptance time.
    let since = Filter {
        since_ms: Some(T0 + 2000),
        ..Filter::default()
    };
    assert_eq!(list(since), "inv_5,inv_4,inv_3");

    let both = Filter {
        session: Some("session-1".to_string()),
        target: Some("payments".to_string()),
        since_ms: Some(T0 + 1),
        ..Filter::default()
    };
    assert_eq!(list(both), "inv_5,inv_2");
}

#[test]
fn status_filters_apply_to_the_folded_projection() {
    let f = populated();
    let conn = read_only(&f);
    let now = f.clock.now_ms();
    let list = |filter: Filter| ids(&query::list(&conn, &filter, now).unwrap()).join(",");

    let outcome = |o| Filter {
        outcome: Some(o),
        ..Filter::default()
    };
    assert_eq!(list(outcome(Outcome::NotAttempted)), "inv_5,inv_4,inv_3");
    assert_eq!(list(outcome(Outcome::Unknown)), "inv_2");
    assert_eq!(list(outcome(Outcome::Committed)), "inv_1");
    assert_eq!(list(outcome(Outcome::Rejected)), "");

    let phase = |p| Filter {
        phase: Some(p),
        ..Filter::default()
    };
    assert_eq!(list(phase(Phase::RemoteExecution)), "inv_2,inv_1");
    assert_eq!(list(phase(Phase::ConnectionSetup)), "inv_3");
    // An in-flight invocation that only got accepted is still in validation.
    assert_eq!(list(phase(Phase::Validation)), "inv_5,inv_4");

    let code = |c| Filter {
        code: Some(c),
        ..Filter::default()
    };
    assert_eq!(list(code(Code::RemoteOutcomeUnknown)), "inv_2");
    assert_eq!(list(code(Code::DnsFailed)), "inv_3");
    assert_eq!(list(code(Code::TlsRejected)), "");

    // Phase and outcome are independent axes: combining them narrows.
    let combined = Filter {
        phase: Some(Phase::Validation),
        outcome: Some(Outcome::NotAttempted),
        code: Some(Code::InvalidTarget),
        ..Filter::default()
    };
    assert_eq!(list(combined), "inv_4");
}

#[test]
fn limit_applies_after_filtering() {
    let f = populated();
    let conn = read_only(&f);
    let now = f.clock.now_ms();
    let list = |filter: Filter| ids(&query::list(&conn, &filter, now).unwrap()).join(",");

    let limited = |limit| Filter {
        limit: Some(limit),
        ..Filter::default()
    };
    assert_eq!(list(limited(2)), "inv_5,inv_4");
    assert_eq!(list(limited(0)), "");
    assert_eq!(list(limited(99)).split(',').count(), 5);

    // The newest two not_attempted invocations, not the not_attempted among the newest two.
    let filtered = Filter {
        outcome: Some(Outcome::NotAttempted),
        limit: Some(2),
        ..Filter::default()
    };
    assert_eq!(list(filtered), "inv_5,inv_4");
    let filtered = Filter {
        outcome: Some(Outcome::Unknown),
        limit: Some(1),
        ..Filter::default()
    };
    assert_eq!(list(filtered), "inv_2");
}

#[test]
fn stats_count_phase_and_outcome_separately() {
    let f = populated();
    let conn = read_only(&f);
    let stats = query::stats(&conn, f.clock.now_ms()).unwrap();
    assert_eq!(stats.invocations, 5);

    // Every phase and outcome is listed, zeros included, and each axis sums to the
    // number of invocations on its own.
    assert_eq!(stats.by_phase.len(), Phase::ALL.len());
    assert_eq!(stats.by_outcome.len(), Outcome::ALL.len());
    assert_eq!(stats.by_phase.values().sum::<u64>(), 5);
    assert_eq!(stats.by_outcome.values().sum::<u64>(), 5);

    assert_eq!(stats.by_phase["validation"], 2);
    assert_eq!(stats.by_phase["credential_injection"], 0);
    assert_eq!(stats.by_phase["connection_setup"], 1);
    // The committed and the unknown invocation share a phase but not an outcome.
    assert_eq!(stats.by_phase["remote_execution"], 2);
    assert_eq!(stats.by_phase["result_delivery"], 0);

    assert_eq!(stats.by_outcome["not_attempted"], 3);
    assert_eq!(stats.by_outcome["unknown"], 1);
    assert_eq!(stats.by_outcome["committed"], 1);
    assert_eq!(stats.by_outcome["rejected"], 0);

    // Only codes that occur; the success and the in-flight one have none.
    assert_eq!(stats.by_code.len(), 3);
    assert_eq!(stats.by_code["REMOTE_OUTCOME_UNKNOWN"], 1);
    assert_eq!(stats.by_code["DNS_FAILED"], 1);
    assert_eq!(stats.by_code["INVALID_TARGET"], 1);

    let json = serde_json::to_value(&stats).unwrap();
    assert!(json["by_phase"].is_object() && json["by_outcome"].is_object());
}

#[test]
fn empty_journal_has_no_rows_and_zero_counts() {
    let f = Fixture::new();
    let conn = read_only(&f);
    assert!(
        query::list(&conn, &Filter::default(), T0)
            .unwrap()
            .is_empty()
    );
    let stats = query::stats(&conn, T0).unwrap();
    assert_eq!(stats.invocations, 0);
    assert!(stats.by_phase.values().all(|n| *n == 0));
    assert!(stats.by_outcome.values().all(|n| *n == 0));
    assert!(stats.by_code.is_empty());
}

#[test]
fn rows_serialize_with_wire_names() {
    let f = populated();
    let conn = read_only(&f);
    let filter = Filter {
        code: Some(Code::RemoteOutcomeUnknown),
        ..Filter::default()
    };
    let rows = query::list(&conn, &filter, f.clock.now_ms()).unwrap();
    let json = serde_json::to_value(&rows[0]).unwrap();
    assert_eq!(json["id"], "inv_2");
    assert_eq!(json["phase"], "remote_execution");
    assert_eq!(json["outcome"], "unknown");
    assert_eq!(json["code"], "REMOTE_OUTCOME_UNKNOWN");
    assert_eq!(json["session"], "session-1");
    assert!(json["retry"].is_string());
    assert_eq!(json["accepted_at_ms"], T0 + 1000);
}

#[test]
fn a_record_that_does_not_fold_is_an_error_in_the_log_not_a_status() {
    let f = populated();
    f.journal.flush().unwrap();
    // Rewrite inv_2's DISPATCH_STARTED into a second ACTION_ACCEPTED: impossible.
    let writer = Connection::open(f.db()).unwrap();
    let body: String = writer
        .query_row(
            "SELECT body FROM events WHERE invocation_id = 'inv_1' AND kind = 'ACTION_ACCEPTED'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    writer
        .execute(
            "UPDATE events SET body = ?1
             WHERE invocation_id = 'inv_2' AND kind = 'DISPATCH_STARTED'",
            [body],
        )
        .unwrap();
    let conn = read_only(&f);
    let err = query::list(&conn, &Filter::default(), f.clock.now_ms()).unwrap_err();
    assert!(err.to_string().contains("inv_2"), "{err}");
    // Counts come from the status the writer indexed when the events were appended;
    // detecting later tampering is `audit verify`'s job, not the counter's.
    let stats = query::stats(&conn, f.clock.now_ms()).unwrap();
    assert!(stats.invocations >= 2);
}

#[test]
fn the_status_index_matches_the_folded_projection_after_every_step() {
    let f = Fixture::new();
    let rec = ready(&f.journal, "inv_idx", false, None);
    rec.dispatch_started(FP, None, None).unwrap();
    let conn = rusqlite::Connection::open(f.db()).unwrap();
    let status = |conn: &rusqlite::Connection| -> (String, String, Option<String>) {
        conn.query_row(
            "SELECT phase, outcome, code FROM invocations WHERE id = 'inv_idx'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap()
    };
    assert_eq!(
        status(&conn),
        (
            "remote_execution".into(),
            "unknown".into(),
            Some("REMOTE_OUTCOME_UNKNOWN".into())
        )
    );
    rec.fail(
        Phase::RemoteExecution,
        Code::RemoteTimeout,
        Retry::Reconcile,
        "slow",
    )
    .unwrap();
    assert_eq!(
        status(&conn),
        (
            "remote_execution".into(),
            "unknown".into(),
            Some("REMOTE_TIMEOUT".into())
        )
    );
    let p = f.journal.projection("inv_idx").unwrap();
    assert_eq!(status(&conn).1, p.outcome.as_str());
}

#[test]
fn keyset_paging_walks_every_invocation_once_newest_first() {
    let f = Fixture::new();
    for i in 0..7 {
        ready(&f.journal, &format!("inv_{i}"), false, None);
    }
    let conn = rusqlite::Connection::open(f.db()).unwrap();
    let mut seen = Vec::new();
    let mut before = None;
    loop {
        let filter = Filter {
            limit: Some(3),
            before_seq: before,
            ..Default::default()
        };
        let page = query::list(&conn, &filter, T0).unwrap();
        if page.is_empty() {
            break;
        }
        let last = page.last().unwrap().id.clone();
        before = Some(
            conn.query_row(
                "SELECT accepted_seq FROM invocations WHERE id = ?1",
                [&last],
                |r| r.get(0),
            )
            .unwrap(),
        );
        seen.extend(page.into_iter().map(|r| r.id));
    }
    assert_eq!(
        seen,
        (0..7).rev().map(|i| format!("inv_{i}")).collect::<Vec<_>>()
    );
}

fn search(conn: &Connection, text: &str, extra: Filter) -> Vec<String> {
    let rows = query::list(
        conn,
        &Filter {
            text: Some(text.to_string()),
            ..extra
        },
        0,
    )
    .unwrap();
    rows.into_iter().map(|r| r.id).collect()
}

#[test]
fn text_search_finds_substrings_of_target_and_url_newest_first() {
    let f = populated();
    let conn = read_only(&f);
    // Through the trigram index (three characters or more), case-insensitively.
    assert_eq!(
        search(&conn, "v1/payments", Filter::default()),
        ["inv_2", "inv_1"]
    );
    assert_eq!(
        search(&conn, "SEARCH.example", Filter::default()),
        ["inv_4", "inv_3"]
    );
    assert_eq!(search(&conn, "test/inv_3", Filter::default()), ["inv_3"]);
    // Target names are searched too.
    assert_eq!(
        search(&conn, "payments", Filter::default()),
        ["inv_5", "inv_2", "inv_1"]
    );
    // Combined with the other filters and with keyset paging.
    let with_session = Filter {
        session: Some("session-2".into()),
        ..Filter::default()
    };
    assert_eq!(search(&conn, "search", with_session), ["inv_3"]);
    let newest = query::list(&conn, &Filter::default(), 0).unwrap();
    let inv_4_seq = newest
        .iter()
        .find(|r| r.id == "inv_4")
        .unwrap()
        .accepted_seq;
    let paged = Filter {
        before_seq: Some(inv_4_seq),
        ..Filter::default()
    };
    assert_eq!(search(&conn, "search", paged), ["inv_3"]);
    // Too short for trigrams: a LIKE scan, same semantics.
    assert_eq!(search(&conn, "_5", Filter::default()), ["inv_5"]);
    // Quotes and wildcard characters are literal, never syntax.
    assert!(search(&conn, "\"payments", Filter::default()).is_empty());
    assert!(search(&conn, "%", Filter::default()).is_empty());
    assert!(search(&conn, "pay%ents", Filter::default()).is_empty());
    assert!(search(&conn, "nothing like this", Filter::default()).is_empty());
}

#[test]
fn the_search_index_is_rebuilt_for_journals_written_before_it() {
    // Undo migrations 8, 7 and 6 and the summary column's contents, as a journal
    // written by an older build would be; reopening migrates it again.
    let f = populated().reopen_after(|db| {
        Connection::open(db)
            .unwrap()
            .execute_batch(
                "DROP INDEX invocations_by_parent; ALTER TABLE invocations DROP COLUMN parent_id;
                 ALTER TABLE invocations DROP COLUMN relation;
                 DROP TABLE merkle; DROP TABLE cosignatures;
                 ALTER TABLE checkpoints DROP COLUMN root; ALTER TABLE checkpoints DROP COLUMN note;
                 DROP TABLE invocation_search; UPDATE invocations SET summary = NULL;
                 PRAGMA user_version = 5;",
            )
            .unwrap()
    });
    let conn = read_only(&f);
    assert_eq!(search(&conn, "test/inv_3", Filter::default()), ["inv_3"]);
    assert_eq!(search(&conn, "_5", Filter::default()), ["inv_5"]);
}

fn indexed_for_search(conn: &Connection) -> i64 {
    conn.query_row("SELECT count(*) FROM invocation_search_docsize", [], |r| {
        r.get(0)
    })
    .unwrap()
}

#[test]
fn a_search_matches_invocations_the_index_has_not_taken_in_yet() {
    // Closing feeds the index everything accepted; reopening finds nothing to add. The
    // index waits an hour here, so what follows stays above it however slow the run.
    let f = populated().reopen_with(|_| {}, |o| o.search_delay = Duration::from_secs(3600));
    accept(&f, "inv_6", "payments", None);
    accept(&f, "inv_7", "search", None);
    let conn = read_only(&f);
    // The two newest wait for the index (fewer than a batch, younger than its delay).
    assert_eq!(indexed_for_search(&conn), 5);
    assert_eq!(
        search(&conn, "payments", Filter::default()),
        ["inv_6", "inv_5", "inv_2", "inv_1"]
    );
    assert_eq!(
        search(&conn, "SEARCH.example", Filter::default()),
        ["inv_7", "inv_4", "inv_3"]
    );
    // A page that ends above the index, and one that crosses into it.
    let one = Filter {
        limit: Some(1),
        ..Filter::default()
    };
    assert_eq!(search(&conn, "payments", one), ["inv_6"]);
    let two = Filter {
        limit: Some(2),
        ..Filter::default()
    };
    assert_eq!(search(&conn, "payments", two), ["inv_6", "inv_5"]);
    // Wildcards stay literal on both sides of the boundary.
    assert!(search(&conn, "pay%ents", Filter::default()).is_empty());
    drop(conn);

    // Closing takes the rest in, and the answers do not change.
    let f = f.reopen();
    let conn = read_only(&f);
    assert_eq!(indexed_for_search(&conn), 7);
    assert_eq!(
        search(&conn, "payments", Filter::default()),
        ["inv_6", "inv_5", "inv_2", "inv_1"]
    );
}

#[test]
fn the_search_index_takes_in_what_a_crash_left_out_when_the_journal_opens() {
    // As a process killed before it fed the index would leave it: the newest two
    // invocations are not in it.
    let f = populated().reopen_after(|db| {
        let conn = Connection::open(db).unwrap();
        conn.execute_batch(
            "DROP TABLE invocation_search;
             CREATE VIRTUAL TABLE invocation_search USING fts5(text, tokenize = 'trigram', content = '');
             INSERT INTO invocation_search (rowid, text)
             SELECT accepted_seq, target || ' ' || summary FROM invocations
             ORDER BY accepted_seq LIMIT 3;",
        )
        .unwrap();
        assert_eq!(indexed_for_search(&conn), 3);
    });
    let conn = read_only(&f);
    assert_eq!(indexed_for_search(&conn), 5);
    assert_eq!(search(&conn, "test/inv_5", Filter::default()), ["inv_5"]);
}

#[test]
fn the_writer_feeds_the_search_index_once_a_batch_waits() {
    // The delay is an hour, so only the count can feed the index here.
    let f = Fixture::new().reopen_with(|_| {}, |o| o.search_delay = Duration::from_secs(3600));
    let batch = postern_broker::journal::SEARCH_BATCH;
    for i in 0..batch - 1 {
        accept(&f, &format!("inv_{i}"), "payments", None);
    }
    // The commit that makes a batch feeds the index, without waiting for the delay.
    accept(&f, "inv_last", "payments", None);
    let conn = read_only(&f);
    assert_eq!(indexed_for_search(&conn), batch as i64);
    assert_eq!(
        search(&conn, "test/inv_last", Filter::default()),
        ["inv_last"]
    );
}
