//! `postern witness init|add-log|serve`: a transparency-log witness
//! (c2sp.org/tlog-witness) that cosigns a log's checkpoints only while they stay
//! append-only. Its data dir holds `witness.key` (0600) and `witness.db`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use postern_broker::clock::SystemClock;
use postern_broker::transparency::server;
use postern_broker::transparency::witness::{self, SetupError, Witness};

use crate::common::{Failure, Outcome};

#[derive(clap::Subcommand)]
pub enum WitnessCmd {
    /// Create a witness: a new Ed25519 key (DIR/witness.key, 0600) and its database.
    /// Prints the witness's verifier key, which logs and auditors configure.
    #[command(after_help = "Example:\n  \
        postern witness init --data-dir /var/lib/postern-witness --name witness.example/w1")]
    Init {
        /// The witness's data directory (created 0700 if missing).
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
        /// The witness's key name, e.g. a schema-less URL (no spaces, no `+`).
        #[arg(long, value_name = "NAME")]
        name: String,
    },
    /// Let the witness cosign for a log: its checkpoint origin and verifier key.
    #[command(after_help = "Example:\n  \
        postern witness add-log --data-dir /var/lib/postern-witness \\\n      \
        --origin postern.example/journal --key \"postern.example/journal+0628c750+AQOh...\"\n\n\
        The key is a signed-note verifier key, <name>+<key id>+<base64(0x01 || key)>.")]
    AddLog {
        /// The witness's data directory.
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
        /// The checkpoint origin line of the log.
        #[arg(long, value_name = "ORIGIN")]
        origin: String,
        /// The log's verifier key.
        #[arg(long, value_name = "VKEY")]
        key: String,
    },
    /// Serve POST /add-checkpoint and GET /postern/latest until SIGTERM or ctrl-c.
    /// Prints the bound address on stdout.
    #[command(after_help = "Example:\n  \
        postern witness serve --data-dir /var/lib/postern-witness --listen 127.0.0.1:7380\n\n\
        Port 0 picks a free port; the address actually bound is printed.")]
    Serve {
        /// The witness's data directory.
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
        /// The address to listen on (HTTP; put TLS in front for anything but loopback).
        #[arg(long, value_name = "ADDR:PORT")]
        listen: SocketAddr,
    },
}

pub fn run(cmd: WitnessCmd) -> Outcome {
    match cmd {
        WitnessCmd::Init { data_dir, name } => init(&data_dir, &name),
        WitnessCmd::AddLog {
            data_dir,
            origin,
            key,
        } => add_log(&data_dir, &origin, &key),
        WitnessCmd::Serve { data_dir, listen } => serve(&data_dir, listen),
    }
}

fn setup_failure(e: SetupError) -> Failure {
    match e {
        SetupError::AlreadyInitialized { .. }
        | SetupError::Name(_)
        | SetupError::Log(_)
        | SetupError::KeyPermissions { .. }
        | SetupError::Store(postern_broker::transparency::store::StoreError::LogExists {
            ..
        })
        | SetupError::Store(postern_broker::transparency::store::StoreError::NotALogKey {
            ..
        }) => Failure::failed(e.to_string()),
        _ => Failure::unavailable(e.to_string()),
    }
}

/// Creates the witness key and database; prints the witness's verifier key.
pub fn init(data_dir: &Path, name: &str) -> Outcome {
    let vkey = witness::init(data_dir, name).map_err(setup_failure)?;
    println!("{vkey}");
    eprintln!(
        "postern: witness `{name}` created in {}; give logs the verifier key above",
        data_dir.display()
    );
    Ok(())
}

/// Adds a log (origin and its signed-note verifier key) the witness cosigns for.
pub fn add_log(data_dir: &Path, origin: &str, key: &str) -> Outcome {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    witness::add_log(data_dir, origin, key, now).map_err(setup_failure)?;
    eprintln!("postern: the witness now cosigns for `{origin}`");
    Ok(())
}

/// Serves the witness on `listen` until SIGTERM or ctrl-c; prints the bound address.
pub fn serve(data_dir: &Path, listen: SocketAddr) -> Outcome {
    let witness = Arc::new(Witness::open(data_dir, Arc::new(SystemClock)).map_err(setup_failure)?);
    let runtime = crate::runtime()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|e| Failure::unavailable(format!("cannot listen on {listen}: {e}")))?;
        let bound = listener
            .local_addr()
            .map_err(|e| Failure::unavailable(format!("cannot read the bound address: {e}")))?;
        // The one line on stdout: scripts and tests read the port from it.
        println!("{bound}");
        eprintln!(
            "postern: witness `{}` serving http://{bound}/add-checkpoint",
            witness.name()
        );
        server::serve(witness, listener, shutdown_signal()).await;
        Ok(())
    })
}

async fn shutdown_signal() {
    match postern_broker::platform::termination() {
        Ok(terminate) => {
            tokio::select! {
                () = terminate => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
