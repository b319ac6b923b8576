//! A broker process that runs one SSH command and is meant to be killed mid-flight.
//!
//! Usage: `ssh_child DATA_DIR KEYCHAIN_SERVICE TARGET COMMAND` (config: `DATA_DIR/postern.toml`).

use std::path::PathBuf;
use std::process::ExitCode;

use postern_broker::channel::ssh::{SshChannel, SshRequest};
use postern_broker::invocation::CallContext;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, service, target, command] = args.as_slice() else {
        eprintln!("usage: ssh_child DATA_DIR KEYCHAIN_SERVICE TARGET COMMAND");
        return ExitCode::from(2);
    };
    let dir = PathBuf::from(dir);
    let Ok(text) = std::fs::read_to_string(dir.join("postern.toml")) else {
        eprintln!("no config in {}", dir.display());
        return ExitCode::from(2);
    };
    let broker = match postern_tests::fixture::open_broker(&dir, &text, service) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("open: {e}");
            return ExitCode::from(3);
        }
    };
    let channel = SshChannel::new(
        broker.journal.clone(),
        broker.vault.clone(),
        broker.config.clone(),
    );
    let Ok(runtime) = tokio::runtime::Runtime::new() else {
        return ExitCode::from(3);
    };
    let request = SshRequest {
        host: target.clone(),
        command: command.clone(),
        stdin: None,
        timeout_ms: None,
    };
    let outcome = runtime.block_on(channel.execute(request, &CallContext::default()));
    println!("{:?}", outcome.outcome);
    ExitCode::SUCCESS
}
