//! Outbound proxies for `[[http]]` targets: the `proxy` key, the environment's
//! `HTTPS_PROXY` / `HTTP_PROXY` / `NO_PROXY`, and the credentials a proxy URL may carry.
//!
//! Only `http://` proxies are supported, and every request through one is tunnelled
//! with `CONNECT` (plain http too), so the HTTP channel has one code path. A proxy URL
//! may carry `user:password@`: it becomes a `Proxy-Authorization: Basic` value held like
//! a secret (zeroized on drop, `<redacted>` in `Debug`, never serialized). Everything
//! that is shown or recorded ([`Proxy::authority`], [`Proxy::url`]) leaves it out.
//!
//! The environment is read once, when the targets file is loaded
//! ([`crate::config::Config::load`]), never per request. A target without a `proxy` key
//! uses the environment's proxy for its scheme unless its host is loopback (`localhost`,
//! `127.0.0.0/8`, `::1`) or matches `NO_PROXY`; `proxy = "none"` opts out; an explicit
//! proxy URL is used whatever the environment says.

use std::fmt;
use std::net::IpAddr;

use base64::Engine as _;
use zeroize::Zeroizing;

/// What can be wrong with a proxy URL. Messages never repeat the URL: it may hold a
/// password.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProxyProblem {
    #[error("not a valid proxy URL; write `http://host:port` or \"none\"")]
    NotAUrl,
    #[error("only http:// proxies are supported (the tunnel to the target is CONNECT)")]
    UnsupportedScheme,
    #[error("a proxy URL has no host")]
    NoHost,
    #[error("a proxy URL may not have a path, query or fragment")]
    PathQueryOrFragment,
    #[error("the proxy user name may not contain `:` (RFC 7617 §2)")]
    ColonInUser,
    #[error("the proxy user name or password is not valid UTF-8 once percent-decoded")]
    InvalidUserinfo,
}

/// `Proxy-Authorization: Basic …`, kept like a secret.
#[derive(Clone, PartialEq, Eq)]
struct ProxyAuth(Zeroizing<String>);

impl fmt::Debug for ProxyAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// An HTTP proxy the channel tunnels through.
#[derive(Clone, PartialEq, Eq)]
pub struct Proxy {
    /// Lowercase; IPv6 literals in brackets.
    host: String,
    port: u16,
    auth: Option<ProxyAuth>,
}

impl fmt::Debug for Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Proxy")
            .field("url", &self.url())
            .field("auth", &self.auth)
            .finish()
    }
}

impl Proxy {
    /// Parses `http://[user[:password]@]host[:port][/]` (the port defaults to 80, as
    /// for any http URL).
    pub fn parse(text: &str) -> Result<Proxy, ProxyProblem> {
        let url = url::Url::parse(text.trim()).map_err(|_| ProxyProblem::NotAUrl)?;
        if url.scheme() != "http" {
            return Err(ProxyProblem::UnsupportedScheme);
        }
        let host = match url.host_str() {
            Some(h) if !h.is_empty() => h.to_ascii_lowercase(),
            _ => return Err(ProxyProblem::NoHost),
        };
        if !matches!(url.path(), "" | "/") || url.query().is_some() || url.fragment().is_some() {
            return Err(ProxyProblem::PathQueryOrFragment);
        }
        let port = url.port_or_known_default().unwrap_or(80);
        let auth = if url.username().is_empty() && url.password().is_none() {
            None
        } else {
            let user = percent_decode(url.username()).ok_or(ProxyProblem::InvalidUserinfo)?;
            if user.contains(':') {
                return Err(ProxyProblem::ColonInUser);
            }
            let password = percent_decode(url.password().unwrap_or(""))
                .ok_or(ProxyProblem::InvalidUserinfo)?;
            let pair = Zeroizing::new(format!("{}:{}", user.as_str(), password.as_str()));
            let encoded = base64::engine::general_purpose::STANDARD.encode(pair.as_bytes());
            Some(ProxyAuth(Zeroizing::new(format!("Basic {encoded}"))))
        };
        Ok(Proxy { host, port, auth })
    }

