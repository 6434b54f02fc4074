//! `metrics_web_config`: the web configuration file Prometheus exporters read
//! (exporter-toolkit's `web.yml`, `--web.config.file`), so the file an operator keeps for
//! node_exporter secures roost's metrics listener unchanged. It holds `tls_server_config`
//! (`cert_file`, `key_file`, optional `client_ca_file` with `client_auth_type`,
//! `min_version`, `max_version`) and `basic_auth_users` (user: bcrypt hash). Relative paths
//! are taken from the file's own directory, as exporter-toolkit does. A key roost does not
//! implement (`cipher_suites`, `http_server_config`, inline `cert`, ...) is refused by name,
//! never ignored: a file that asks for more than roost does must not start an endpoint that
//! does less. Every failure is a [`ConfigError`] (exit 78) naming the file and the key.
//! Parsing only: the TLS files are read by `web_tls.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use yaml_rust2::{Yaml, YamlLoader};

use crate::config::ConfigError;

/// The parsed file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WebConfig {
    /// `tls_server_config`; `None` when absent or empty (plain HTTP, as exporter-toolkit).
    pub tls: Option<TlsFiles>,
    /// `basic_auth_users`: user name to bcrypt hash; empty means no authentication.
    pub users: BTreeMap<String, String>,
}

/// `tls_server_config`, its paths resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub client_ca_file: Option<PathBuf>,
    pub client_auth: ClientAuth,
    /// TLS 1.3 only (`min_version: TLS13` or ...) or 1.2 only (`max_version: TLS12`).
    pub versions: Versions,
}

/// `client_auth_type`, of the values Go's `crypto/tls` names, those that verify a
/// certificate it is given (rustls verifies what it accepts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientAuth {
    NoClientCert,
    VerifyClientCertIfGiven,
    RequireAndVerifyClientCert,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Versions {
    Tls12And13,
    Tls12Only,
    Tls13Only,
}

/// Keys exporter-toolkit has that roost refuses rather than ignores.
const UNSUPPORTED: &str = "roost implements cert_file, key_file, client_ca_file, client_auth_type, min_version, max_version and basic_auth_users";

impl WebConfig {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<WebConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        WebConfig::parse(&text, dir).map_err(|detail| ConfigError::Parse {
            path: path.to_path_buf(),
            detail: format!("metrics_web_config: {detail}"),
        })
    }

    /// Parses a file's text; relative paths are joined to `dir`.
    pub fn parse(text: &str, dir: &Path) -> Result<WebConfig, String> {
        let docs = YamlLoader::load_from_str(text).map_err(|e| e.to_string())?;
        let mut web = WebConfig::default();
        let root = match docs.as_slice() {
            [] | [Yaml::Null] => return Ok(web),
            [doc] => doc,
            _ => return Err("more than one YAML document".into()),
        };
        for (key, value) in mapping(root, "the file")? {
            match key.as_str() {
                "tls_server_config" => web.tls = tls_files(value, dir)?,
                "basic_auth_users" => web.users = users(value)?,
                other => return Err(format!("{other}: not supported ({UNSUPPORTED})")),
            }
        }
        Ok(web)
    }
}

/// A mapping's entries with string keys, in file order (`Null` is an empty mapping).
fn mapping<'a>(y: &'a Yaml, what: &str) -> Result<Vec<(String, &'a Yaml)>, String> {
    match y {
        Yaml::Null => Ok(Vec::new()),
        Yaml::Hash(h) => h
            .iter()
            .map(|(k, v)| match k {
                Yaml::String(s) => Ok((s.clone(), v)),
                other => Err(format!("{what}: key {other:?} is not a string")),
            })
            .collect(),
        other => Err(format!("{what}: expected a mapping, found {other:?}")),
    }
}

fn string(y: &Yaml, key: &str) -> Result<String, String> {
    match y {
        Yaml::String(s) if !s.is_empty() => Ok(s.clone()),
        other => Err(format!(
            "{key}: expected a non-empty string, found {other:?}"
        )),
    }
}

