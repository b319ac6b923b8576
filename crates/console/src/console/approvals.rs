//! Approval cards and the operator's answer to one: the pending requests joined with the
//! live session registry, and Approve or Deny of exactly the card shown.

use postern_broker::approvals::{AnswerError, Pending};
use postern_mcp::server::SessionRecord;

use super::Console;
use super::sessions::agent_card;
use crate::dto::{ApprovalCard, CommandError, Decision, ErrorCode};

impl Console {
    pub fn approval_cards(&self) -> Vec<ApprovalCard> {
        let sessions = self.sessions.list();
        self.approvals
            .pending()
            .into_iter()
            .map(|p| card(p, &sessions))
            .collect()
    }

    /// Answers one card. Approve grants exactly `fingerprint`: if the request changed
    /// since the card was drawn, the broker refuses it with FINGERPRINT_MISMATCH and
    /// nothing is sent. Deny always stops the request. Both name the digest of the card
    /// answered (`card_digest`), which the journal records; an approval of a card other
    /// than the pending one is refused (CARD_CHANGED) and the request keeps waiting.
    pub fn answer(
        &self,
        invocation_id: &str,
        fingerprint: &str,
        card_digest: &str,
        decision: Decision,
    ) -> Result<(), CommandError> {
        self.answer_as(
            invocation_id,
            fingerprint,
            card_digest,
            decision,
            &self.operator,
        )
    }

    /// [`Console::answer`], recorded as answered by `operator` (the operator socket
    /// names the peer user).
    pub fn answer_as(
        &self,
        invocation_id: &str,
        fingerprint: &str,
        card_digest: &str,
        decision: Decision,
        operator: &str,
    ) -> Result<(), CommandError> {
        let not_pending = |e: AnswerError| match e {
            AnswerError::CardChanged { .. } => CommandError::field(
                ErrorCode::CardChanged,
                "card_digest",
                format!("{e}; the card changed since it was drawn, read it again"),
            ),
            AnswerError::NotPending(_) => CommandError::new(
                ErrorCode::NotPending,
                format!(
                    "{invocation_id} is no longer waiting for an answer (answered, timed out \
                     or cancelled by the agent)"
                ),
            ),
        };
        if card_digest.trim().is_empty() {
            return Err(CommandError::field(
                ErrorCode::InvalidInput,
                "card_digest",
                "An answer must name the card it answers.",
            ));
        }
        match decision {
            Decision::Approve => {
                if fingerprint.trim().is_empty() {
                    return Err(CommandError::field(
                        ErrorCode::InvalidInput,
                        "fingerprint",
                        "An approval must name the fingerprint it approves.",
                    ));
                }
                self.approvals
                    .approve_card(invocation_id, fingerprint, card_digest, operator)
                    .map_err(not_pending)
            }
            Decision::Deny => self
                .approvals
                .deny_card(invocation_id, card_digest, operator)
                .map_err(not_pending),
        }
    }
}

fn card(p: Pending, sessions: &[SessionRecord]) -> ApprovalCard {
    let live = p
        .request
        .session
        .as_deref()
        .and_then(|s| sessions.iter().find(|rec| rec.identity.session == s))
        .map(agent_card);
    ApprovalCard::shown(&p.request.card(), p.requested_at_ms, p.expires_at_ms, live)
}
