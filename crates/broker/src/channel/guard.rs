//! The resolved-address guard: after DNS and before any TCP connect, every address a
//! target's host resolved to is checked, and a credential is never sent to a cloud
//! metadata service, a link-local address, or an internal (loopback, private, CGNAT,
//! unique-local) address the operator did not configure.
//!
//! The threat: an agent that can influence name resolution, or a target whose DNS is
//! hijacked or rebound, must not be able to point an authenticated request at
//! `169.254.169.254` or at a host on the broker's own network. The check runs on the
//! addresses the connection is then made to (the HTTP resolver hook and the SSH connect
//! take exactly the checked list), so a second lookup cannot slip a different answer in
//! between check and connect.
//!
//! The rules, per address (IPv4-mapped, IPv4-compatible and NAT64 `64:ff9b::/96` forms
//! are judged as the IPv4 address they carry):
//!
//! - cloud metadata endpoints and unusable addresses (unspecified, broadcast,
//!   multicast): always refused, whatever the target says;
//! - public: allowed;
//! - with `allow_private = true` on the target: everything else is allowed;
//! - loopback: allowed when the configured host is itself `localhost` or a loopback
//!   literal; a public name that resolves to loopback is refused;
//! - private ranges (10/8, 172.16/12, 192.168/16, 100.64/10, 198.18/15, fc00::/7,
//!   fec0::/10): allowed when the configured host is an IP literal (the operator wrote
//!   that address), refused when a name resolved to them;
//! - link-local (169.254/16, fe80::/10): refused.
//!
//! A name is refused whole when any of its addresses is refused: a mixed answer is what
//! a rebinding attempt looks like, and connecting to "the other" address would make the
//! outcome depend on which the stack tried first.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, RwLock};

/// What kind of address an IP is, as the guard judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressClass {
    Public,
    Loopback,
    /// RFC 1918, CGNAT (RFC 6598), benchmarking (RFC 2544), unique-local (RFC 4193),
    /// site-local (deprecated, RFC 3879).
    Private,
    /// RFC 3927 / RFC 4291 §2.5.6.
    LinkLocal,
    /// A well-known cloud metadata or platform endpoint.
    Metadata,
    /// Unspecified, broadcast or multicast: never a peer.
    Unusable,
}

impl AddressClass {
    fn describe(self) -> &'static str {
        match self {
            AddressClass::Public => "public",
            AddressClass::Loopback => "loopback",
            AddressClass::Private => "private-network",
            AddressClass::LinkLocal => "link-local",
            AddressClass::Metadata => "cloud metadata",
            AddressClass::Unusable => "unspecified, broadcast or multicast",
        }
    }
}

/// Instance metadata and platform endpoints of the common clouds: AWS IMDS and ECS/EKS
/// credential endpoints, GCP, Azure (IMDS and WireServer), Oracle, Alibaba,
/// DigitalOcean, OpenStack.
const METADATA_V4: &[Ipv4Addr] = &[
    Ipv4Addr::new(169, 254, 169, 254),
    Ipv4Addr::new(169, 254, 170, 2),
    Ipv4Addr::new(169, 254, 170, 23),
    Ipv4Addr::new(168, 63, 129, 16),
    Ipv4Addr::new(100, 100, 100, 200),
    Ipv4Addr::new(192, 0, 0, 192),
];
/// AWS IMDS and EKS pod identity over IPv6.
const METADATA_V6: &[Ipv6Addr] = &[
    Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254),
    Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0023),
];

fn classify_v4(ip: Ipv4Addr) -> AddressClass {
    let [a, b, ..] = ip.octets();
    if METADATA_V4.contains(&ip) {
        AddressClass::Metadata
    } else if a == 0 || ip.is_broadcast() || ip.is_multicast() {
        // 0.0.0.0/8 "this network": connecting to it reaches the local host on Linux.
        AddressClass::Unusable
    } else if ip.is_loopback() {
        AddressClass::Loopback
    } else if ip.is_link_local() {
        AddressClass::LinkLocal
    } else if ip.is_private()
        || (a == 100 && (64..128).contains(&b))
        || (a == 198 && (b == 18 || b == 19))
    {
        AddressClass::Private
    } else {
        AddressClass::Public
    }
}