    /// The host to resolve and connect to (IPv6 without brackets).
    pub fn host(&self) -> &str {
        self.host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(&self.host)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `host:port`: what the approval card, the journal and messages name.
    pub fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// `http://host:port`, without credentials: what the target version binds.
    pub fn url(&self) -> String {
        format!("http://{}", self.authority())
    }

    /// Whether the URL carried credentials.
    pub fn has_credentials(&self) -> bool {
        self.auth.is_some()
    }

    /// The `Proxy-Authorization` value; only the CONNECT request is given it.
    pub(crate) fn authorization(&self) -> Option<&str> {
        self.auth.as_ref().map(|a| a.0.as_str())
    }
}

/// `%XX` decoding of a URL userinfo part.
fn percent_decode(s: &str) -> Option<Zeroizing<String>> {
    let bytes = s.as_bytes();
    let mut out = Zeroizing::new(Vec::with_capacity(bytes.len()));
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let text = std::str::from_utf8(&out).ok()?;
    Some(Zeroizing::new(text.to_owned()))
}

/// A target's `proxy` key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ProxySetting {
    /// No `proxy` key: the environment's proxy applies when the file is loaded; until
    /// then (and when none applies) the target connects directly.
    #[default]
    Environment,
    /// `proxy = "none"`: always direct.
    Direct,
    /// Through this proxy: named in the file, or taken from the environment at load.
    Via(Proxy),
}

impl ProxySetting {
    /// Parses the `proxy` value: `"none"` or a proxy URL.
    pub fn parse(text: &str) -> Result<ProxySetting, ProxyProblem> {
        if text.trim().eq_ignore_ascii_case("none") {
            return Ok(ProxySetting::Direct);
        }
        Proxy::parse(text).map(ProxySetting::Via)
    }

    /// The proxy requests go through, if any.
    pub fn via(&self) -> Option<&Proxy> {
        match self {
            ProxySetting::Via(p) => Some(p),
            ProxySetting::Environment | ProxySetting::Direct => None,
        }
    }
}

/// The proxy variables of an environment, read once. `Debug` leaves the values out:
/// they may hold passwords.
#[derive(Clone, Default)]
pub struct ProxyEnv {
    https: Option<(&'static str, Zeroizing<String>)>,
    http: Option<(&'static str, Zeroizing<String>)>,
    no_proxy: NoProxy,
}

impl fmt::Debug for ProxyEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyEnv")
            .field("https", &self.https.as_ref().map(|(name, _)| name))
            .field("http", &self.http.as_ref().map(|(name, _)| name))
            .field("no_proxy", &self.no_proxy)
            .finish()
    }
}

impl ProxyEnv {
    /// This process's environment.
    pub fn from_process() -> ProxyEnv {
        ProxyEnv::from_lookup(|name| std::env::var(name).ok())
    }

    /// The variables as `lookup` answers them (a map in tests). For each, the lowercase
    /// name is read first, as curl does; an empty value counts as unset.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> ProxyEnv {
        let first = |names: [&'static str; 2]| {
            names.into_iter().find_map(|name| {
                lookup(name)
                    .filter(|v| !v.trim().is_empty())
                    .map(|v| (name, Zeroizing::new(v)))
            })
        };
        ProxyEnv {
            https: first(["https_proxy", "HTTPS_PROXY"]),
            http: first(["http_proxy", "HTTP_PROXY"]),
            no_proxy: first(["no_proxy", "NO_PROXY"])
                .map(|(_, v)| NoProxy::parse(&v))
                .unwrap_or_default(),
        }
    }

    /// The proxy for a target of `scheme` on `host`, with the variable it came from:
    /// none for a host `NO_PROXY` excludes (loopback is excluded by the caller). A value
    /// without a scheme is read as `http://`.
    pub fn proxy_for(
        &self,
        scheme: &str,
        host: &str,
    ) -> Option<(&'static str, Result<Proxy, ProxyProblem>)> {
        let (name, value) = match scheme {
            "https" => self.https.as_ref()?,
            "http" => self.http.as_ref()?,
            _ => return None,
        };
        if self.no_proxy.matches(host) {
            return None;
        }
        let value = value.trim();
        let parsed = if value.contains("://") {
            Proxy::parse(value)
        } else {
            Proxy::parse(&Zeroizing::new(format!("http://{value}")))
        };
        Some((name, parsed))
    }
}

