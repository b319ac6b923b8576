//! Target resolution: which configured target a request names, by URL (same origin,
//! longest path prefix on a segment boundary), by ssh host or by name.

use url::Url;

use super::ssh::normalize_ssh_host;
use super::{Config, HttpTarget, ResolveError, SshTarget, Target};
use crate::canonical::normalize_path;

impl Config {
    /// The target a URL falls under: same scheme, host and effective port, and the
    /// target's path prefix matches on a segment boundary. The longest prefix wins.
    pub fn resolve_http(&self, url: &Url) -> Result<&HttpTarget, ResolveError> {
        let path = normalize_path(url.path()).map_err(|reason| ResolveError::MalformedUrl {
            reason: reason.to_owned(),
        })?;
        self.resolve_parts(
            url.scheme(),
            url.host_str(),
            url.port_or_known_default(),
            &path,
        )
        .ok_or_else(|| ResolveError::NoHttpTarget {
            url: url.as_str().to_owned(),
        })
    }

    pub(crate) fn resolve_parts(
        &self,
        scheme: &str,
        host: Option<&str>,
        port: Option<u16>,
        path: &str,
    ) -> Option<&HttpTarget> {
        let host = host?;
        self.http
            .iter()
            .filter(|t| {
                t.base_url.scheme() == scheme
                    && t.base_url.host_str() == Some(host)
                    && t.base_url.port_or_known_default() == port
                    && prefix_matches(t.base_url.path(), path)
            })
            .max_by_key(|t| t.base_url.path().len())
    }

    /// An ssh target by name, or else by host. A host shared by several targets is
    /// ambiguous: the caller must use the target name.
    pub fn resolve_ssh(&self, host_or_name: &str) -> Result<&SshTarget, ResolveError> {
        if let Some(t) = self.ssh.iter().find(|t| t.name == host_or_name) {
            return Ok(t);
        }
        let wanted = normalize_ssh_host(host_or_name);
        let matches: Vec<&SshTarget> = self
            .ssh
            .iter()
            .filter(|t| Some(&t.host) == wanted.as_ref())
            .collect();
        match matches.as_slice() {
            [one] => Ok(one),
            [] => Err(ResolveError::NoSshTarget {
                host: host_or_name.to_owned(),
            }),
            many => Err(ResolveError::AmbiguousSshHost {
                host: host_or_name.to_owned(),
                names: many.iter().map(|t| t.name.clone()).collect(),
            }),
        }
    }

    /// An http target by name.
    pub fn http_target(&self, name: &str) -> Option<&HttpTarget> {
        self.http.iter().find(|t| t.name == name)
    }

    /// An ssh target by name.
    pub fn ssh_target(&self, name: &str) -> Option<&SshTarget> {
        self.ssh.iter().find(|t| t.name == name)
    }

    /// A target of either kind by name (names are unique across kinds).
    pub fn target(&self, name: &str) -> Option<Target<'_>> {
        self.http_target(name)
            .map(Target::Http)
            .or_else(|| self.ssh_target(name).map(Target::Ssh))
    }
}

/// `/v1` matches `/v1` and `/v1/x` but not `/v10`; `/` matches every path.
fn prefix_matches(prefix: &str, path: &str) -> bool {
    if prefix == "/" {
        return true;
    }
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

pub(super) fn same_prefix(a: &HttpTarget, b: &HttpTarget) -> bool {
    a.base_url.scheme() == b.base_url.scheme()
        && a.base_url.host_str() == b.base_url.host_str()
        && a.base_url.port_or_known_default() == b.base_url.port_or_known_default()
        && a.base_url.path() == b.base_url.path()
}

pub(crate) fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}
