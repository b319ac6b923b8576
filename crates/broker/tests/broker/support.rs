//! Shared fixtures: a journal in a temp dir with a manual clock, and invocations driven
//! to a chosen point of their lifecycle.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ed25519_dalek::SigningKey;
use postern_broker::action::ConfigSnapshot;
use postern_broker::clock::ManualClock;
use postern_broker::contract::{
    ConfidenceSource, IdempotencyEvidence, Outcome, RemoteContract, Retry,
};
use postern_broker::invocation::Recorder;
use postern_broker::journal::events::{Channel, OperationFacts, ResultFacts};
use postern_broker::journal::{Journal, JournalOptions, NewInvocation, ResultToStore, Settle};

pub const T0: i64 = 1_800_000_000_000;
pub const FP: &str = "blake3:0000000000000000000000000000000000000000000000000000000000000001";

pub fn signing_key() -> SigningKey {
    SigningKey::from_bytes(&[7u8; 32])
}

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub clock: ManualClock,
    pub journal: Journal,
}

impl Fixture {
    pub fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(T0);
        let journal = open(&dir.path().join("journal.db"), &clock);
        Fixture {
            dir,
            clock,
            journal,
        }
    }

    pub fn db(&self) -> PathBuf {
        self.dir.path().join("journal.db")
    }

    /// Closes the journal and opens it again.
    pub fn reopen(self) -> Fixture {
        self.reopen_with(|_| {}, |_| {})
    }

    /// Closes the journal, lets `edit` change the closed database (at the path it is
    /// given), and opens it again.
    pub fn reopen_after(self, edit: impl FnOnce(&Path)) -> Fixture {
        self.reopen_with(edit, |_| {})
    }

    /// Closes the journal, lets `edit` change the closed database, and opens it again
    /// with the options `adjust` leaves.
    pub fn reopen_with(
        self,
        edit: impl FnOnce(&Path),
        adjust: impl FnOnce(&mut JournalOptions),
    ) -> Fixture {
        let Fixture {
            dir,
            clock,
            journal,
        } = self;
        journal.close().unwrap();
        let db = dir.path().join("journal.db");
        edit(&db);
        let mut options = JournalOptions::new(Arc::new(clock.clone()), signing_key());
        adjust(&mut options);
        let journal = Journal::open(&db, options).unwrap();
        Fixture {
            dir,
            clock,
            journal,
        }
    }
}

pub fn open(path: &Path, clock: &ManualClock) -> Journal {
    Journal::open(
        path,
        JournalOptions::new(Arc::new(clock.clone()), signing_key()),
    )
    .unwrap()
}

pub fn new_invocation(id: &str, key: Option<&str>) -> NewInvocation {
    NewInvocation {
        invocation_id: id.to_string(),
        channel: Channel::Http,
        target: "payments".to_string(),
        summary: "POST https://api.example.test/v1/payments".to_string(),
        session: Some("session-1".to_string()),
        idempotency_key: key.map(str::to_string),
        parent: None,
    }
}

pub fn snapshot(key: Option<&str>) -> ConfigSnapshot {
    ConfigSnapshot {
        target_id: "payments".to_string(),
        target_version: postern_broker::config::TargetVersion::from_digest([3u8; 32]),
        credential_id: "payments-key".to_string(),
        credential_version: "v1-abcdef01".to_string(),
        injection_mode: "header:authorization".to_string(),
        idempotency_key: key.map(str::to_string),
    }
}

pub fn operation(idempotent: bool, key: Option<&str>) -> OperationFacts {
    OperationFacts {
        idempotent,
        remote_contract: if key.is_some() {
            RemoteContract::Configured
        } else {
            RemoteContract::None
        },
        idempotency: key.map(|k| IdempotencyEvidence {
            key: k.to_string(),
            scope: Some("payments.create".to_string()),
            fingerprint: FP.to_string(),
            remote_contract: RemoteContract::Configured,
            expires_at_ms: Some(T0 + 24 * 3600 * 1000),
        }),
        reconcile_configured: false,
        source_query: None,
        batch: None,
        retry_budget: 3,
        peer: None,
    }
}

/// Accepted, validated, authorized and holding attempt 1's lease.
pub fn ready(journal: &Journal, id: &str, idempotent: bool, key: Option<&str>) -> Recorder {
    let mut rec = Recorder::accept(journal, new_invocation(id, key)).unwrap();
    rec.preflight(FP, snapshot(key), operation(idempotent, key))
        .unwrap();
    rec.credential_authorized("payments-key", "v1-abcdef01")
        .unwrap();
    rec.start_attempt("worker-a", 60_000).unwrap();
    rec
}

/// How a complete 200 response settles.
pub fn settle_ok() -> Settle {
    Settle {
        outcome: Outcome::Committed,
        code: None,
        retry: Retry::Never,
        facts: ResultFacts {
            http_status: Some(200),
            ..Default::default()
        },
        confidence: ConfidenceSource::RemoteResponse,
        redactions: 0,
    }
}

/// Drives a ready invocation through a complete 200 response (`ok`), committed.
pub fn commit_200(rec: &Recorder) {
    rec.dispatch_started(FP, None, None).unwrap();
    rec.request_sent(true, true).unwrap();
    rec.response_started(Some(200), None).unwrap();
    rec.response_complete("blake3:body").unwrap();
    rec.commit_result(
        ResultToStore {
            meta: serde_json::json!({"status": 200}),
            streams: vec![("body".to_string(), b"ok".to_vec())],
        },
        settle_ok(),
    )
    .unwrap();
}
