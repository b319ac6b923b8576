use postern_broker::contract::*;

fn full_envelope() -> Envelope {
    Envelope {
        invocation_id: "inv_0123".into(),
        error: ErrorBody {
            code: Code::RemoteOutcomeUnknown,
            phase: Phase::RemoteExecution,
            outcome: Outcome::Unknown,
            retry: Retry::SameIdempotencyKey,
            message: "Connection closed before a complete response was recorded.".into(),
        },
        evidence: Evidence {
            dispatch_started: true,
            request_headers_sent: true,
            request_complete: true,
            response_headers_received: false,
            response_complete: false,
            attempts: vec![
                AttemptEvidence {
                    n: 1,
                    stage: Stage::TcpConnect,
                    outcome: Outcome::NotAttempted,
                    code: Code::ConnectionRefused,
                    via: None,
                },
                AttemptEvidence {
                    n: 2,
                    stage: Stage::TlsHandshake,
                    outcome: Outcome::NotAttempted,
                    code: Code::TlsRejected,
                    via: None,
                },
            ],
            idempotency: Some(IdempotencyEvidence {
                key: "req_01".into(),
                scope: Some("payments.create".into()),
                fingerprint: "blake3:8b1".into(),
                remote_contract: RemoteContract::Configured,
                expires_at_ms: Some(1_800_086_400_000),
            }),
            fingerprint: Some("blake3:8b1".into()),
            dispatch_sequence: Some(41),
            journal_sequence: 44,
            attempt_generation: 3,
            connection_id: Some("conn-7".into()),
            peer_identity: Some("sha256:ab".into()),
            remote_request_id: None,
            http_status: None,
            response_digest: None,
            exit_status: None,
            exit_signal: None,
            result_record_id: None,
            confidence: Some(ConfidenceSource::TransportObserved),
            redactions: 0,
            field: None,
            status_resource: None,
            redirect_location: None,
            not_before_ms: None,
            parent: None,
            job: None,
            members: Vec::new(),
            peer: None,
        },
    }
}

#[test]
fn envelope_json_shape_is_pinned_by_the_golden_file() {
    let actual: serde_json::Value = serde_json::to_value(full_envelope()).unwrap();
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("../golden/envelope_unknown.json")).unwrap();
    assert_eq!(
        actual, golden,
        "the envelope shape changed; fields may be added, never renamed"
    );
}

#[test]
fn empty_evidence_still_serializes_every_field() {
    let value = serde_json::to_value(Evidence::default()).unwrap();
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("../golden/evidence_empty.json")).unwrap();
    assert_eq!(value, golden);
}

#[test]
fn envelope_round_trips_through_json() {
    let env = full_envelope();
    let text = serde_json::to_string(&env).unwrap();
    assert_eq!(serde_json::from_str::<Envelope>(&text).unwrap(), env);
}

#[test]
fn closed_enums_use_the_seed_wire_names() {
    let phases: Vec<&str> = Phase::ALL.iter().map(|p| p.as_str()).collect();
    assert_eq!(
        phases,
        [
            "validation",
            "credential_injection",
            "connection_setup",
            "remote_execution",
            "result_delivery"
        ]
    );
    let outcomes: Vec<&str> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
    assert_eq!(
        outcomes,
        ["not_attempted", "rejected", "committed", "unknown"]
    );
    let retries: Vec<&str> = Retry::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(
        retries,
        [
            "never",
            "after_correction",
            "backoff",
            "same_idempotency_key",
            "reconcile",
            "fetch_result"
        ]
    );
    let sources: Vec<&str> = ConfidenceSource::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(
        sources,
        [
            "transport_observed",
            "remote_response",
            "remote_query",
            "operator_attested"
        ]
    );
    for p in Phase::ALL {
        assert_eq!(serde_json::to_value(p).unwrap(), p.as_str());
        assert_eq!(Phase::parse(p.as_str()), Some(*p));
    }
}

#[test]
fn unknown_enum_values_are_rejected_when_parsing() {
    assert!(serde_json::from_str::<Outcome>("\"transient\"").is_err());
    assert!(serde_json::from_str::<Code>("\"NOT_A_CODE\"").is_err());
    assert_eq!(Retry::parse("maybe"), None);
}

#[test]
fn codes_are_unique_screaming_snake_and_serialize_as_their_wire_form() {
    let mut seen = std::collections::HashSet::new();
    for code in Code::ALL {
        let wire = code.as_str();
        assert!(seen.insert(wire), "duplicate code {wire}");
        assert!(
            wire.chars().all(|c| c.is_ascii_uppercase() || c == '_'),
            "{wire}"
        );
        assert_eq!(serde_json::to_value(code).unwrap(), wire);
        assert!(!code.spec().meaning.is_empty());
    }
}

#[test]
fn preflight_codes_never_claim_the_remote_acted() {
    for code in Code::ALL {
        let spec = code.spec();
        if matches!(
            spec.phase,
            Some(Phase::Validation | Phase::CredentialInjection | Phase::ConnectionSetup)
        ) {
            assert_eq!(spec.outcome, Some(Outcome::NotAttempted), "{code}");
        }
    }
}

#[test]
fn errors_table_matches_the_code_enum() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/errors.md");
    let rendered = postern_broker::errors_document();
    if std::env::var_os("POSTERN_BLESS").is_some() {
        std::fs::write(path, &rendered).unwrap();
    }
    let committed = std::fs::read_to_string(path).unwrap();
    assert_eq!(
        committed, rendered,
        "docs/errors.md drifted from Code::ALL; re-bless it"
    );
    for code in Code::ALL {
        assert!(committed.contains(&format!("`{}`", code.as_str())));
    }
}