/// The IPv4 address an IPv6 address carries: IPv4-mapped (`::ffff:a.b.c.d`),
/// IPv4-compatible (`::a.b.c.d`, deprecated) or the NAT64 well-known prefix (RFC 6052).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = ip.segments();
    let low = Ipv4Addr::new(
        (s[6] >> 8) as u8,
        (s[6] & 0xff) as u8,
        (s[7] >> 8) as u8,
        (s[7] & 0xff) as u8,
    );
    let compatible = s[..6] == [0; 6] && !ip.is_unspecified() && !ip.is_loopback();
    let nat64 = s[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
    (compatible || nat64).then_some(low)
}

/// The class of `ip`.
pub fn classify(ip: IpAddr) -> AddressClass {
    let v6 = match ip {
        IpAddr::V4(v4) => return classify_v4(v4),
        IpAddr::V6(v6) => v6,
    };
    if let Some(v4) = embedded_v4(v6) {
        return classify_v4(v4);
    }
    let first = v6.segments()[0];
    if METADATA_V6.contains(&v6) {
        AddressClass::Metadata
    } else if v6.is_unspecified() || v6.is_multicast() {
        AddressClass::Unusable
    } else if v6.is_loopback() {
        AddressClass::Loopback
    } else if first & 0xffc0 == 0xfe80 {
        AddressClass::LinkLocal
    } else if first & 0xfe00 == 0xfc00 || first & 0xffc0 == 0xfec0 {
        AddressClass::Private
    } else {
        AddressClass::Public
    }
}

/// What a target allows, judged from its configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressPolicy {
    /// The target's `allow_private = true`.
    pub allow_private: bool,
    /// The configured host is `localhost` or a loopback literal.
    pub loopback_host: bool,
    /// The configured host is an IP literal.
    pub literal: bool,
}

impl AddressPolicy {
    /// The policy for a configured `host` (a name, an IPv4 literal or an IPv6 literal,
    /// bracketed or not).
    pub fn for_host(host: &str, allow_private: bool) -> AddressPolicy {
        let literal = parse_literal(host);
        AddressPolicy {
            allow_private,
            loopback_host: host.eq_ignore_ascii_case("localhost")
                || literal.is_some_and(|ip| classify(ip) == AddressClass::Loopback),
            literal: literal.is_some(),
        }
    }

    /// The policy for a proxy the operator configured (or the broker's environment
    /// named): a proxy commonly sits on the internal network, so loopback and private
    /// addresses are allowed; metadata and link-local addresses are not.
    pub fn for_proxy() -> AddressPolicy {
        AddressPolicy {
            allow_private: false,
            loopback_host: true,
            literal: true,
        }
    }

    /// Whether a connection to `ip` is allowed.
    pub fn check(&self, ip: IpAddr) -> Result<(), Refusal> {
        let class = classify(ip);
        let allowed = match class {
            AddressClass::Metadata | AddressClass::Unusable => false,
            AddressClass::Public => true,
            _ if self.allow_private => true,
            AddressClass::Loopback => self.loopback_host,
            AddressClass::Private => self.literal,
            AddressClass::LinkLocal => false,
        };
        if allowed {
            Ok(())
        } else {
            Err(Refusal { address: ip, class })
        }
    }
}

/// `host` as an IP literal (IPv6 with or without brackets).
pub fn parse_literal(host: &str) -> Option<IpAddr> {
    let unbracketed = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    unbracketed.parse().ok()
}

/// An address the guard refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{address} is a {} address", class.describe())]
pub struct Refusal {
    pub address: IpAddr,
    pub class: AddressClass,
}

impl Refusal {
    /// What the agent and the journal are told (no secret in it: the address is what
    /// the broker's own resolver answered).
    pub fn message(&self) -> String {
        let hint = match self.class {
            AddressClass::Metadata | AddressClass::Unusable => "; no configuration allows it",
            _ => "; set allow_private = true on the target if this is intended",
        };
        format!(
            "The target's host resolved to {self}, which Postern refuses to connect to{hint}. Nothing was sent."
        )
    }
}

