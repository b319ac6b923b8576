//! Batch requests (seed 000: "Batch requests need an outcome per member"; seed 003's
//! `partial_application_signature`). A target may declare, in `[http.batch]`, which
//! requests are batches, where their members are listed, where the response reports
//! each member, which per-member values mean applied or not, and what signals a partial
//! application. The members are bound at preflight (so an unknown batch still knows them),
//! a complete response settles each member it reports, and an unknown batch is
//! reconciled member by member through `[http.batch.query]`, or as a whole when the
//! remote applies batches atomically.
//!
//! Values are compared as text (a JSON number 201 matches "201").

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::job::{is_pointer, scalar_text};
use crate::contract::Outcome;
use crate::retry::{MEMBER_ID_PLACEHOLDER, SourceQueryPredicate};

/// The most members one batch may list: each is a row of evidence.
pub const MAX_MEMBERS: usize = 1000;

/// A target's `[http.batch]` table, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchContract {
    /// The request path (under the target) whose requests are batches.
    pub path: String,
    /// JSON pointer to the member array in the request body.
    pub members: String,
    /// JSON pointer, inside a member, to its id; members are numbered from 0 without it.
    pub member_id: Option<String>,
    /// JSON pointer to the per-member result array in the response body.
    pub results: String,
    /// JSON pointer, inside a result, to the member id it reports; results are matched
    /// to members by position without it.
    pub result_id: Option<String>,
    /// JSON pointer, inside a result, to its status.
    pub status: String,
    pub applied: Vec<String>,
    pub not_applied: Vec<String>,
    /// A response header whose presence (with any value but `false`/`0`) says the batch
    /// was applied only in part.
    pub partial_header: Option<String>,
    /// A JSON pointer in the response body whose value `true` says the same.
    pub partial_pointer: Option<String>,
    /// The remote applies a batch entirely or not at all.
    pub atomic: bool,
    /// How to ask about one member: its path holds `{member_id}` once
    /// ([`SourceQueryPredicate::for_member`]).
    pub query: Option<SourceQueryPredicate>,
}

/// The `[http.batch]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBatch {
    path: String,
    members: String,
    member_id: Option<String>,
    results: String,
    result_id: Option<String>,
    status: String,
    applied: Vec<String>,
    #[serde(default)]
    not_applied: Vec<String>,
    partial_header: Option<String>,
    partial_pointer: Option<String>,
    #[serde(default)]
    atomic: bool,
    query: Option<RawMemberQuery>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMemberQuery {
    method: String,
    path: String,
    committed_status: Vec<u16>,
    #[serde(default)]
    not_applied_status: Vec<u16>,
}

