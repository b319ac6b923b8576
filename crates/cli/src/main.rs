//! Temporary entry point while the operator commands land.
use std::path::PathBuf;
use std::process::ExitCode;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let Ok(rt) = tokio::runtime::Runtime::new() else {
        return ExitCode::FAILURE;
    };
    let result = match args.get(1).map(String::as_str) {
        Some("daemon") => rt.block_on(postern_mcp::run_daemon(postern_mcp::DaemonArgs {
            data_dir: PathBuf::from(arg(&args, "--data-dir").unwrap_or_default()),
            config: PathBuf::from(arg(&args, "--config").unwrap_or_default()),
            socket: arg(&args, "--socket").map(PathBuf::from),
            keychain: postern_mcp::KeychainChoice::SecretService,
            service: arg(&args, "--keychain-service").unwrap_or_else(|| "postern".into()),
        })),
        Some("mcp") => rt.block_on(postern_mcp::run_bridge(postern_mcp::BridgeArgs {
            socket: PathBuf::from(arg(&args, "--socket").unwrap_or_default()),
        })),
        _ => Err("usage".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
