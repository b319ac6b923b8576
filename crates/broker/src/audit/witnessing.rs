//! Getting the journal's checkpoints cosigned, and checking what witnesses cosigned.
//!
//! Every [`SIGN_INTERVAL_MS`](super::SIGN_INTERVAL_MS) the broker sends its newest
//! durable checkpoint (a C2SP signed note) to each configured witness with a
//! consistency proof from the size that witness last cosigned, checks the returned
//! cosignature against the witness key in the configuration, and keeps the cosigned note
//! in the journal's `cosignatures` table. A witness that refuses (it saw a tree this one
//! does not extend) or that has cosigned more events than the journal holds is an alarm:
//! the journal was rewritten or cut.
//!
//! A witness is what stops an adversary holding the audit key (an agent with the
//! broker's uid can read the keychain): it can re-sign a rewritten journal, but not make
//! a witness it cannot reach cosign it, and `audit verify` holds the journal to every
//! tree head a witness cosigned.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use ed25519_dalek::VerifyingKey;
use rusqlite::Connection;
use serde::Serialize;

use super::{AuditError, Tamper, TreeHead, log_origin};
use crate::config::{ConfigHandle, WitnessConfig};
use crate::journal::Journal;
use crate::transparency::client::{self, WitnessError};
use crate::transparency::note::{self, CheckpointBody};

/// What the console and the daemon show about one witness.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct WitnessStatus {
    pub name: String,
    pub url: String,
    /// The largest tree this witness has cosigned for the journal.
    pub cosigned_size: Option<u64>,
    /// The last exchange failed for a reason that may pass (unreachable, malformed).
    pub last_error: Option<String>,
    /// The witness says the journal's history changed: refused as inconsistent, or it
    /// cosigned more events than the journal now holds.
    pub alarm: Option<String>,
}

/// The broker's side of witnessing.
pub struct Witnessing {
    journal: Journal,
    config: ConfigHandle,
    client: reqwest::Client,
    status: Mutex<HashMap<String, WitnessStatus>>,
}

impl Witnessing {
    pub fn new(journal: Journal, config: ConfigHandle) -> Witnessing {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default();
        Witnessing {
            journal,
            config,
            client,
            status: Mutex::new(HashMap::new()),
        }
    }

    /// Each configured witness's state, in configuration order.
    pub fn status(&self) -> Vec<WitnessStatus> {
        let map = self.status.lock().map(|m| m.clone()).unwrap_or_default();
        self.config
            .current()
            .witnesses
            .iter()
            .map(|w| {
                map.get(&w.name).cloned().unwrap_or(WitnessStatus {
                    name: w.name.clone(),
                    url: w.url.clone(),
                    ..WitnessStatus::default()
                })
            })
            .collect()
    }

    /// The alarms raised so far (one line each).
    pub fn alarms(&self) -> Vec<String> {
        self.status().into_iter().filter_map(|s| s.alarm).collect()
    }

    /// Runs rounds until the task is dropped.
    pub async fn run(self: std::sync::Arc<Self>) {
        let interval = Duration::from_millis(super::SIGN_INTERVAL_MS as u64);
        loop {
            self.round().await;
            tokio::time::sleep(interval).await;
        }
    }

    /// One round: the newest durable checkpoint to every witness that has not
    /// cosigned it yet.
    pub async fn round(&self) {
        let witnesses = self.config.current().witnesses.clone();
        if witnesses.is_empty() {
            return;
        }
        let Some(cp) = self.journal.latest_durable_checkpoint() else {
            return;
        };
        let (Some(note), Some(root)) = (cp.note.clone(), cp.root) else {
            return;
        };
        for w in &witnesses {
            let outcome = self.submit(w, cp.seq, root, &note).await;
            let mut map = match self.status.lock() {
                Ok(m) => m,
                Err(_) => return,
            };
            let s = map.entry(w.name.clone()).or_insert_with(|| WitnessStatus {
                name: w.name.clone(),
                url: w.url.clone(),
                ..WitnessStatus::default()
            });
            match outcome {
                Submitted::Cosigned(size) | Submitted::AlreadyCosigned(size) => {
                    s.cosigned_size = Some(size);
                    s.last_error = None;
                }
                Submitted::Failed(e) => {
                    if s.last_error.as_ref() != Some(&e) {
                        eprintln!("postern: witness {}: {e}", w.name);
                    }
                    s.last_error = Some(e);
                }
                Submitted::Alarm(a) => {
                    if s.alarm.as_ref() != Some(&a) {
                        eprintln!("postern: ALARM: {a}");
                    }
                    s.alarm = Some(a);
                }
            }
        }
    }

