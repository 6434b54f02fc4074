//! An endpoint URL (`http://127.0.0.1:2379`, `https://etcd-1:2379`, `http://[::1]:2379`)
//! checked once, when the client is made: what to connect to, what to send as `Host`, and
//! (https) the name the server's certificate must hold. No path, no user info, a port always:
//! etcd's gateway lives at the root, and a guessed default port would hide a typo.

use rustls_pki_types::ServerName;

use crate::error::EtcdError;

/// One member's client URL, parsed.
#[derive(Debug, Clone)]
pub(crate) struct Endpoint {
    /// The URL as given, without a trailing `/`: what errors name.
    pub url: String,
    /// `host:port` (`[v6]:port`): what is connected to and sent as `Host`.
    pub authority: String,
    /// The name the server certificate must be valid for; `Some` exactly for https.
    pub server_name: Option<ServerName<'static>>,
}

/// Parses `url`; `tls` says whether TLS files were given, which must match the scheme.
pub(crate) fn parse(url: &str, tls: bool) -> Result<Endpoint, EtcdError> {
    let bad = |why: &str| EtcdError::Config(format!("endpoint {url:?}: {why}"));
    let trimmed = url.trim_end_matches('/');
    let (https, rest) = if let Some(r) = trimmed.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = trimmed.strip_prefix("http://") {
        (false, r)
    } else {
        return Err(bad("must start with http:// or https://"));
    };
    if https && !tls {
        return Err(bad("https needs TLS files (EtcdOptions::tls)"));
    }
    if !https && tls {
        return Err(bad("TLS files are given but this endpoint is plain http"));
    }
    if rest.contains(['/', '@', '?', '#']) {
        return Err(bad(
            "only scheme://host:port is accepted (no path or user info)",
        ));
    }
    let host = split_host_port(rest).map_err(|why| bad(&why))?;
    let server_name = if https {
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| bad(&format!("host is not a certificate name: {e}")))?;
        Some(name)
    } else {
        None
    };
    Ok(Endpoint {
        url: trimmed.to_owned(),
        authority: rest.to_owned(),
        server_name,
    })
}

/// The host of `authority` (`host:port` or `[v6]:port`), brackets removed; the port must be
/// a non-zero number.
fn split_host_port(authority: &str) -> Result<&str, String> {
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| "unclosed '[' in an IPv6 host".to_owned())?;
        let port = after
            .strip_prefix(':')
            .ok_or_else(|| "a port is required (host:port)".to_owned())?;
        (host, port)
    } else {
        authority
            .rsplit_once(':')
            .ok_or_else(|| "a port is required (host:port)".to_owned())?
    };
    if host.is_empty() {
        return Err("empty host".to_owned());
    }
    match port.parse::<u16>() {
        Ok(p) if p != 0 => Ok(host),
        _ => Err(format!("bad port {port:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_tls_and_v6_endpoints() {
        let e = parse("http://127.0.0.1:2379/", false).unwrap();
        assert_eq!(
            (e.url.as_str(), e.authority.as_str()),
            ("http://127.0.0.1:2379", "127.0.0.1:2379")
        );
        assert!(e.server_name.is_none());
        let e = parse("https://localhost:2379", true).unwrap();
        assert!(matches!(e.server_name, Some(ServerName::DnsName(_))));
        let e = parse("https://[::1]:2379", true).unwrap();
        assert!(matches!(e.server_name, Some(ServerName::IpAddress(_))));
        assert_eq!(e.authority, "[::1]:2379");
    }

    #[test]
    fn refuses_what_would_hide_a_mistake() {
        for (url, tls) in [
            ("127.0.0.1:2379", false),
            ("http://127.0.0.1", false),
            ("http://127.0.0.1:0", false),
            ("http://127.0.0.1:x", false),
            ("http://:2379", false),
            ("http://127.0.0.1:2379/v3", false),
            ("http://u@127.0.0.1:2379", false),
            ("https://127.0.0.1:2379", false),
            ("http://127.0.0.1:2379", true),
            ("https://[::1:2379", true),
        ] {
            let r = parse(url, tls);
            assert!(
                matches!(r, Err(EtcdError::Config(_))),
                "{url} tls={tls}: {r:?}"
            );
        }
    }
}