/// `tls_server_config`; `None` when it sets nothing.
fn tls_files(y: &Yaml, dir: &Path) -> Result<Option<TlsFiles>, String> {
    let mut fields: BTreeMap<String, String> = BTreeMap::new();
    for (key, value) in mapping(y, "tls_server_config")? {
        let name = format!("tls_server_config.{key}");
        match key.as_str() {
            // Go ignores it since 1.18 (the server's preference is decided by the library).
            "prefer_server_cipher_suites" => {}
            "cert_file" | "key_file" | "client_ca_file" | "client_auth_type" | "min_version"
            | "max_version" => {
                fields.insert(key, string(value, &name)?);
            }
            _ => return Err(format!("{name}: not supported ({UNSUPPORTED})")),
        }
    }
    if fields.is_empty() {
        return Ok(None);
    }
    let path = |key: &str| fields.get(key).map(|p| dir.join(p));
    let (Some(cert_file), Some(key_file)) = (path("cert_file"), path("key_file")) else {
        return Err(
            "tls_server_config needs both cert_file and key_file (or neither, for plain HTTP)"
                .into(),
        );
    };
    let client_ca_file = path("client_ca_file");
    let client_auth = client_auth(fields.get("client_auth_type").map(String::as_str))?;
    match (&client_ca_file, client_auth) {
        (Some(_), ClientAuth::NoClientCert) => {
            return Err("tls_server_config.client_ca_file is set without a client_auth_type that verifies (VerifyClientCertIfGiven or RequireAndVerifyClientCert)".into())
        }
        (None, ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert) => {
            return Err("tls_server_config.client_auth_type verifies client certificates: it needs client_ca_file".into())
        }
        _ => {}
    }
    Ok(Some(TlsFiles {
        cert_file,
        key_file,
        client_ca_file,
        client_auth,
        versions: versions(fields.get("min_version"), fields.get("max_version"))?,
    }))
}

fn client_auth(value: Option<&str>) -> Result<ClientAuth, String> {
    match value {
        None | Some("NoClientCert") => Ok(ClientAuth::NoClientCert),
        Some("VerifyClientCertIfGiven") => Ok(ClientAuth::VerifyClientCertIfGiven),
        Some("RequireAndVerifyClientCert") => Ok(ClientAuth::RequireAndVerifyClientCert),
        Some(v @ ("RequestClientCert" | "RequireAnyClientCert" | "RequireClientCert")) => Err(format!(
            "tls_server_config.client_auth_type: {v} accepts a client certificate without verifying it; roost does not (use VerifyClientCertIfGiven or RequireAndVerifyClientCert with client_ca_file)"
        )),
        Some(v) => Err(format!("tls_server_config.client_auth_type: unknown value {v:?}")),
    }
}

/// `min_version` and `max_version` (TLS12 or TLS13: rustls has nothing older).
fn versions(min: Option<&String>, max: Option<&String>) -> Result<Versions, String> {
    let level = |key: &str, v: Option<&String>, default: u8| {
        match v.map(String::as_str) {
        None => Ok(default),
        Some("TLS12") => Ok(12),
        Some("TLS13") => Ok(13),
        Some(other) => Err(format!(
            "tls_server_config.{key}: {other:?} is not TLS12 or TLS13 (older versions are not offered)"
        )),
    }
    };
    match (
        level("min_version", min, 12)?,
        level("max_version", max, 13)?,
    ) {
        (12, 13) => Ok(Versions::Tls12And13),
        (12, 12) => Ok(Versions::Tls12Only),
        (13, 13) => Ok(Versions::Tls13Only),
        _ => Err("tls_server_config.min_version is above max_version".into()),
    }
}

