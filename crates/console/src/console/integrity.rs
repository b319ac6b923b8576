//! The integrity banner: full and incremental verification of the audit chain (with
//! the anchor outside the data dir and the witnesses' cosigned heads), and the state the
//! banner shows.

use std::path::Path;

use rusqlite::{Connection, OpenFlags};

use postern_broker::audit;

use super::Console;
use crate::dto::IntegrityState;

impl Console {
    pub fn integrity(&self) -> IntegrityState {
        self.integrity
            .lock()
            .map(|s| s.clone())
            .unwrap_or_else(|_| IntegrityState {
                state: "failed".into(),
                failure: Some("the integrity state was poisoned".into()),
                ..IntegrityState::checking()
            })
    }

    /// Verifies the whole journal file (chain, tree, checkpoints, signing policy, and
    /// the anchor outside the data dir) against this broker's key and stores the result
    /// for the banner. Blocking: run it off the UI thread.
    pub fn verify_now(&self) -> IntegrityState {
        let db = self.engine.journal().path().to_path_buf();
        let key = self.engine.journal().verifying_key();
        let witnesses = self.engine.config().current().witnesses.clone();
        let heads = match self
            .open_verifier(&db)
            .map(|conn| audit::witnessing::cosigned_heads(&conn, &key, &witnesses))
        {
            Some(Err(e)) => return self.store_integrity(Err(e), "full", 0),
            Some(Ok(heads)) => heads,
            None => Vec::new(),
        };
        let witnesses = audit::assurance::witnesses_in(&heads);
        let outside = audit::Outside {
            anchor: audit::default_anchor(&self.paths.data_dir),
            heads,
        };
        let result = audit::verify_file_prefix(&db, &key, &outside);
        // The prefix the incremental checks go on from.
        if let Ok(mut p) = self.verified_prefix.lock() {
            *p = result.as_ref().ok().map(|(_, prefix)| prefix.clone());
        }
        self.store_integrity(result.map(|(r, _)| r), "full", witnesses)
    }

    /// Verifies only what the journal gained since the last check (a full one when
    /// there is none to go on from). Cheap enough to run after every change.
    pub fn verify_incremental(&self) -> IntegrityState {
        let db = self.engine.journal().path().to_path_buf();
        let key = self.engine.journal().verifying_key();
        let from = self.verified_prefix.lock().ok().and_then(|p| p.clone());
        let Some(from) = from else {
            return self.verify_now();
        };
        let Some(conn) = self.open_verifier(&db) else {
            return self.verify_now();
        };
        let result = audit::verify_since(&conn, &key, Some(&from));
        if let Ok(mut p) = self.verified_prefix.lock() {
            *p = result.as_ref().ok().map(|(_, prefix)| prefix.clone());
        }
        // What the witnesses hold was checked by the last full check.
        let witnesses = usize::try_from(self.integrity().witnesses).unwrap_or(0);
        self.store_integrity(result.map(|(r, _)| r), "incremental", witnesses)
    }

    fn open_verifier(&self, db: &Path) -> Option<Connection> {
        Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY).ok()
    }

    fn store_integrity(
        &self,
        result: Result<audit::VerifyReport, audit::AuditError>,
        scope: &str,
        witnesses: usize,
    ) -> IntegrityState {
        let signer = if self.paths.keychain == "file" {
            audit::Signer::BrokerFile
        } else {
            audit::Signer::UserKeychain
        };
        let assurance = audit::Assurance::of(signer, witnesses).statement;
        let witnesses = u32::try_from(witnesses).unwrap_or(u32::MAX);
        let checked_at_ms = Some(self.now());
        // A witness that refused the journal's history outranks a local pass.
        let result = match (result, self.engine.witnessing().alarms().first()) {
            (Ok(_), Some(alarm)) => Err(audit::AuditError::Refuted {
                detail: alarm.clone(),
            }),
            (result, _) => result,
        };
        let state = match result {
            Ok(report) => IntegrityState {
                // Nothing signed is never "verified".
                state: if report.events == 0 {
                    "empty".into()
                } else {
                    "verified".into()
                },
                through_seq: Some(report.verified_through),
                checked_at_ms,
                events: report.events,
                checkpoints: report.checkpoints,
                failure: None,
                first_bad_seq: None,
                unsigned_events: 0,
                notes: report
                    .signed_late
                    .iter()
                    .map(|l| {
                        format!(
                            "events {}..={} were signed only when the broker next started \
                             (sequence {}): the run that wrote them ended without signing them",
                            l.first, l.last, l.at
                        )
                    })
                    .collect(),
                scope: scope.into(),
                witnesses,
                assurance: Some(assurance),
            },
            Err(e) => match e.unsigned_events() {
                Some(n) => IntegrityState {
                    state: "unsigned".into(),
                    through_seq: e.first_bad_seq().map(|s| s.saturating_sub(1)),
                    checked_at_ms,
                    unsigned_events: n,
                    failure: Some(e.to_string()),
                    first_bad_seq: e.first_bad_seq(),
                    scope: scope.into(),
                    ..IntegrityState::checking()
                },
                None => IntegrityState {
                    state: "failed".into(),
                    through_seq: e.first_bad_seq().map(|s| s.saturating_sub(1)),
                    checked_at_ms,
                    first_bad_seq: e.first_bad_seq(),
                    failure: Some(e.to_string()),
                    scope: scope.into(),
                    ..IntegrityState::checking()
                },
            },
        };
        if let Ok(mut s) = self.integrity.lock() {
            *s = state.clone();
        }
        state
    }
}
