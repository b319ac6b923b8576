//! The configured targets and the edit of one target's table in the config file.

use postern_broker::config_edit::{self, TargetEditError};

use super::Console;
use crate::dto::{CommandError, ErrorCode, TargetCard, TargetEdit, TargetList};

impl Console {
    pub fn targets(&self) -> Result<TargetList, CommandError> {
        let config = self.engine.config().current();
        let texts = postern_broker::config_edit::target_texts(&self.paths.config)
            .map_err(|e| CommandError::new(ErrorCode::ConfigUnreadable, e.to_string()))?;
        let text_of = |name: &str| {
            texts
                .iter()
                .find(|t| t.name == name)
                .map(|t| t.text.clone())
                .unwrap_or_default()
        };
        let mut targets: Vec<TargetCard> = config
            .http
            .iter()
            .map(|t| TargetCard {
                name: t.name.clone(),
                channel: "http".into(),
                location: t.base_url.to_string(),
                credential: t.credential.as_str().to_string(),
                approval: t.approval.as_str().into(),
                require_confined: t.require_confined,
                version: t.version().to_string(),
                toml: text_of(&t.name),
            })
            .collect();
        targets.extend(config.ssh.iter().map(|t| TargetCard {
            name: t.name.clone(),
            channel: "ssh".into(),
            location: format!("{}@{}:{}", t.user, t.host, t.port),
            credential: t.credential.as_str().to_string(),
            approval: t.approval.as_str().into(),
            require_confined: t.require_confined,
            version: t.version().to_string(),
            toml: text_of(&t.name),
        }));
        Ok(TargetList {
            config_path: self.paths.config.display().to_string(),
            targets,
        })
    }

    /// Replaces one target's table in the config file, or adds a new target (the edited
    /// file is validated before it replaces the original), keeps the previous file in
    /// `config-history/`, and swaps the live config: an edited target gets a new
    /// version, so pending requests bound to the old one are refused at dispatch
    /// (FINGERPRINT_MISMATCH).
    pub fn update_target(&self, edit: &TargetEdit) -> Result<TargetCard, CommandError> {
        let _one_at_a_time = self
            .edit
            .lock()
            .map_err(|_| CommandError::new(ErrorCode::Internal, "the editor lock was poisoned"))?;
        let edited = config_edit::edit_target(
            &self.paths.config,
            &self.paths.data_dir,
            &edit.name,
            &edit.toml,
            self.now(),
        )
        .map_err(|e| match e {
            TargetEditError::Unreadable(e) => {
                CommandError::new(ErrorCode::ConfigUnreadable, e.to_string())
            }
            TargetEditError::Invalid(e) => {
                CommandError::field(ErrorCode::ConfigInvalid, "toml", e.to_string())
            }
        })?;
        self.engine.config().replace(edited.config);
        // Failing to keep the previous file does not undo the edit, but is said.
        if let Err(e) = edited.kept {
            eprintln!("postern-console: the previous config was not kept: {e}");
        }
        self.targets()?
            .targets
            .into_iter()
            .find(|t| t.name == edit.name)
            .ok_or_else(|| {
                CommandError::new(ErrorCode::Internal, "the edited target is not listed")
            })
    }
}