/// `basic_auth_users`: each value a bcrypt hash (`$2a$`, `$2b$`, `$2y$`, 60 characters),
/// checked for its form here so a plain-text password is refused at start.
fn users(y: &Yaml) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (user, value) in mapping(y, "basic_auth_users")? {
        let key = format!("basic_auth_users.{user}");
        let hash = string(value, &key)?;
        if user.is_empty() || user.contains(':') {
            return Err(format!("{key}: a user name must be non-empty without ':'"));
        }
        if !is_bcrypt(&hash) {
            return Err(format!("{key}: not a bcrypt hash ($2y$10$... as `htpasswd -nBC 10 \"\" | tr -d ':\\n'` prints)"));
        }
        out.insert(user, hash);
    }
    Ok(out)
}

fn is_bcrypt(hash: &str) -> bool {
    let b = hash.as_bytes();
    hash.len() == 60
        && ["$2a$", "$2b$", "$2y$"].iter().any(|p| hash.starts_with(p))
        && b[4].is_ascii_digit()
        && b[5].is_ascii_digit()
        && b[6] == b'$'
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi";

    fn parse(text: &str) -> Result<WebConfig, String> {
        WebConfig::parse(text, Path::new("/etc/roost"))
    }

    /// Goal: exporter-toolkit's own example file parses, its relative paths taken from the
    /// file's directory; an empty file is plain HTTP without authentication.
    #[test]
    fn an_exporter_toolkit_file_parses() {
        let text = format!(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: /abs/server.key\n  client_ca_file: ca.pem\n  client_auth_type: RequireAndVerifyClientCert\n  min_version: TLS13\n  prefer_server_cipher_suites: true\nbasic_auth_users:\n  prometheus: {HASH}\n"
        );
        let web = parse(&text).expect("valid");
        let tls = web.tls.expect("TLS");
        assert_eq!(tls.cert_file, Path::new("/etc/roost/server.crt"));
        assert_eq!(tls.key_file, Path::new("/abs/server.key"));
        assert_eq!(
            tls.client_ca_file.as_deref(),
            Some(Path::new("/etc/roost/ca.pem"))
        );
        assert_eq!(tls.client_auth, ClientAuth::RequireAndVerifyClientCert);
        assert_eq!(tls.versions, Versions::Tls13Only);
        assert_eq!(web.users.get("prometheus").map(String::as_str), Some(HASH));
        assert_eq!(parse("").expect("empty"), WebConfig::default());
        assert_eq!(
            parse("tls_server_config:\n").expect("no TLS"),
            WebConfig::default()
        );
    }

    /// Goal: what roost would not honour is refused by name, never ignored.
    #[test]
    fn what_roost_does_not_do_is_refused_by_name() {
        let tls = "tls_server_config:\n  cert_file: a\n  key_file: b\n";
        let bad = [
            (
                "tls_server_config:\n  cert_file: a\n",
                "both cert_file and key_file",
            ),
            (
                &format!("{tls}  cipher_suites: [TLS_AES_128_GCM_SHA256]\n"),
                "tls_server_config.cipher_suites: not supported",
            ),
            (
                &format!("{tls}  client_auth_type: RequireAnyClientCert\n"),
                "without verifying",
            ),
            (
                &format!("{tls}  client_auth_type: RequireAndVerifyClientCert\n"),
                "needs client_ca_file",
            ),
            (
                &format!("{tls}  client_ca_file: ca.pem\n"),
                "without a client_auth_type",
            ),
            (
                &format!("{tls}  min_version: TLS11\n"),
                "not TLS12 or TLS13",
            ),
            (
                &format!("{tls}  min_version: TLS13\n  max_version: TLS12\n"),
                "above max_version",
            ),
            (
                "http_server_config:\n  http2: false\n",
                "http_server_config: not supported",
            ),
            (
                "basic_auth_users:\n  prometheus: secret\n",
                "not a bcrypt hash",
            ),
            ("basic_auth_users: [a]\n", "expected a mapping"),
            ("tls_server_config: [\n", "while parsing"),
        ];
        for (text, needle) in bad {
            let e = parse(text).expect_err(text);
            assert!(e.contains(needle), "{needle:?} not in {e:?}");
        }
    }
}
