//! Unknown outcomes and how they are settled: the target's reconcile query (or the
//! peer's record) and the operator's attestation, each appended, never rewriting the
//! attempt.

use postern_broker::evidence::{self, AttestError};
use postern_broker::journal::events::Channel;
use postern_broker::journal::query::{self, InvocationRow};

use super::Console;
use crate::dto::{Attestation, CommandError, ErrorCode, InvocationDetail};

/// How many unknown outcomes the reconciliation screen lists.
const RECONCILE_LIST: usize = 200;

impl Console {
    /// The unknown outcomes that nothing has settled, among the newest
    /// [`RECONCILE_LIST`] unknown ones.
    pub(super) fn unsettled_rows(&self) -> Result<Vec<InvocationRow>, CommandError> {
        self.read(|conn| query::unsettled(conn, RECONCILE_LIST, self.now()))
    }

    /// Every unknown outcome not yet settled, newest first.
    pub fn needs_reconciliation(&self) -> Result<Vec<InvocationDetail>, CommandError> {
        self.unsettled_rows()?
            .into_iter()
            .map(|row| self.detail_of(row))
            .collect()
    }

    /// Runs the target's configured reconcile query; what it proves is recorded on the
    /// original as `remote_query` evidence.
    pub async fn run_reconcile_query(
        &self,
        invocation_id: &str,
    ) -> Result<InvocationDetail, CommandError> {
        let before = self.detail(invocation_id)?;
        if !before.unsettled {
            return Err(CommandError::new(
                ErrorCode::NotUnknown,
                "This invocation's outcome is not an unsettled unknown; there is nothing to \
                 reconcile.",
            ));
        }
        if !before.can_query {
            return Err(CommandError::new(
                ErrorCode::NoReconcileQuery,
                "This target has no [http.reconcile] query configured; check the remote \
                 system and attest what you find.",
            ));
        }
        let through_peer = self
            .engine
            .journal()
            .projection(invocation_id)
            .is_ok_and(|p| p.channel == Some(Channel::Peer));
        let outcome = if through_peer {
            self.engine
                .peer()
                .reconcile(invocation_id, &self.operator)
                .await
                .0
        } else {
            self.engine
                .http()
                .reconcile(invocation_id, &self.operator)
                .await
        };
        let after = self.detail(invocation_id)?;
        if after.unsettled {
            let why = outcome
                .error
                .map(|e| e.error.message)
                .unwrap_or_else(|| "the query's answer did not settle the outcome".into());
            return Err(CommandError::new(ErrorCode::ReconcileInconclusive, why));
        }
        Ok(after)
    }

    /// Records an operator's attestation. The original attempt is never rewritten: a
    /// RECONCILED event (`operator_attested`, who, note) is appended.
    pub fn attest(&self, attestation: &Attestation) -> Result<InvocationDetail, CommandError> {
        evidence::attest(
            self.engine.journal(),
            &evidence::Attestation {
                invocation_id: &attestation.invocation_id,
                settlement: &attestation.settlement,
                note: &attestation.note,
                by: &self.operator,
            },
        )
        .map_err(|e| {
            let code = match &e {
                AttestError::UnknownSettlement
                | AttestError::EmptyNote
                | AttestError::NoteTooLong => ErrorCode::InvalidInput,
                AttestError::UnknownInvocation(_) => ErrorCode::UnknownInvocation,
                AttestError::NotUnsettled => ErrorCode::NotUnknown,
                AttestError::Unreadable(_) => ErrorCode::JournalUnreadable,
                AttestError::Refused(_) => ErrorCode::JournalRefused,
            };
            match e.field() {
                Some(field) => CommandError::field(code, field, e.to_string()),
                None => CommandError::new(code, e.to_string()),
            }
        })?;
        self.detail(&attestation.invocation_id)
    }
}
