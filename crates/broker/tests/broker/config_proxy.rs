//! A target's `proxy` key and the environment's proxy variables: parsing, where the
//! environment applies when the file is loaded, and what enters the target version.

use std::path::{Path, PathBuf};

use postern_broker::config::proxy::{ProxyEnv, ProxyProblem, ProxySetting};
use postern_broker::config::*;

fn target(name: &str, base_url: &str, extra: &str) -> String {
    format!(
        r#"
[[http]]
name = "{name}"
base_url = "{base_url}"
methods = ["GET"]
credential = "k"
inject = {{ query = "api_key" }}
approval = "none"
{extra}
"#
    )
}

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("/etc/postern/config.toml"))
}

fn env(vars: &[(&str, &str)]) -> ProxyEnv {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    ProxyEnv::from_lookup(move |name| vars.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()))
}

/// Writes `text` to a fresh file and loads it under `env`.
fn load(text: &str, env: &ProxyEnv) -> (tempfile::TempDir, Result<Config, ConfigError>) {
    let dir = tempfile::tempdir().unwrap();
    let file: PathBuf = dir.path().join("targets.toml");
    std::fs::write(&file, text).unwrap();
    let loaded = Config::load_with(&file, env);
    (dir, loaded)
}

fn via(config: &Config, name: &str) -> Option<String> {
    config
        .http_target(name)
        .unwrap()
        .proxy
        .via()
        .map(|p| p.authority())
}

// Regression: issue 13
#[test]
fn a_proxy_enters_the_target_version_without_its_credentials_and_only_when_used() {
    let version = |extra: &str| {
        parse(&target("api", "https://api.example.test", extra))
            .unwrap()
            .http[0]
            .version()
    };
    let direct = version("");
    assert_eq!(
        version("proxy = \"none\""),
        direct,
        "no proxy used: the v1 digest"
    );
    let proxied = version("proxy = \"http://proxy.test:3128\"");
    assert_ne!(proxied, direct);
    assert_eq!(
        version("proxy = \"http://user:pw@PROXY.test:3128/\""),
        proxied,
        "credentials and spelling do not change what the version binds"
    );
    assert_ne!(version("proxy = \"http://proxy.test:3129\""), proxied);
    assert_ne!(version("proxy = \"http://other.test:3128\""), proxied);
}

// Regression: issue 13
#[test]
fn a_bad_proxy_value_names_the_field_without_repeating_the_value() {
    for (value, problem) in [
        (
            "socks5://user:hunter2@proxy.test:1080",
            ProxyProblem::UnsupportedScheme,
        ),
        (
            "https://user:hunter2@proxy.test:443",
            ProxyProblem::UnsupportedScheme,
        ),
        (
            "http://user:hunter2@proxy.test:3128/x",
            ProxyProblem::PathQueryOrFragment,
        ),
        ("hunter2", ProxyProblem::NotAUrl),
    ] {
        let text = target(
            "api",
            "https://api.example.test",
            &format!("proxy = \"{value}\""),
        );
        let err = parse(&text).unwrap_err();
        let shown = err.to_string();
        assert!(!shown.contains("hunter2"), "{shown}");
        match err {
            ConfigError::Invalid(e) => {
                assert_eq!(e.field, "proxy");
                assert_eq!(e.problem, Problem::InvalidProxy { problem }, "{value}");
            }
            other => panic!("{other:?}"),
        }
    }
}

// Regression: issue 13
#[test]
fn the_environment_applies_at_load_except_to_loopback_no_proxy_opted_out_and_explicit() {
    let text = [
        target("remote", "https://api.example.test", ""),
        target("local", "http://127.0.0.1:8080", ""),
        target("localhost", "https://localhost:8443", ""),
        target("optout", "https://b.example.test", "proxy = \"none\""),
        target(
            "explicit",
            "https://c.example.test",
            "proxy = \"http://own.test:1\"",
        ),
        target("excluded", "https://api.internal.test", ""),
        target("ip", "https://10.1.2.3", ""),
    ]
    .concat();
    let vars = env(&[
        ("HTTPS_PROXY", "http://u:pw@corp-proxy.test:3128"),
        ("http_proxy", "http://plain-proxy.test:80"),
        ("no_proxy", ".internal.test,10.0.0.0/8"),
    ]);
    let (_dir, loaded) = load(&text, &vars);
    let config = loaded.unwrap();
    assert_eq!(
        via(&config, "remote").as_deref(),
        Some("corp-proxy.test:3128")
    );
    assert!(
        config
            .http_target("remote")
            .unwrap()
            .proxy
            .via()
            .unwrap()
            .has_credentials(),
        "the environment's credentials are kept for the CONNECT"
    );
    for name in ["local", "localhost", "optout", "excluded", "ip"] {
        assert_eq!(via(&config, name), None, "{name}");
    }
    assert_eq!(via(&config, "explicit").as_deref(), Some("own.test:1"));
    assert_eq!(
        config.http_target("optout").unwrap().proxy,
        ProxySetting::Direct
    );
    // The environment's proxy is bound like a named one.
    let named = parse(&target(
        "remote",
        "https://api.example.test",
        "proxy = \"http://corp-proxy.test:3128\"",
    ))
    .unwrap();
    assert_eq!(
        config.http_target("remote").unwrap().version(),
        named.http[0].version()
    );
    // Parsing alone never reads an environment.
    let parsed = parse(&text).unwrap();
    assert_eq!(via(&parsed, "remote"), None);
    assert_eq!(
        parsed.http_target("local").unwrap().version(),
        config.http_target("local").unwrap().version()
    );
}

// Regression: issue 13
#[test]
fn a_malformed_environment_proxy_fails_the_load_only_where_it_applies() {
    let bad = env(&[("HTTPS_PROXY", "socks5://u:hunter2@proxy.test:1080")]);
    let (_dir, loaded) = load(&target("local", "https://localhost:8443", ""), &bad);
    assert!(loaded.is_ok(), "no target uses it: {loaded:?}");
    let (_dir, loaded) = load(&target("remote", "https://api.example.test", ""), &bad);
    let err = loaded.unwrap_err();
    let shown = err.to_string();
    assert!(
        shown.contains("HTTPS_PROXY") && !shown.contains("hunter2"),
        "{shown}"
    );
    match err {
        ConfigError::Invalid(e) => assert_eq!(
            e.problem,
            Problem::InvalidEnvironmentProxy {
                variable: "HTTPS_PROXY",
                problem: ProxyProblem::UnsupportedScheme,
            }
        ),
        other => panic!("{other:?}"),
    }
    // A value without a scheme is an http proxy, as curl reads it.
    let bare = env(&[("https_proxy", "proxy.test:8080")]);
    let (_dir, loaded) = load(&target("remote", "https://api.example.test", ""), &bare);
    assert_eq!(
        via(&loaded.unwrap(), "remote").as_deref(),
        Some("proxy.test:8080")
    );
}