/// Why a checked lookup gave no addresses.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("{0}")]
    Dns(String),
    #[error(transparent)]
    Refused(Refusal),
}

/// Where a host's addresses come from: the system resolver, optionally behind a
/// hosts-style map. The map is set only by code that builds a channel
/// ([`Resolver::with_hosts`]), never from the targets file or an agent's request: tests
/// use it to make a name resolve to a metadata address without touching real DNS.
#[derive(Debug, Clone, Default)]
pub struct Resolver {
    hosts: Option<Arc<RwLock<HostsMap>>>,
}

/// Lowercase name → the addresses it resolves to.
type HostsMap = HashMap<String, Vec<IpAddr>>;

impl Resolver {
    /// The system resolver.
    pub fn system() -> Resolver {
        Resolver::default()
    }

    /// The system resolver, except that the names in `hosts` (case-insensitive) resolve
    /// to the given addresses.
    pub fn with_hosts<I, S>(hosts: I) -> Resolver
    where
        I: IntoIterator<Item = (S, Vec<IpAddr>)>,
        S: AsRef<str>,
    {
        let map = hosts
            .into_iter()
            .map(|(name, addrs)| (name.as_ref().to_ascii_lowercase(), addrs))
            .collect();
        Resolver {
            hosts: Some(Arc::new(RwLock::new(map))),
        }
    }

    /// Changes what `name` resolves to in a resolver made by [`Resolver::with_hosts`]
    /// (and its clones), as a rebinding name server would; returns false for the
    /// system resolver, which has no map.
    pub fn set_host(&self, name: &str, addrs: Vec<IpAddr>) -> bool {
        let Some(hosts) = &self.hosts else {
            return false;
        };
        match hosts.write() {
            Ok(mut map) => {
                map.insert(name.to_ascii_lowercase(), addrs);
                true
            }
            Err(_) => false,
        }
    }

    /// Every address of `host` (an IP literal is its own answer).
    pub async fn lookup(&self, host: &str) -> Result<Vec<IpAddr>, LookupError> {
        if let Some(ip) = parse_literal(host) {
            return Ok(vec![ip]);
        }
        let mapped = self
            .hosts
            .as_ref()
            .and_then(|h| h.read().ok()?.get(&host.to_ascii_lowercase()).cloned());
        if let Some(addrs) = mapped {
            return match addrs.is_empty() {
                true => Err(LookupError::Dns(format!("{host}: no addresses"))),
                false => Ok(addrs),
            };
        }
        let addrs: Vec<IpAddr> = tokio::net::lookup_host((host, 0))
            .await
            .map_err(|e| LookupError::Dns(e.to_string()))?
            .map(|a| a.ip())
            .collect();
        if addrs.is_empty() {
            return Err(LookupError::Dns(format!("{host}: no addresses")));
        }
        Ok(addrs)
    }

    /// [`Resolver::lookup`], then every address checked against `policy`: the list
    /// returned is what the caller must connect to, and nothing else.
    pub async fn lookup_checked(
        &self,
        host: &str,
        policy: AddressPolicy,
    ) -> Result<Vec<IpAddr>, LookupError> {
        let addrs = self.lookup(host).await?;
        for ip in &addrs {
            policy.check(*ip).map_err(LookupError::Refused)?;
        }
        Ok(addrs)
    }