/// One `NO_PROXY` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Exclusion {
    /// `*`: every host.
    All,
    /// `example.com`, `.example.com` or `*.example.com`: the domain and every name under it.
    Domain(String),
    /// An IP address.
    Ip(IpAddr),
    /// `10.0.0.0/8`, `fd00::/8`.
    Cidr(IpAddr, u8),
}

/// `NO_PROXY`: a comma-separated list of hosts the environment's proxy is not used for.
/// Entries are matched case-insensitively; a `:port` suffix is ignored (every port of
/// the host is excluded).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NoProxy(Vec<Exclusion>);

impl NoProxy {
    pub fn parse(list: &str) -> NoProxy {
        let entries = list
            .split(',')
            .map(|e| e.trim().to_ascii_lowercase())
            .filter(|e| !e.is_empty())
            .filter_map(|e| Exclusion::parse(&e))
            .collect();
        NoProxy(entries)
    }

    /// Whether `host` (a name, or an IP literal with or without brackets) is excluded.
    pub fn matches(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let unbracketed = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(&host);
        let ip: Option<IpAddr> = unbracketed.parse().ok();
        self.0.iter().any(|e| match e {
            Exclusion::All => true,
            Exclusion::Domain(d) => {
                ip.is_none()
                    && (host == *d
                        || host
                            .strip_suffix(d.as_str())
                            .is_some_and(|rest| rest.ends_with('.')))
            }
            Exclusion::Ip(x) => ip == Some(*x),
            Exclusion::Cidr(net, bits) => ip.is_some_and(|ip| in_cidr(ip, *net, *bits)),
        })
    }
}

impl Exclusion {
    fn parse(entry: &str) -> Option<Exclusion> {
        if entry == "*" {
            return Some(Exclusion::All);
        }
        if let Some((net, bits)) = entry.split_once('/') {
            let net: IpAddr = net.trim_matches(['[', ']']).parse().ok()?;
            let bits: u8 = bits.parse().ok()?;
            let max = if net.is_ipv4() { 32 } else { 128 };
            return (bits <= max).then_some(Exclusion::Cidr(net, bits));
        }
        if let Ok(ip) = entry.trim_matches(['[', ']']).parse::<IpAddr>() {
            return Some(Exclusion::Ip(ip));
        }
        // `[v6]:port` and `host:port`: the port is ignored.
        if let Some(rest) = entry.strip_prefix('[')
            && let Some((ip, _port)) = rest.split_once(']')
        {
            return ip.parse().ok().map(Exclusion::Ip);
        }
        let host = match entry.rsplit_once(':') {
            Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
            _ => entry,
        };
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Some(Exclusion::Ip(ip));
        }
        let domain = host
            .trim_start_matches("*.")
            .trim_start_matches('.')
            .trim_end_matches('.');
        (!domain.is_empty()).then(|| Exclusion::Domain(domain.to_owned()))
    }
}

