//! A broker process that runs one HTTP request and is meant to be killed mid-flight.
//!
//! Usage: `http_child DATA_DIR KEYCHAIN_SERVICE URL` (the config is `DATA_DIR/postern.toml`).

use std::path::PathBuf;
use std::process::ExitCode;

use postern_broker::channel::http::HttpRequest;
use postern_broker::invocation::CallContext;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, service, url] = args.as_slice() else {
        eprintln!("usage: http_child DATA_DIR KEYCHAIN_SERVICE URL");
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
    let Ok(runtime) = tokio::runtime::Runtime::new() else {
        return ExitCode::from(3);
    };
    let request = HttpRequest {
        url: url.clone(),
        method: "POST".into(),
        body: b"{\"amount\":5}".to_vec(),
        ..Default::default()
    };
    let outcome = runtime.block_on(broker.channel.execute(request, &CallContext::default()));
    println!("{:?}", outcome.outcome);
    ExitCode::SUCCESS
}
