//! A broker and a witness as separate processes with separate data dirs: `postern
//! daemon` sends its checkpoints to `postern witness serve`, stores the cosignatures,
//! and `postern audit verify` holds the journal to them. Then the attack the witness is
//! for: an agent with the broker's uid reads the audit key from the keychain, rewrites
//! an event, recomputes the chain, the tree and every signature, and cleans up the
//! witness file, the anchor and the stored cosignatures. Everything local verifies; the
//! witness does not agree, and when the broker starts again on the rewritten journal,
//! the witness refuses it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use postern_broker::audit::merkle::{Frontier, leaf_hash};
use postern_broker::audit::{AUDIT_KEY_ID, ChainHasher, ChainedRow, Checkpoint, GENESIS};
use postern_broker::vault::{Keychain, KeychainBackend, Vault};
use postern_tests::adversary::{Adversary, Behavior};
use postern_tests::agent;
use rusqlite::{Connection, params};
use serde_json::json;
use support::{POSTERN, SECRET};

const WITNESS_NAME: &str = "witness.test/w1";

struct Child9(Child);

impl Drop for Child9 {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run(args: &[&str]) -> std::process::Output {
    Command::new(POSTERN).args(args).output().unwrap()
}

fn ok(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

struct Broker {
    dir: tempfile::TempDir,
    config: PathBuf,
    anchor: PathBuf,
    service: String,
}

impl Broker {
    fn db(&self) -> PathBuf {
        self.dir.path().join("journal.db")
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("run").join("postern.sock")
    }

    /// Starts `postern daemon`; its stderr goes to the returned receiver line by line.
    fn start(&self) -> (Child9, mpsc::Receiver<String>) {
        let mut child = Command::new(POSTERN)
            .args(["daemon", "--data-dir"])
            .arg(self.dir.path())
            .arg("--config")
            .arg(&self.config)
            .arg("--anchor")
            .arg(&self.anchor)
            .args(["--keychain-service", &self.service])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let started = Instant::now();
        while std::os::unix::net::UnixStream::connect(self.socket()).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "daemon did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        (Child9(child), rx)
    }

    fn args<'a>(&'a self, cmd: &[&'a str]) -> Vec<&'a str> {
        let mut args = cmd.to_vec();
        args.extend([
            "--data-dir",
            self.dir.path().to_str().unwrap(),
            "--keychain-service",
            &self.service,
        ]);
        args
    }

    fn verify(&self, ask: bool) -> std::process::Output {
        let mut args = self.args(&["audit", "verify"]);
        args.extend(["--config", self.config.to_str().unwrap()]);
        args.extend(["--anchor", self.anchor.to_str().unwrap()]);
        if ask {
            args.push("--ask-witnesses");
        }
        run(&args)
    }

    fn audit_key(&self) -> SigningKey {
        let keychain = Keychain::new(KeychainBackend::SecretService, &self.service).unwrap();
        let vault = Vault::open(keychain, &self.db()).unwrap();
        let (_, secret) = vault.read_for_injection(AUDIT_KEY_ID, 0).unwrap();
        postern_broker::audit::signing_key_from_secret(&secret).unwrap()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Ok(keychain) = Keychain::new(KeychainBackend::SecretService, &self.service)
            && let Ok(vault) = Vault::open(keychain, &self.db())
        {
            let _ = vault.remove("api-key");
            let _ = vault.remove(AUDIT_KEY_ID);
        }
    }
}

fn max_seq(conn: &Connection) -> u64 {
    conn.query_row("SELECT coalesce(max(seq), 0) FROM events", [], |r| {
        r.get::<_, i64>(0)
    })
    .unwrap() as u64
}

/// Waits until the journal holds a cosignature of its whole tree.
fn wait_cosigned(db: &Path, stderr: &mpsc::Receiver<String>) -> u64 {
    let started = Instant::now();
    loop {
        let conn = Connection::open(db).unwrap();
        let last = max_seq(&conn);
        let cosigned: Option<i64> = conn
            .query_row(
                "SELECT max(size) FROM cosignatures WHERE witness = ?1",
                [WITNESS_NAME],
                |r| r.get(0),
            )
            .unwrap();
        if last > 0 && cosigned == Some(last as i64) {
            return last;
        }
        if started.elapsed() > Duration::from_secs(20) {
            let said: Vec<String> = stderr.try_iter().collect();
            let rows: Vec<(i64, String)> = conn
                .prepare("SELECT size, witness FROM cosignatures")
                .unwrap()
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            eprintln!("cosignature rows: {rows:?}");
            panic!("no cosignature of size {last} (have {cosigned:?}); the daemon said {said:#?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The attacker: every row from `from` rechained, the tree rebuilt (the broker does
/// that from the events), every checkpoint re-signed with `key`, and the cosignatures,
/// witness file and anchor made to match or removed.
fn rewrite_with_stolen_key(db: &Path, anchor: &Path, key: &SigningKey, from: u64) {
    let conn = Connection::open(db).unwrap();
    conn.execute(
        "UPDATE events SET body = replace(body, '/v1/items', '/v1/other') WHERE seq = ?1",
        [from as i64],
    )
    .unwrap();
    let last = max_seq(&conn);
    let mut hasher = ChainHasher::new();
    let mut head = GENESIS;
    let mut frontier = Frontier::default();
    let mut heads = vec![([0u8; 32], [0u8; 32]); last as usize + 1];
    for seq in 1..=last {
        let (invocation_id, kind, body, recorded_at_ms): (String, String, String, i64) = conn
            .query_row(
                "SELECT invocation_id, kind, body, recorded_at_ms FROM events WHERE seq = ?1",
                [seq as i64],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .unwrap();
        head = hasher.link(
            &head,
            &ChainedRow {
                seq,
                invocation_id: &invocation_id,
                kind: &kind,
                body: &body,
                recorded_at_ms,
            },
        );
        frontier.push_leaf(leaf_hash(seq, &head));
        heads[seq as usize] = (head, frontier.root());
        conn.execute(
            "UPDATE events SET hash = ?1 WHERE seq = ?2",
            params![&head[..], seq as i64],
        )
        .unwrap();
    }
    let seqs: Vec<(i64, i64)> = conn
        .prepare("SELECT seq, made_at_ms FROM checkpoints")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut newest = None;
    for (seq, made_at) in seqs {
        let (h, root) = heads[seq as usize];
        let cp = Checkpoint::sign(key, seq as u64, h, root, made_at).with_note(key);
        conn.execute(
            "UPDATE checkpoints SET head = ?1, root = ?2, signature = ?3, note = ?4 WHERE seq = ?5",
            params![&h[..], &root[..], &cp.signature[..], cp.note, seq],
        )
        .unwrap();
        if newest.as_ref().is_none_or(|n: &Checkpoint| n.seq < cp.seq) {
            newest = Some(cp);
        }
    }
    conn.execute_batch("DELETE FROM merkle; DELETE FROM cosignatures;")
        .unwrap();
    drop(conn);
    let newest = newest.unwrap();
    postern_broker::audit::write_checkpoint_file(&postern_broker::audit::witness_path(db), &newest)
        .unwrap();
    postern_broker::audit::write_checkpoint_file(anchor, &newest).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_witness_cosigns_the_journal_and_refutes_a_rewrite_signed_with_the_stolen_key() {
    let origin_server = Adversary::start(Behavior::ok_json("{}")).await.unwrap();

    // The witness: its own process and data dir.
    let witness_dir = tempfile::tempdir().unwrap();
    let wdir = witness_dir.path().to_str().unwrap().to_string();
    let witness_key = ok(&run(&[
        "witness",
        "init",
        "--data-dir",
        &wdir,
        "--name",
        WITNESS_NAME,
    ]))
    .trim()
    .to_string();
    let witness = support::serve_witness(witness_dir.path());
    let witness_url = witness.url.clone();

    // The broker: a target, the witness in its configuration, the token in a test-only
    // keychain service.
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker {
        config: dir.path().with_extension("toml"),
        anchor: dir.path().with_extension("anchor"),
        service: postern_tests::fixture::test_service(),
        dir,
    };
    let mut config = support::config(&origin_server.base_url());
    config.push_str(&format!(
        "\n[[witness]]\nurl = \"{witness_url}\"\nkey = \"{witness_key}\"\n"
    ));
    std::fs::write(&broker.config, config).unwrap();
    {
        let keychain = Keychain::new(KeychainBackend::SecretService, &broker.service).unwrap();
        let vault = Vault::open(keychain, &broker.db()).unwrap();
        vault
            .set(
                "api-key",
                postern_broker::vault::CredentialKind::Token,
                &postern_broker::vault::Secret::from(SECRET.to_string()),
                1,
            )
            .unwrap();
    }
    let (daemon, first_stderr) = broker.start();

    // The witness learns the broker's log from `postern audit key`.
    let printed = ok(&run(&broker.args(&["audit", "key", "--json"])));
    let printed: serde_json::Value = serde_json::from_str(printed.trim()).unwrap();
    let (log_origin, log_key) = (
        printed["origin"].as_str().unwrap().to_string(),
        printed["key"].as_str().unwrap().to_string(),
    );
    ok(&run(&[
        "witness",
        "add-log",
        "--data-dir",
        &wdir,
        "--origin",
        &log_origin,
        "--key",
        &log_key,
    ]));

    let client = agent::connect(Path::new(POSTERN), &broker.socket())
        .await
        .unwrap();
    for _ in 0..3 {
        let result = agent::call(
            &client,
            "http_request",
            json!({"url": origin_server.url("/v1/items"), "method": "GET"}),
        )
        .await
        .unwrap();
        assert!(!agent::is_error(&result), "{result:?}");
    }
    drop(client);
    let cosigned = wait_cosigned(&broker.db(), &first_stderr);
    assert!(cosigned >= 3 * 9, "cosigned only {cosigned} events");

    // Verified against the stored cosignature and the witness itself.
    let out = broker.verify(true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // And it says what that proves.
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("assurance: signed with a key in the user's keychain"),
        "{text}"
    );
    assert!(
        text.contains("cosigned by 1 witness: a rewrite behind what it holds fails"),
        "{text}"
    );

    // The attack, with the broker stopped.
    drop(daemon);
    let stolen = broker.audit_key();
    let first_call: i64 = Connection::open(broker.db())
        .unwrap()
        .query_row(
            "SELECT min(seq) FROM events WHERE kind = 'ACTION_ACCEPTED'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    rewrite_with_stolen_key(&broker.db(), &broker.anchor, &stolen, first_call as u64);

    // Locally, the forgery is perfect; the verdict says why that proves little.
    let out = broker.verify(false);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("could read and re-sign with"), "{text}");
    // The witness is not fooled.
    let out = broker.verify(true);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "audit FAILED at sequence {cosigned}: checkpoint_mismatch"
        )) && text.contains(WITNESS_NAME),
        "{text}"
    );

    // The broker, started on the rewritten journal, offers its checkpoint to the
    // witness, which refuses it: the daemon raises the alarm.
    let (_daemon, stderr) = broker.start();
    let client = agent::connect(Path::new(POSTERN), &broker.socket())
        .await
        .unwrap();
    let result = agent::call(
        &client,
        "http_request",
        json!({"url": origin_server.url("/v1/items"), "method": "GET"}),
    )
    .await
    .unwrap();
    assert!(!agent::is_error(&result), "{result:?}");
    let started = Instant::now();
    let alarm = loop {
        match stderr.recv_timeout(Duration::from_secs(1)) {
            Ok(line) if line.contains("ALARM") => break line,
            Ok(_) => {}
            Err(_) => assert!(started.elapsed() < Duration::from_secs(20), "no alarm"),
        }
    };
    assert!(
        alarm.contains(WITNESS_NAME) && alarm.contains("refused"),
        "{alarm}"
    );

    // The witness still holds the original tree, and says why it refused.
    let wconn = Connection::open(witness_dir.path().join("witness.db")).unwrap();
    let (size, refused): (i64, i64) = wconn
        .query_row(
            "SELECT (SELECT size FROM latest), (SELECT count(*) FROM refusals)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(size as u64 >= cosigned, "witness size {size}");
    assert!(refused >= 1);
}
