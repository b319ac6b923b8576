//! What a verified journal proves, and against whom: who could have made its signatures
//! and how many witnesses hold a cosigned tree head it was checked against. Shown by
//! `postern audit verify` and the console's integrity banner alike.

use serde::Serialize;

/// Who could have made the signatures a verification checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Signer {
    /// The key is in the user's keychain: any process of that user could read it.
    UserKeychain,
    /// The key is in the `file` store: only the broker's own user reads it.
    BrokerFile,
    /// A public key was given; where its private half lives is not known here.
    Given,
}

/// The assurance of one verification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Assurance {
    pub signing_key: Signer,
    /// Witnesses whose cosigned tree heads the journal was checked against.
    pub witnesses: usize,
    /// One sentence for people.
    pub statement: String,
}

impl Assurance {
    pub fn of(signing_key: Signer, witnesses: usize) -> Assurance {
        let signed = match signing_key {
            Signer::UserKeychain => {
                "signed with a key in the user's keychain, which any process of that user \
                 could read and re-sign with"
            }
            Signer::BrokerFile => {
                "signed with a key only the broker's own user can read (the \
                 privilege-separated install)"
            }
            Signer::Given => {
                "checked against the public key given; how its private half is kept is not \
                 known here"
            }
        };
        let witnessed = match witnesses {
            0 => "no witness's cosignature was checked: whoever holds the signing key could \
                  rewrite the journal and re-sign it"
                .to_string(),
            1 => "cosigned by 1 witness: a rewrite behind what it holds fails even with the \
                  signing key"
                .to_string(),
            n => format!(
                "cosigned by {n} witnesses: a rewrite behind what they hold fails even with \
                 the signing key"
            ),
        };
        Assurance {
            signing_key,
            witnesses,
            statement: format!("{signed}; {witnessed}"),
        }
    }

    /// The signer for a broker whose audit key is in `backend`.
    pub fn signer_of(backend: crate::vault::KeychainBackend) -> Signer {
        match backend {
            crate::vault::KeychainBackend::File => Signer::BrokerFile,
            _ => Signer::UserKeychain,
        }
    }
}

/// How many distinct witnesses `heads` come from.
pub fn witnesses_in(heads: &[super::TreeHead]) -> usize {
    heads
        .iter()
        .filter_map(|h| h.witness.as_deref())
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statement_names_who_could_sign_and_how_many_witnesses_hold_it() {
        let a = Assurance::of(Signer::UserKeychain, 0);
        assert!(a.statement.contains("could read and re-sign with"));
        assert!(a.statement.contains("no witness"));
        assert!(
            Assurance::of(Signer::BrokerFile, 2)
                .statement
                .contains("cosigned by 2 witnesses")
        );
    }
}
