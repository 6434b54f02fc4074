//! `roost certs init|issue` (issue 26): prints what `ops::tls_certs` made, one JSON line.

use std::path::Path;

use serde_json::json;

use crate::ops::tls_certs::{make_ca, make_member};
pub use crate::ops::tls_certs::{CA_DAYS, MEMBER_DAYS};

/// `roost certs init`: a new CA in `dir`.
pub fn init(dir: &Path, days: u32, force: bool) -> anyhow::Result<i32> {
    let (cert, key, not_after) = make_ca(dir, days, force)?;
    say(json!({"ca": cert, "key": key, "not_after": not_after}))
}

/// `roost certs issue NAME`: a member certificate signed by the CA in `dir`.
pub fn issue(dir: &Path, name: &str, days: u32, force: bool) -> anyhow::Result<i32> {
    let (cert, key, not_after) = make_member(dir, name, days, force)?;
    let ca = dir.join("ca.pem");
    say(json!({"cert": cert, "key": key, "ca": ca, "name": name, "not_after": not_after}))
}

fn say(v: serde_json::Value) -> anyhow::Result<i32> {
    super::output::out(&format!("{v}\n"))?;
    Ok(crate::error::EXIT_OK)
}