/// Why a `[http.batch]` table is refused: the field and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchProblem {
    Pointer { field: &'static str },
    Path { field: &'static str },
    Empty { field: &'static str },
    Conflicting { value: String },
    Method { value: String },
    Status { status: u16 },
    HeaderName,
}

impl BatchContract {
    /// Checks a raw table.
    pub fn check(raw: RawBatch) -> Result<BatchContract, BatchProblem> {
        for (field, pointer) in [
            ("batch.members", Some(&raw.members)),
            ("batch.member_id", raw.member_id.as_ref()),
            ("batch.results", Some(&raw.results)),
            ("batch.result_id", raw.result_id.as_ref()),
            ("batch.status", Some(&raw.status)),
            ("batch.partial_pointer", raw.partial_pointer.as_ref()),
        ] {
            if let Some(p) = pointer
                && !is_pointer(p)
            {
                return Err(BatchProblem::Pointer { field });
            }
        }
        let plain_path =
            |p: &str| p.starts_with('/') && !p.chars().any(|c| c.is_whitespace() || c.is_control());
        if !plain_path(&raw.path) || raw.path.contains(['{', '}', '?', '#']) {
            return Err(BatchProblem::Path {
                field: "batch.path",
            });
        }
        if raw.applied.is_empty() {
            return Err(BatchProblem::Empty {
                field: "batch.applied",
            });
        }
        if let Some(v) = raw.applied.iter().find(|v| raw.not_applied.contains(v)) {
            return Err(BatchProblem::Conflicting { value: v.clone() });
        }
        if let Some(h) = &raw.partial_header
            && (h.is_empty()
                || !h
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b)))
        {
            return Err(BatchProblem::HeaderName);
        }
        let query = match raw.query {
            None => None,
            Some(q) => {
                if q.method.is_empty() || !q.method.bytes().all(|b| b.is_ascii_uppercase()) {
                    return Err(BatchProblem::Method { value: q.method });
                }
                if !plain_path(&q.path)
                    || q.path.matches(MEMBER_ID_PLACEHOLDER).count() != 1
                    || q.path
                        .replace(MEMBER_ID_PLACEHOLDER, "")
                        .contains(['{', '}', '#'])
                {
                    return Err(BatchProblem::Path {
                        field: "batch.query.path",
                    });
                }
                if q.committed_status.is_empty() {
                    return Err(BatchProblem::Empty {
                        field: "batch.query.committed_status",
                    });
                }
                let statuses = |mut v: Vec<u16>| -> Result<Vec<u16>, BatchProblem> {
                    if let Some(&status) = v.iter().find(|s| !(100..=599).contains(*s)) {
                        return Err(BatchProblem::Status { status });
                    }
                    v.sort_unstable();
                    v.dedup();
                    Ok(v)
                };
                let committed = statuses(q.committed_status)?;
                let not_applied = statuses(q.not_applied_status)?;
                if let Some(s) = committed.iter().find(|s| not_applied.contains(s)) {
                    return Err(BatchProblem::Conflicting {
                        value: s.to_string(),
                    });
                }
                Some(SourceQueryPredicate {
                    method: q.method,
                    path: q.path,
                    committed_status: committed,
                    not_applied_status: not_applied,
                })
            }
        };
        let sorted = |mut v: Vec<String>| {
            v.sort();
            v.dedup();
            v
        };
        Ok(BatchContract {
            path: raw.path,
            members: raw.members,
            member_id: raw.member_id,
            results: raw.results,
            result_id: raw.result_id,
            status: raw.status,
            applied: sorted(raw.applied),
            not_applied: sorted(raw.not_applied),
            partial_header: raw.partial_header.map(|h| h.to_ascii_lowercase()),
            partial_pointer: raw.partial_pointer,
            atomic: raw.atomic,
            query,
        })
    }

    /// The member ids of a batch request body, in order, or why they cannot be read
    /// (the request is then refused before anything is sent).
    pub fn member_ids(&self, body: &[u8]) -> Result<Vec<String>, String> {
        let doc: Value =
            serde_json::from_slice(body).map_err(|e| format!("a batch body must be JSON: {e}"))?;
        let Some(Value::Array(members)) = doc.pointer(&self.members) else {
            return Err(format!(
                "a batch body lists its members as an array at `{}`",
                self.members
            ));
        };
        if members.is_empty() || members.len() > MAX_MEMBERS {
            return Err(format!(
                "a batch lists 1 to {MAX_MEMBERS} members; this one lists {}",
                members.len()
            ));
        }
        let mut ids: Vec<String> = Vec::with_capacity(members.len());
        for (i, member) in members.iter().enumerate() {
            let id = match &self.member_id {
                None => i.to_string(),
                Some(p) => member
                    .pointer(p)
                    .and_then(scalar_text)
                    .ok_or_else(|| format!("member {i} has no id at `{p}`"))?,
            };
            if ids.contains(&id) {
                return Err(format!("member id `{id}` appears twice in one batch"));
            }
            ids.push(id);
        }
        Ok(ids)
    }

    /// What a complete response says about each member: the members' outcomes (in
    /// request order) and whether the response carried the partial signature.
    pub fn assess(
        &self,
        members: &[String],
        headers: &[(String, String)],
        body: &[u8],
    ) -> (Vec<MemberOutcome>, bool) {
        let doc: Option<Value> = serde_json::from_slice(body).ok();
        let header_partial = self.partial_header.as_ref().is_some_and(|name| {
            headers
                .iter()
                .any(|(k, v)| k.eq_ignore_ascii_case(name) && !matches!(v.trim(), "false" | "0"))
        });
        let body_partial = self.partial_pointer.as_ref().is_some_and(|p| {
            doc.as_ref()
                .and_then(|d| d.pointer(p))
                .is_some_and(|v| v == &Value::Bool(true))
        });
        let partial = header_partial || body_partial;
        let results: &[Value] = match doc.as_ref().and_then(|d| d.pointer(&self.results)) {
            Some(Value::Array(items)) => items,
            _ => &[],
        };
        let outcomes = members
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let result = match &self.result_id {
                    Some(p) => results
                        .iter()
                        .find(|r| r.pointer(p).and_then(scalar_text).as_deref() == Some(id)),
                    None => results.get(i),
                };
                let status = result
                    .and_then(|r| r.pointer(&self.status))
                    .and_then(scalar_text);
                let outcome = match &status {
                    Some(s) if self.applied.contains(s) => Outcome::Committed,
                    Some(s) if self.not_applied.contains(s) => Outcome::Rejected,
                    _ => Outcome::Unknown,
                };
                MemberOutcome {
                    id: id.clone(),
                    outcome,
                    status,
                }
            })
            .collect();
        (outcomes, partial)
    }
}

