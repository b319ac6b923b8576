//! Runs one invocation through the journal and aborts the process right after durable
//! step N, as a crash would: no destructors, no clean shutdown, no final checkpoint.
//!
//! Usage: `crash_child DB N`

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (Some(db), Some(step)) = (args.next(), args.next()) else {
        eprintln!("usage: crash_child DB N");
        return ExitCode::from(2);
    };
    let Ok(stop_after) = step.parse::<usize>() else {
        eprintln!("N must be a step number");
        return ExitCode::from(2);
    };
    let journal = match postern_tests::open_journal(&PathBuf::from(db)) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("open: {e}");
            return ExitCode::from(3);
        }
    };
    let result = postern_tests::run_lifecycle(&journal, |n| {
        if n == stop_after {
            // Markers are pipelined (not waited for); crash once the step is recorded.
            let _ = journal.flush();
            std::process::abort();
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lifecycle: {e:?}");
            ExitCode::from(4)
        }
    }
}
