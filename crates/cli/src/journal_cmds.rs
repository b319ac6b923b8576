//! The read-only journal commands: `log`, `stats` and `audit verify`. None of them
//! creates, migrates or writes the database.

use std::path::Path;

use ed25519_dalek::SigningKey;
use postern_broker::audit::{self, AUDIT_KEY_ID, AuditError};
use postern_broker::contract::{Code, Outcome, Phase};
use postern_broker::journal::query::{self, Filter, InvocationRow};
use postern_broker::vault::{CredentialId, VaultError, meta};
use serde_json::{Value, json};

use crate::common::{self, Failure, KeychainSpec, print_listing, print_table, printable};
use crate::timefmt;

/// `--phase`: a wire name of [`Phase`].
pub fn parse_phase(s: &str) -> Result<Phase, String> {
    one_of("phase", s, Phase::ALL, Phase::as_str)
}

/// `--outcome`: a wire name of [`Outcome`].
pub fn parse_outcome(s: &str) -> Result<Outcome, String> {
    one_of("outcome", s, Outcome::ALL, Outcome::as_str)
}

/// `--code`: a SCREAMING_SNAKE [`Code`].
pub fn parse_code(s: &str) -> Result<Code, String> {
    one_of("code", s, Code::ALL, Code::as_str)
}

/// The value of `all` whose wire name is `value`, in any case; else the error that lists
/// the allowed names.
fn one_of<T: Copy>(
    what: &str,
    value: &str,
    all: &[T],
    name: fn(T) -> &'static str,
) -> Result<T, String> {
    all.iter()
        .copied()
        .find(|v| name(*v).eq_ignore_ascii_case(value))
        .ok_or_else(|| {
            let names: Vec<&str> = all.iter().map(|v| name(*v)).collect();
            format!(
                "unknown {what} `{value}`; allowed values: {}",
                names.join(", ")
            )
        })
}

/// The filters of `postern log`, as given on the command line.
pub struct LogArgs {
    pub session: Option<String>,
    pub target: Option<String>,
    pub phase: Option<Phase>,
    pub outcome: Option<Outcome>,
    pub code: Option<Code>,
    pub since: Option<String>,
    pub limit: Option<usize>,
    pub json: bool,
}

fn row_json(row: &InvocationRow) -> Value {
    let mut value = serde_json::to_value(row).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut value {
        map.insert(
            "accepted_at".into(),
            Value::String(timefmt::format_ms(row.accepted_at_ms)),
        );
    }
    value
}

pub fn log(data_dir: &Path, args: LogArgs) -> common::Outcome {
    let now = common::now_ms();
    let since_ms = args
        .since
        .as_deref()
        .map(|s| timefmt::parse_since(s, now))
        .transpose()
        .map_err(|e| Failure::unavailable(format!("--since: {e}")).with_json(args.json, "usage"))?;
    let (db, conn) = common::open_journal_read_only(data_dir)
        .map_err(|f| f.with_json(args.json, "no_journal"))?;
    let filter = Filter {
        session: args.session,
        target: args.target,
        phase: args.phase,
        outcome: args.outcome,
        code: args.code,
        since_ms,
        limit: args.limit,
        ..Filter::default()
    };
    let rows = query::list(&conn, &filter, now).map_err(|e| {
        Failure::unavailable(format!("{}: {e}", db.display())).with_json(args.json, "unreadable")
    })?;
    print_listing(
        &rows,
        args.json,
        row_json,
        "no invocations match",
        &[
            "ID", "ACCEPTED", "SESSION", "TARGET", "PHASE", "OUTCOME", "RETRY", "CODE", "SUMMARY",
        ],
        |r| {
            vec![
                printable(&r.id),
                timefmt::format_secs(r.accepted_at_ms),
                r.session.as_deref().map_or_else(|| "-".into(), printable),
                printable(&r.target),
                r.phase.to_string(),
                r.outcome.to_string(),
                r.retry.to_string(),
                r.code.map_or_else(|| "-".into(), |c| c.to_string()),
                printable(&r.summary),
            ]
        },
    );
    Ok(())
}