fn in_cidr(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(ip), IpAddr::V4(net)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            u32::from(ip) & mask == u32::from(net) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(net)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            u128::from(ip) & mask == u128::from(net) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_proxy_matches_hosts_suffixes_addresses_ranges_and_star() {
        let list = NoProxy::parse(
            " Internal.Example ,.corp.test, *.svc.test,10.0.0.0/8, [::1], 192.0.2.7:8080, other.test:443, fd00::/8 ",
        );
        for host in [
            "internal.example",
            "api.internal.example",
            "INTERNAL.EXAMPLE.",
            "corp.test",
            "a.b.corp.test",
            "svc.test",
            "x.svc.test",
            "10.1.2.3",
            "[::1]",
            "::1",
            "192.0.2.7",
            "other.test",
            "fd00::5",
        ] {
            assert!(list.matches(host), "{host} is excluded");
        }
        for host in [
            "notinternal.example",
            "internal.example.org",
            "corp.test.evil",
            "11.0.0.1",
            "192.0.2.8",
            "fe80::1",
            "example",
        ] {
            assert!(!list.matches(host), "{host} is not excluded");
        }
        assert!(NoProxy::parse("*").matches("anything.example"));
        assert!(NoProxy::parse("a, *").matches("10.0.0.1"));
        assert!(!NoProxy::parse("").matches("localhost"));
        assert!(!NoProxy::parse(" , ,").matches("example.com"));
        // A domain entry never matches an IP literal, and a bad range is ignored.
        assert!(!NoProxy::parse("1").matches("10.0.0.1"));
        assert!(!NoProxy::parse("10.0.0.0/40").matches("10.0.0.1"));
        assert!(NoProxy::parse("0.0.0.0/0").matches("203.0.113.9"));
    }

    #[test]
    fn proxy_urls_parse_with_credentials_kept_out_of_what_is_shown() {
        let p = Proxy::parse("http://us%40er:p%3Ass@Proxy.Corp.Test:3128/").unwrap();
        assert_eq!(p.authority(), "proxy.corp.test:3128");
        assert_eq!(p.url(), "http://proxy.corp.test:3128");
        let expected = base64::engine::general_purpose::STANDARD.encode("us@er:p:ss");
        assert_eq!(
            p.authorization(),
            Some(format!("Basic {expected}").as_str())
        );
        let shown = format!("{p:?}");
        assert!(
            !shown.contains("p:ss") && !shown.contains(&expected),
            "{shown}"
        );
        assert!(shown.contains("<redacted>"));

        let v6 = Proxy::parse("http://[::1]:8080").unwrap();
        assert_eq!((v6.host(), v6.authority().as_str()), ("::1", "[::1]:8080"));
        assert_eq!(Proxy::parse("http://proxy").unwrap().port(), 80);
        assert!(
            Proxy::parse("http://proxy:1")
                .unwrap()
                .authorization()
                .is_none()
        );

        for (text, problem) in [
            ("https://proxy:443", ProxyProblem::UnsupportedScheme),
            ("socks5://proxy:1080", ProxyProblem::UnsupportedScheme),
            ("proxy:3128", ProxyProblem::UnsupportedScheme),
            ("not a url", ProxyProblem::NotAUrl),
            ("http://proxy:3128/path", ProxyProblem::PathQueryOrFragment),
            ("http://proxy:3128/?q", ProxyProblem::PathQueryOrFragment),
            ("http://a%3Ab:pw@proxy:3128", ProxyProblem::ColonInUser),
            ("http://u:%ff@proxy:3128", ProxyProblem::InvalidUserinfo),
        ] {
            assert_eq!(Proxy::parse(text), Err(problem), "{text}");
        }
        assert_eq!(ProxySetting::parse(" None "), Ok(ProxySetting::Direct));
    }

    #[test]
    fn the_environment_is_read_lowercase_first_and_filtered_by_no_proxy() {
        let vars = [
            ("HTTPS_PROXY", "http://upper:1"),
            ("https_proxy", "lower:2"),
            ("HTTP_PROXY", "http://plain:3"),
            ("NO_PROXY", "skip.test"),
        ];
        let env = ProxyEnv::from_lookup(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        });
        let (name, proxy) = env.proxy_for("https", "api.test").unwrap();
        assert_eq!(
            (name, proxy.unwrap().authority()),
            ("https_proxy", "lower:2".into())
        );
        let (name, proxy) = env.proxy_for("http", "api.test").unwrap();
        assert_eq!(
            (name, proxy.unwrap().authority()),
            ("HTTP_PROXY", "plain:3".into())
        );
        assert!(env.proxy_for("https", "a.skip.test").is_none());
        assert!(ProxyEnv::default().proxy_for("https", "api.test").is_none());
        let shown = format!("{env:?}");
        assert!(
            !shown.contains("upper:1") && !shown.contains("lower:2"),
            "{shown}"
        );
        // An empty value is unset.
        let empty = ProxyEnv::from_lookup(|name| (name == "https_proxy").then(String::new));
        assert!(empty.proxy_for("https", "api.test").is_none());
    }
}