    /// The addresses `host` resolves to now, for an approval card: each address, and
    /// the guard's refusal beside any it would refuse at connect time.
    pub async fn describe(&self, host: &str, policy: AddressPolicy) -> String {
        match self.lookup(host).await {
            Ok(addrs) => addrs
                .iter()
                .map(|ip| match policy.check(*ip) {
                    Ok(()) => ip.to_string(),
                    Err(r) => format!("{ip} (refused: {} address)", r.class.describe()),
                })
                .collect::<Vec<_>>()
                .join(", "),
            Err(e) => format!("does not resolve now ({e})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn metadata_link_local_and_private_ranges_are_classified_in_every_form() {
        for (addr, class) in [
            ("169.254.169.254", AddressClass::Metadata),
            ("::ffff:169.254.169.254", AddressClass::Metadata),
            ("::169.254.169.254", AddressClass::Metadata),
            ("64:ff9b::a9fe:a9fe", AddressClass::Metadata),
            ("fd00:ec2::254", AddressClass::Metadata),
            ("100.100.100.200", AddressClass::Metadata),
            ("169.254.1.1", AddressClass::LinkLocal),
            ("fe80::1", AddressClass::LinkLocal),
            ("10.1.2.3", AddressClass::Private),
            ("172.31.0.1", AddressClass::Private),
            ("192.168.0.1", AddressClass::Private),
            ("100.64.0.1", AddressClass::Private),
            ("::ffff:10.0.0.1", AddressClass::Private),
            ("fc00::1", AddressClass::Private),
            ("fd12:3456::1", AddressClass::Private),
            ("127.0.0.1", AddressClass::Loopback),
            ("::1", AddressClass::Loopback),
            ("::ffff:127.0.0.1", AddressClass::Loopback),
            ("0.0.0.0", AddressClass::Unusable),
            ("::", AddressClass::Unusable),
            ("224.0.0.1", AddressClass::Unusable),
            ("172.32.0.1", AddressClass::Public),
            ("100.128.0.1", AddressClass::Public),
            ("93.184.216.34", AddressClass::Public),
            ("2606:4700::1", AddressClass::Public),
        ] {
            assert_eq!(classify(ip(addr)), class, "{addr}");
        }
    }

    #[test]
    fn a_name_may_not_reach_internal_addresses_but_the_operators_literals_may() {
        let name = AddressPolicy::for_host("api.example.test", false);
        assert!(name.check(ip("93.184.216.34")).is_ok());
        for refused in ["127.0.0.1", "10.0.0.1", "169.254.1.1", "169.254.169.254"] {
            assert!(name.check(ip(refused)).is_err(), "{refused}");
        }
        let localhost = AddressPolicy::for_host("LOCALHOST", false);
        assert!(localhost.check(ip("127.0.0.1")).is_ok());
        assert!(localhost.check(ip("::1")).is_ok());
        assert!(localhost.check(ip("10.0.0.1")).is_err());
        let private_literal = AddressPolicy::for_host("10.0.0.5", false);
        assert!(private_literal.check(ip("10.0.0.5")).is_ok());
        let v6_loopback = AddressPolicy::for_host("[::1]", false);
        assert!(v6_loopback.check(ip("::1")).is_ok());
        let link_local = AddressPolicy::for_host("169.254.10.10", false);
        assert!(link_local.check(ip("169.254.10.10")).is_err());
        let allowed = AddressPolicy::for_host("internal.example.test", true);
        for ok in ["127.0.0.1", "10.0.0.1", "169.254.1.1", "fe80::1"] {
            assert!(allowed.check(ip(ok)).is_ok(), "{ok}");
        }
        // Nothing opens the metadata service.
        for never in ["169.254.169.254", "::ffff:169.254.169.254", "fd00:ec2::254"] {
            assert_eq!(
                allowed.check(ip(never)).map_err(|r| r.class),
                Err(AddressClass::Metadata)
            );
        }
    }

    #[tokio::test]
    async fn a_name_with_any_refused_address_is_refused_whole() {
        let resolver = Resolver::with_hosts([(
            "Mixed.Example.Test",
            vec![ip("93.184.216.34"), ip("169.254.169.254")],
        )]);
        let policy = AddressPolicy::for_host("mixed.example.test", true);
        match resolver.lookup_checked("mixed.example.test", policy).await {
            Err(LookupError::Refused(r)) => assert_eq!(r.address, ip("169.254.169.254")),
            other => panic!("{other:?}"),
        }
        let card = resolver.describe("mixed.example.test", policy).await;
        assert_eq!(
            card,
            "93.184.216.34, 169.254.169.254 (refused: cloud metadata address)"
        );
    }
}
