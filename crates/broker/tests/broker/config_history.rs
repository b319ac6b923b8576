//! An operator's target edit keeps the previous targets file in
//! `DATA_DIR/config-history/`, and a refused edit changes and keeps nothing.

use postern_broker::config_edit::{self, TargetEditError};

const BEFORE: &str = r#"# the operator's comment
[[http]]
name = "api"
base_url = "https://api.example.test/v1"
methods = ["GET"]
credential = "api-key"
inject = { header = "Authorization", format = "Bearer {secret}" }
approval = "none"
"#;

const EDITED: &str = r#"[[http]]
name = "api"
base_url = "https://api.example.test/v2"
methods = ["GET", "POST"]
credential = "api-key"
inject = { header = "Authorization", format = "Bearer {secret}" }
approval = "none"
"#;

fn history(data_dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    match std::fs::read_dir(data_dir.join(config_edit::HISTORY_DIR)) {
        Ok(dir) => dir.map(|e| e.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn the_previous_file_is_kept_under_config_history_named_by_time_and_target() {
    let dir = tempfile::tempdir().unwrap();
    let path = config_edit::keep_previous(dir.path(), "api", BEFORE.as_bytes(), 1_234).unwrap();
    assert_eq!(
        path,
        dir.path()
            .join("config-history")
            .join("1234-before-api.toml")
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), BEFORE);
}

#[test]
fn an_edit_replaces_the_target_and_keeps_the_file_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("postern.toml");
    std::fs::write(&file, BEFORE).unwrap();
    let edited = config_edit::edit_target(&file, dir.path(), "api", EDITED, 99).unwrap();
    let kept = edited.kept.unwrap();
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), BEFORE);
    assert_eq!(history(dir.path()), vec![kept]);
    let target = edited.config.http_target("api").unwrap();
    assert_eq!(target.base_url.as_str(), "https://api.example.test/v2");
    let now = std::fs::read_to_string(&file).unwrap();
    assert!(now.contains("/v2"), "{now}");
}

#[test]
fn a_refused_edit_leaves_the_file_unchanged_and_keeps_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("postern.toml");
    std::fs::write(&file, BEFORE).unwrap();
    let renamed = EDITED.replace("name = \"api\"", "name = \"other\"");
    let err = config_edit::edit_target(&file, dir.path(), "api", &renamed, 99).unwrap_err();
    assert!(matches!(err, TargetEditError::Invalid(_)), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), BEFORE);
    assert!(history(dir.path()).is_empty());
}

#[test]
fn an_unreadable_targets_file_is_said_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.toml");
    let err = config_edit::edit_target(&missing, dir.path(), "api", EDITED, 99).unwrap_err();
    assert!(matches!(err, TargetEditError::Unreadable(_)), "{err}");
    assert!(history(dir.path()).is_empty());
}
