//! Certificates for replication's mutual TLS (issue 26, docs/replication.md "Who may say
//! what"), made with rcgen for a test cluster: a CA (`ca.pem`, `ca.key`) and member
//! certificates (`NAME.pem`, `NAME.key`) signed by it: ECDSA P-256, SAN dNSName NAME (what
//! the daemon matches against `members`), serverAuth and clientAuth (a node is both). Keys
//! are created 0600 and every file is written to a temporary, fsynced, renamed and its
//! directory fsynced. An existing file is never replaced without `force`. Errors: a bad NAME,
//! zero days or a file that exists are usage errors (exit 2), an unreadable or unparsable CA
//! a configuration error (78), I/O 74. `roost certs` (`cli/certs.rs`) prints what these make;
//! the replicated drill and the tests use `member_config`.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use roost_storage::{replace_file, OpenMode, RealStorage};

use crate::error::{CommandError, ErrorClass};

/// Validity of a CA made by `init` unless `--days` says otherwise.
pub const CA_DAYS: u32 = 3650;
/// Validity of a member certificate made by `issue` unless `--days` says otherwise.
pub const MEMBER_DAYS: u32 = 825;

/// The `[replication]` lines of member `name` of a test cluster whose CA lives in `dir`:
/// the CA and `name`'s certificate are made first if missing. For the drill and the tests.
pub fn member_config(dir: &Path, name: &str, members: &[&str]) -> anyhow::Result<String> {
    if !dir.join("ca.pem").exists() {
        make_ca(dir, CA_DAYS, false)?;
    }
    let (cert, key) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    if !cert.exists() {
        make_member(dir, name, MEMBER_DAYS, false)?;
    }
    let ca = dir.join("ca.pem");
    Ok(format!(
        "tls_cert = {:?}\ntls_key = {:?}\ntls_ca = {:?}\nmembers = {members:?}\n",
        cert.display().to_string(),
        key.display().to_string(),
        ca.display().to_string()
    ))
}

/// Makes `dir/ca.pem` and `dir/ca.key`; their paths and the end of validity.
pub fn make_ca(dir: &Path, days: u32, force: bool) -> anyhow::Result<(PathBuf, PathBuf, String)> {
    let (cert_path, key_path) = (dir.join("ca.pem"), dir.join("ca.key"));
    make_dir(dir)?;
    refuse_existing(&[&cert_path, &key_path], force)?;
    let key = KeyPair::generate().context("generating the CA key")?;
    let mut p = CertificateParams::new(Vec::<String>::new()).context("CA parameters")?;
    // Path length 0: it signs member certificates, never another CA.
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    let id = format!("{:08x}", rand_id(&key));
    p.distinguished_name
        .push(DnType::CommonName, format!("roost cluster CA {id}"));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let not_after = validity(&mut p, days)?;
    let cert = p.self_signed(&key).context("signing the CA certificate")?;
    write_pair((&key_path, &key), (&cert_path, &cert))?;
    Ok((cert_path, key_path, not_after))
}

/// Makes `dir/NAME.pem` and `dir/NAME.key`, signed by the CA in `dir`.
pub fn make_member(
    dir: &Path,
    name: &str,
    days: u32,
    force: bool,
) -> anyhow::Result<(PathBuf, PathBuf, String)> {
    check_name(name)?;
    let (cert_path, key_path) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    let issuer = load_ca(dir)?;
    refuse_existing(&[&cert_path, &key_path], force)?;
    let key = KeyPair::generate().context("generating the member key")?;
    let mut p = CertificateParams::new(vec![name.to_owned()]).context("member parameters")?;
    p.distinguished_name.push(DnType::CommonName, name);
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let not_after = validity(&mut p, days)?;
    let cert = p
        .signed_by(&key, &issuer)
        .context("signing the member certificate")?;
    write_pair((&key_path, &key), (&cert_path, &cert))?;
    Ok((cert_path, key_path, not_after))
}

/// A member name must be a DNS name: the daemon matches it as a certificate's SAN dNSName.
fn check_name(name: &str) -> anyhow::Result<()> {
    if name == "ca" {
        return Err(CommandError::usage(
            "\"ca\" names the CA's own files: pick another member name",
        )
        .into());
    }
    match rustls_pki_types::ServerName::try_from(name) {
        Ok(rustls_pki_types::ServerName::DnsName(_)) => Ok(()),
        _ => Err(CommandError::usage(format!(
            "member name {name:?} is not a DNS name (letters, digits, '-' and '.'): certificates name members in a SAN dNSName"
        ))
        .into()),
    }
}

/// The CA in `dir`, as an issuer (its certificate and key).
fn load_ca(dir: &Path) -> anyhow::Result<Issuer<'static, KeyPair>> {
    let read = |p: PathBuf| {
        std::fs::read_to_string(&p).map_err(|e| CommandError {
            class: ErrorClass::Config,
            message: format!(
                "cannot read {} (roost certs init makes it): {e}",
                p.display()
            ),
        })
    };
    let (cert_path, key_path) = (dir.join("ca.pem"), dir.join("ca.key"));
    let bad = |p: &Path, e: rcgen::Error| CommandError {
        class: ErrorClass::Config,
        message: format!("{}: not a usable CA file: {e}", p.display()),
    };
    let key = KeyPair::from_pem(&read(key_path.clone())?).map_err(|e| bad(&key_path, e))?;
    Ok(Issuer::from_ca_cert_pem(&read(cert_path.clone())?, key).map_err(|e| bad(&cert_path, e))?)
}

/// Valid from now for `days` days; the end as RFC 3339 text.
fn validity(p: &mut CertificateParams, days: u32) -> anyhow::Result<String> {
    if days == 0 {
        return Err(CommandError::usage("--days must be at least 1").into());
    }
    let now = time::OffsetDateTime::now_utc();
    p.not_before = now - time::Duration::minutes(5);
    p.not_after = now + time::Duration::days(i64::from(days));
    p.not_after
        .format(&time::format_description::well_known::Rfc3339)
        .context("formatting the end of validity")
}

/// Some bits of the new key's public part: distinct CA names for distinct CAs.
fn rand_id(key: &KeyPair) -> u32 {
    crc32fast::hash(key.public_key_raw())
}

fn make_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))
}

fn refuse_existing(paths: &[&Path], force: bool) -> anyhow::Result<()> {
    match paths.iter().find(|p| p.exists()) {
        Some(p) if !force => Err(CommandError::usage(format!(
            "{} exists: not replaced (use --force)",
            p.display()
        ))
        .into()),
        _ => Ok(()),
    }
}

/// Writes a key (never readable by others) and its certificate, the key first.
fn write_pair(key: (&Path, &KeyPair), cert: (&Path, &Certificate)) -> anyhow::Result<()> {
    let pem = key.1.serialize_pem();
    write_file(key.0, pem.as_bytes(), OpenMode::CreateNewPrivate)?;
    write_file(cert.0, cert.1.pem().as_bytes(), OpenMode::CreateNew)
}

/// Writes `bytes` to `path` durably ([`roost_storage::replace_file`]: a temporary, fsync,
/// rename, fsync of the directory); a key's temporary is created `CreateNewPrivate` (0600), so
/// a key is never readable by others, not even for a moment.
fn write_file(path: &Path, bytes: &[u8], create: OpenMode) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    replace_file(&RealStorage, &tmp, path, bytes, create)
        .with_context(|| format!("writing {}", path.display()))
}