pub fn stats(data_dir: &Path, json: bool) -> common::Outcome {
    let (db, conn) =
        common::open_journal_read_only(data_dir).map_err(|f| f.with_json(json, "no_journal"))?;
    let stats = query::stats(&conn, common::now_ms()).map_err(|e| {
        Failure::unavailable(format!("{}: {e}", db.display())).with_json(json, "unreadable")
    })?;
    if json {
        println!("{}", serde_json::to_value(&stats).unwrap_or(Value::Null));
        return Ok(());
    }
    println!("invocations: {}", stats.invocations);
    // Phase and outcome are separate axes; each table sums to the total.
    let counts = |title: &str, names: &[&str], map: &std::collections::BTreeMap<String, u64>| {
        let rows: Vec<Vec<String>> = names
            .iter()
            .map(|name| {
                vec![
                    name.to_string(),
                    map.get(*name).copied().unwrap_or(0).to_string(),
                ]
            })
            .collect();
        println!();
        print_table(&[title, "COUNT"], &rows);
    };
    let phases: Vec<&str> = Phase::ALL.iter().map(|p| p.as_str()).collect();
    counts("PHASE", &phases, &stats.by_phase);
    let outcomes: Vec<&str> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
    counts("OUTCOME", &outcomes, &stats.by_outcome);
    println!();
    if stats.by_code.is_empty() {
        println!("no codes recorded");
    } else {
        let mut codes: Vec<(&String, &u64)> = stats.by_code.iter().collect();
        codes.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
        let codes: Vec<Vec<String>> = codes
            .into_iter()
            .map(|(c, n)| vec![c.clone(), n.to_string()])
            .collect();
        print_table(&["CODE", "COUNT"], &codes);
    }
    Ok(())
}

/// Prints the journal's checkpoint origin and the audit key as a signed-note verifier
/// key, what a witness needs (`postern witness add-log --origin … --key …`). Public
/// values only; nothing is created or written.
pub fn audit_key_print(
    data_dir: &Path,
    keychain: &KeychainSpec<'_>,
    json: bool,
) -> common::Outcome {
    use postern_broker::transparency::note::{KeyAlg, VerifierKey};
    let (_, _, key) = journal_and_audit_key(data_dir, keychain, json)?;
    let key = key.verifying_key();
    let origin = audit::log_origin(&key);
    let vkey = VerifierKey::new(&origin, KeyAlg::Ed25519, key)
        .map_err(|e| Failure::unavailable(e.to_string()))?
        .encode();
    if json {
        println!("{}", json!({ "origin": origin, "key": vkey }));
    } else {
        println!("origin: {origin}");
        println!("key: {vkey}");
    }
    Ok(())
}

/// `postern audit verify-manifest`: a retry manifest checked against the broker's
/// public key alone (its digest recomputed from the facts it carries, then the
/// signature), as a party that holds no journal would check it.
pub fn verify_manifest(key: &str, file: &Path, json: bool) -> common::Outcome {
    use postern_broker::retry::{RetryManifest, verify_manifest};
    use postern_broker::transparency::note::VerifierKey;
    let key = VerifierKey::parse(key)
        .map_err(|e| Failure::unavailable(format!("--key: {e}")).with_json(json, "bad_key"))?;
    let text = if file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
            .map(|_| s)
            .map_err(|e| e.to_string())
    } else {
        std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))
    }
    .map_err(|e| Failure::unavailable(e).with_json(json, "unreadable"))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        Failure::unavailable(format!("not JSON: {e}")).with_json(json, "unreadable")
    })?;
    let value = match value.get("manifest") {
        Some(inner) => inner.clone(),
        None => value,
    };
    let manifest: RetryManifest = serde_json::from_value(value).map_err(|e| {
        Failure::unavailable(format!("not a retry manifest: {e}")).with_json(json, "unreadable")
    })?;
    match verify_manifest(&manifest, Some(&key.key)) {
        Ok(()) => {
            if json {
                println!(
                    "{}",
                    json!({
                        "valid": true,
                        "invocation_id": manifest.invocation_id,
                        "decision": manifest.decision,
                        "verdict": manifest.verdict,
                        "digest": manifest.digest,
                    })
                );
            } else {
                println!(
                    "valid: {} {} ({}), signed by {}",
                    manifest.invocation_id,
                    manifest.decision.as_str(),
                    manifest.verdict.as_str(),
                    key.name
                );
            }
            Ok(())
        }
        Err(e) => Err(Failure::failed(format!("invalid manifest: {e}")).with_json(json, "invalid")),
    }
}