    fn known_size(&self, witness: &str) -> u64 {
        if let Some(size) = self
            .status
            .lock()
            .ok()
            .and_then(|m| m.get(witness).and_then(|s| s.cosigned_size))
        {
            return size;
        }
        self.journal
            .cosigned_size(witness)
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    async fn submit(&self, w: &WitnessConfig, size: u64, root: [u8; 32], note: &str) -> Submitted {
        let origin = log_origin(&self.journal.verifying_key());
        let mut old = self.known_size(&w.name);
        if old >= size {
            return Submitted::AlreadyCosigned(old);
        }
        let text = match CheckpointBody::new(&origin, size, root) {
            Ok(body) => body.to_text(),
            Err(e) => return Submitted::Failed(e.to_string()),
        };
        // One resubmission after a conflict names the witness's size.
        for _ in 0..2 {
            let proof = match self.journal.consistency_proof(size, old) {
                Ok(p) => p,
                Err(e) => return Submitted::Failed(format!("consistency proof: {e}")),
            };
            match client::submit(&self.client, &w.url, old, &proof, note.as_bytes()).await {
                Ok(lines) => {
                    let Some(line) = lines.into_iter().find(|l| {
                        note::verify_cosignature(text.as_bytes(), l, &w.name, &w.key.key).is_ok()
                    }) else {
                        return Submitted::Failed(format!(
                            "witness {} answered without a cosignature by its configured key",
                            w.name
                        ));
                    };
                    let cosigned =
                        match note::append_signatures(note.as_bytes(), std::slice::from_ref(&line))
                        {
                            Ok(n) => String::from_utf8_lossy(&n).into_owned(),
                            Err(e) => return Submitted::Failed(e.to_string()),
                        };
                    let line = String::from_utf8_lossy(&line.to_bytes()).into_owned();
                    return match self
                        .journal
                        .record_cosignature(size, &w.name, cosigned, line)
                    {
                        Ok(()) => Submitted::Cosigned(size),
                        Err(e) => Submitted::Failed(format!("storing the cosignature: {e}")),
                    };
                }
                Err(WitnessError::Conflict { witness_size }) if witness_size > size => {
                    return Submitted::Alarm(format!(
                        "witness {} has cosigned {witness_size} events of this journal, but it \
                         holds only {size}: the journal was cut",
                        w.name
                    ));
                }
                Err(WitnessError::Conflict { witness_size }) => old = witness_size,
                Err(WitnessError::Refused { status, body }) if matches!(status, 409 | 422) => {
                    return Submitted::Alarm(format!(
                        "witness {} refused the checkpoint at {size} (HTTP {status}: {body}): \
                         this journal does not extend the history it cosigned before",
                        w.name
                    ));
                }
                Err(e) => return Submitted::Failed(e.to_string()),
            }
        }
        Submitted::Failed(format!(
            "witness {} kept answering with another size",
            w.name
        ))
    }
}

enum Submitted {
    Cosigned(u64),
    AlreadyCosigned(u64),
    Failed(String),
    Alarm(String),
}

/// The tree heads the journal's stored cosignatures vouch for, checked against the
/// configured witness keys (cosignatures by witnesses no longer configured are skipped).
/// A stored cosignature that does not verify is a bad signature at its size.
pub fn cosigned_heads(
    conn: &Connection,
    log_key: &VerifyingKey,
    witnesses: &[WitnessConfig],
) -> Result<Vec<TreeHead>, AuditError> {
    let unreadable = |e: rusqlite::Error| AuditError::Unreadable {
        path: conn.path().unwrap_or("journal").to_string(),
        detail: e.to_string(),
    };
    let has_table: bool = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = 'cosignatures'",
            [],
            |r| r.get::<_, i64>(0).map(|n| n > 0),
        )
        .map_err(unreadable)?;
    if !has_table || witnesses.is_empty() {
        return Ok(Vec::new());
    }
    let origin = log_origin(log_key);
    let mut stmt = conn
        .prepare("SELECT size, witness, note FROM cosignatures ORDER BY size")
        .map_err(unreadable)?;
    let rows: Vec<(i64, String, String)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .map_err(unreadable)?
        .collect::<Result<_, _>>()
        .map_err(unreadable)?;
    let mut heads = Vec::new();
    for (size, name, cosigned) in rows {
        let Some(w) = witnesses.iter().find(|w| w.name == name) else {
            continue;
        };
        let size = u64::try_from(size).unwrap_or(0);
        let opened = note::open_cosigned(
            cosigned.as_bytes(),
            &origin,
            &origin,
            log_key,
            &w.name,
            &w.key.key,
        )
        .map_err(|e| {
            super::broken(
                size,
                Tamper::BadSignature,
                format!("the stored cosignature of witness {name} does not verify: {e}"),
            )
        })?;
        heads.push(TreeHead {
            size: opened.body.size,
            root: opened.body.root,
            source: format!("witness {name} (stored cosignature)"),
            witness: Some(name.to_string()),
        });
    }
    Ok(heads)
}

/// What each witness last cosigned for the journal signed by `log_key`, asked live
/// (`GET /postern/latest`). A witness that cannot be asked is an error: an auditor who
/// asked for the check should not get a pass without it.
pub async fn ask_witnesses(
    log_key: &VerifyingKey,
    witnesses: &[WitnessConfig],
) -> Result<Vec<TreeHead>, String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| e.to_string())?;
    let origin = log_origin(log_key);
    let mut heads = Vec::new();
    for w in witnesses {
        let Some(cosigned) = client::fetch_latest(&client, &w.url, &origin)
            .await
            .map_err(|e| format!("witness {}: {e}", w.name))?
        else {
            // The witness has never cosigned this journal: nothing to hold it to.
            continue;
        };
        let opened = note::open_cosigned(&cosigned, &origin, &origin, log_key, &w.name, &w.key.key)
            .map_err(|e| format!("witness {}: what it serves does not verify: {e}", w.name))?;
        heads.push(TreeHead {
            size: opened.body.size,
            root: opened.body.root,
            source: format!("witness {} (asked now)", w.name),
            witness: Some(w.name.clone()),
        });
    }
    Ok(heads)
}
