//! `postern config check`: validates a targets file the way the broker loads it.

use std::path::Path;

use postern_broker::config::Config;

use crate::common::{self, Failure, print_table};

pub fn check(file: &Path) -> common::Outcome {
    // The error already names the file, the target and the field.
    let config = Config::load(file).map_err(|e| Failure::failed(e.to_string()))?;
    let count = config.http.len() + config.ssh.len();
    println!(
        "{}: OK, {count} target{}",
        file.display(),
        if count == 1 { "" } else { "s" }
    );
    if count == 0 {
        return Ok(());
    }
    let mut rows: Vec<Vec<String>> = Vec::with_capacity(count);
    for t in &config.http {
        rows.push(vec![
            "http".into(),
            t.name.clone(),
            t.base_url.to_string(),
            t.approval.as_str().into(),
            t.credential.to_string(),
            t.version().to_string(),
        ]);
    }
    for t in &config.ssh {
        rows.push(vec![
            "ssh".into(),
            t.name.clone(),
            if t.host.contains(':') {
                format!("{}@[{}]:{}", t.user, t.host, t.port)
            } else {
                format!("{}@{}:{}", t.user, t.host, t.port)
            },
            t.approval.as_str().into(),
            t.credential.to_string(),
            t.version().to_string(),
        ]);
    }
    println!();
    print_table(
        &[
            "KIND",
            "NAME",
            "ADDRESS",
            "APPROVAL",
            "CREDENTIAL",
            "VERSION",
        ],
        &rows,
    );
    Ok(())
}