/// Where `audit verify` gets the key the journal's checkpoints are checked against.
pub enum Verifier<'a> {
    /// The audit signing key in the keychain (its public half is what is used).
    Keychain(KeychainSpec<'a>),
    /// A verifier key as `postern audit key` prints it: no keychain at all.
    Public(&'a str),
}

/// The Ed25519 key of a verifier key `name+id+base64`, whose name must be the log origin
/// that key gives (so a key for another journal is refused by name, not only by a
/// failed signature).
fn public_verifier(text: &str) -> Result<ed25519_dalek::VerifyingKey, Failure> {
    use postern_broker::transparency::note::VerifierKey;
    let vkey = VerifierKey::parse(text).map_err(|e| Failure::unavailable(format!("--key: {e}")))?;
    let origin = audit::log_origin(&vkey.key);
    if vkey.name != origin {
        return Err(Failure::unavailable(format!(
            "--key names {:?}, but the journal that key signs is {origin:?}",
            vkey.name
        )));
    }
    Ok(vkey.key)
}

/// The journal, opened read-only, and its audit key (see [`audit_key`]).
fn journal_and_audit_key(
    data_dir: &Path,
    keychain: &KeychainSpec<'_>,
    json: bool,
) -> Result<(std::path::PathBuf, rusqlite::Connection, SigningKey), Failure> {
    let (db, conn) =
        common::open_journal_read_only(data_dir).map_err(|f| f.with_json(json, "unreadable"))?;
    let key = audit_key(&conn, &db, keychain).map_err(|f| f.with_json(json, "no_key"))?;
    Ok((db, conn, key))
}

/// Reads the audit signing key without creating one and without writing anything:
/// the metadata is read on the read-only connection, the seed straight from the
/// keychain entry it names.
fn audit_key(
    conn: &rusqlite::Connection,
    db: &Path,
    keychain: &KeychainSpec<'_>,
) -> Result<SigningKey, Failure> {
    let id = CredentialId::new(AUDIT_KEY_ID)
        .map_err(|e| Failure::unavailable(format!("audit key id: {e}")))?;
    let recorded = meta::get(conn, &id).map_err(|e| {
        Failure::unavailable(format!(
            "{}: cannot read credential metadata: {e}",
            db.display()
        ))
    })?;
    let Some(recorded) = recorded else {
        return Err(Failure::unavailable(format!(
            "no audit signing key is recorded in {} (credential `{AUDIT_KEY_ID}`); \
             nothing was created. Was this journal written by a broker with a keychain?",
            db.display()
        )));
    };
    let data_dir = db.parent().unwrap_or(Path::new("."));
    let secret = common::keychain(keychain, data_dir)?
        .get(&id, &recorded.version)
        .map_err(|e| match e {
            VaultError::Missing { .. } => Failure::unavailable(format!(
                "the audit signing key `{AUDIT_KEY_ID}` version {} is not in the {} \
                 keychain under service `{}` (is --keychain/--keychain-service right?); \
                 nothing was created",
                recorded.version, keychain.backend, keychain.service
            )),
            other => Failure::unavailable(format!("audit signing key: {other}")),
        })?;
    audit::signing_key_from_secret(&secret).map_err(|e| Failure::unavailable(e.to_string()))
}

/// What `audit verify` holds the journal to besides its own file.
pub struct VerifyAgainst<'a> {
    /// The anchor file [default: `audit::default_anchor`].
    pub anchor: Option<&'a Path>,
    /// The targets file whose `[[witness]]` keys check the stored cosignatures.
    pub config: Option<&'a Path>,
    /// Also ask every configured witness what it last cosigned.
    pub ask_witnesses: bool,
}