/// One member's outcome, as a complete response or a reconciliation settled it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberOutcome {
    pub id: String,
    /// `committed` (applied), `rejected` (not applied) or `unknown` (the response did
    /// not say, or there was no complete response).
    pub outcome: Outcome,
    /// The per-member status the response reported, as text.
    pub status: Option<String>,
}

/// What a response's members add up to: the outcome of the whole, and whether it is
/// partial (some members applied, some not or not known).
pub fn overall(members: &[MemberOutcome]) -> (Outcome, bool) {
    let applied = members
        .iter()
        .filter(|m| m.outcome == Outcome::Committed)
        .count();
    let refused = members
        .iter()
        .filter(|m| m.outcome == Outcome::Rejected)
        .count();
    if applied == members.len() {
        (Outcome::Committed, false)
    } else if refused == members.len() {
        (Outcome::Rejected, false)
    } else if applied > 0 {
        (Outcome::Committed, true)
    } else {
        // Nothing known applied, something not known: the response settles the exchange,
        // and the unknown members are reconciled one by one.
        (Outcome::Committed, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contract() -> BatchContract {
        BatchContract::check(RawBatch {
            path: "/v1/batch".into(),
            members: "/items".into(),
            member_id: Some("/id".into()),
            results: "/results".into(),
            result_id: Some("/id".into()),
            status: "/status".into(),
            applied: vec!["201".into(), "ok".into()],
            not_applied: vec!["409".into()],
            partial_header: Some("X-Partial".into()),
            partial_pointer: Some("/partial".into()),
            atomic: false,
            query: Some(RawMemberQuery {
                method: "GET".into(),
                path: "/v1/items/{member_id}".into(),
                committed_status: vec![200],
                not_applied_status: vec![404],
            }),
        })
        .unwrap()
    }

    #[test]
    fn members_are_read_by_id_and_bad_bodies_are_refused() {
        let c = contract();
        let ids = c
            .member_ids(br#"{"items":[{"id":"a"},{"id":7},{"id":"c"}]}"#)
            .unwrap();
        assert_eq!(ids, ["a", "7", "c"]);
        for bad in [
            &b"not json"[..],
            br#"{"items":{}}"#,
            br#"{"items":[]}"#,
            br#"{"items":[{"x":1}]}"#,
            br#"{"items":[{"id":"a"},{"id":"a"}]}"#,
        ] {
            assert!(
                c.member_ids(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_response_settles_the_members_it_reports_and_the_signature_marks_it_partial() {
        let c = contract();
        let members: Vec<String> = ["a", "b", "c", "d"].map(String::from).to_vec();
        let body = br#"{"partial":true,"results":[
            {"id":"b","status":409},{"id":"a","status":201},{"id":"c","status":"weird"}]}"#;
        let (outcomes, partial) = c.assess(&members, &[], body);
        assert!(partial);
        let by: Vec<(&str, Outcome)> = outcomes
            .iter()
            .map(|m| (m.id.as_str(), m.outcome))
            .collect();
        assert_eq!(
            by,
            [
                ("a", Outcome::Committed),
                ("b", Outcome::Rejected),
                ("c", Outcome::Unknown),
                ("d", Outcome::Unknown)
            ]
        );
        assert_eq!(overall(&outcomes), (Outcome::Committed, true));
        let header = vec![("x-partial".to_string(), "1".to_string())];
        assert!(c.assess(&members, &header, b"{}").1);
        let off = vec![("x-partial".to_string(), "false".to_string())];
        assert!(!c.assess(&members, &off, b"{}").1);
    }

    #[test]
    fn all_applied_is_committed_and_all_refused_is_rejected() {
        let m = |o| MemberOutcome {
            id: "x".into(),
            outcome: o,
            status: None,
        };
        assert_eq!(
            overall(&[m(Outcome::Committed)]),
            (Outcome::Committed, false)
        );
        assert_eq!(overall(&[m(Outcome::Rejected)]), (Outcome::Rejected, false));
        assert_eq!(
            overall(&[m(Outcome::Rejected), m(Outcome::Unknown)]),
            (Outcome::Committed, true)
        );
    }

    #[test]
    fn a_member_query_fills_in_the_encoded_id() {
        let q = contract().query.unwrap().for_member("a b/c");
        assert_eq!(q.method, "GET");
        assert_eq!(q.path, "/v1/items/a%20b%2Fc");
    }
}