pub fn audit_verify(
    data_dir: &Path,
    verifier: Verifier<'_>,
    against: &VerifyAgainst<'_>,
    json: bool,
) -> common::Outcome {
    let signer = match &verifier {
        Verifier::Keychain(spec) => audit::Assurance::signer_of(spec.backend),
        Verifier::Public(_) => audit::Signer::Given,
    };
    let (db, conn, log_key) = match verifier {
        Verifier::Keychain(keychain) => {
            let (db, conn, key) = journal_and_audit_key(data_dir, &keychain, json)?;
            (db, conn, key.verifying_key())
        }
        Verifier::Public(text) => {
            let key = public_verifier(text).map_err(|f| f.with_json(json, "bad_key"))?;
            let (db, conn) = common::open_journal_read_only(data_dir)
                .map_err(|f| f.with_json(json, "unreadable"))?;
            (db, conn, key)
        }
    };
    let witnesses = match against.config {
        None => Vec::new(),
        Some(file) => {
            postern_broker::config::Config::load(file)
                .map_err(|e| Failure::unavailable(e.to_string()).with_json(json, "config"))?
                .witnesses
        }
    };
    if against.ask_witnesses && witnesses.is_empty() {
        return Err(Failure::unavailable(
            "--ask-witnesses needs --config naming a targets file with [[witness]] entries",
        )
        .with_json(json, "config"));
    }
    // Stored cosignatures, checked with the configured witness keys; then, if asked,
    // what each witness holds now.
    let stored = audit::witnessing::cosigned_heads(&conn, &log_key, &witnesses);
    drop(conn);
    let result = match stored {
        Err(e) => Err(e),
        Ok(mut heads) => {
            if against.ask_witnesses {
                let asked = crate::runtime()?
                    .block_on(audit::witnessing::ask_witnesses(&log_key, &witnesses));
                match asked {
                    Ok(live) => heads.extend(live),
                    Err(e) => return Err(Failure::unavailable(e).with_json(json, "witness")),
                }
            }
            let witnesses = audit::assurance::witnesses_in(&heads);
            let outside = audit::Outside {
                anchor: against
                    .anchor
                    .map(Path::to_path_buf)
                    .or_else(|| audit::default_anchor(data_dir)),
                heads,
            };
            audit::verify_file_with(&db, &log_key, &outside).map(|r| (r, witnesses))
        }
    };
    match result {
        Ok((report, witnesses)) => {
            let assurance = audit::Assurance::of(signer, witnesses);
            if json {
                let mut value = serde_json::to_value(&report).unwrap_or(Value::Null);
                if let Value::Object(map) = &mut value {
                    map.insert("ok".into(), Value::Bool(true));
                    map.insert(
                        "assurance".into(),
                        serde_json::to_value(&assurance).unwrap_or(Value::Null),
                    );
                }
                println!("{value}");
            } else {
                if report.events == 0 {
                    println!("verified: the journal is empty");
                } else {
                    println!(
                        "verified: {} events, through sequence {}, every one signed \
                         ({} checkpoints kept, the last at {}); Merkle root {}",
                        report.events,
                        report.verified_through,
                        report.checkpoints,
                        report.last_checkpoint_seq.unwrap_or(0),
                        report.root_hex
                    );
                }
                println!("assurance: {}", assurance.statement);
                for late in &report.signed_late {
                    println!(
                        "note: events {}..={} were signed only when the broker next started \
                         (sequence {}): the run that wrote them ended without signing them",
                        late.first, late.last, late.at
                    );
                }
            }
            Ok(())
        }
        Err(AuditError::Broken {
            first_bad_seq,
            kind,
            detail,
            ..
        }) => {
            let kind_name = serde_json::to_value(kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| format!("{kind:?}"));
            let message =
                format!("audit FAILED at sequence {first_bad_seq}: {kind_name}: {detail}");
            if json {
                println!(
                    "{}",
                    json!({
                        "ok": false,
                        "error": "broken",
                        "first_bad_seq": first_bad_seq,
                        "kind": kind_name,
                        "detail": detail,
                    })
                );
            } else {
                println!("{message}");
            }
            // Already reported on stdout, which is where a check's result goes.
            Err(Failure::silent(common::EXIT_FAILED))
        }
        Err(AuditError::Damaged { path, detail }) => {
            if json {
                println!(
                    "{}",
                    json!({ "ok": false, "error": "damaged", "path": path, "detail": detail })
                );
            } else {
                println!("audit FAILED: the journal file {path} is damaged: {detail}");
            }
            Err(Failure::silent(common::EXIT_FAILED))
        }
        Err(AuditError::Refuted { detail }) => {
            if json {
                println!(
                    "{}",
                    json!({ "ok": false, "error": "refuted", "detail": detail })
                );
            } else {
                println!("audit FAILED: a witness refutes this journal: {detail}");
            }
            Err(Failure::silent(common::EXIT_FAILED))
        }
        Err(e @ AuditError::Unreadable { .. }) => {
            Err(Failure::unavailable(e.to_string()).with_json(json, "unreadable"))
        }
    }
}
