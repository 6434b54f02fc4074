//! `roost-docgen`: roost's man pages and shell completions, generated from the clap command
//! the binary parses with (`roost::cli::command()`), so neither can drift from the CLI.
//! `packaging/deb-check` runs the binary before `cargo deb`; the package installs its output
//! (`[package.metadata.deb]` assets in `daemon/Cargo.toml`). This crate only renders; it never
//! runs a command.
//!
//! Man pages: one per command, as git does and as `clap_mangen` renders them (`roost.1`,
//! `roost-serve.1`, `roost-certs-init.1`): `man roost-submit` opens on that command's flags,
//! and `roost.1` lists every command as `roost-NAME(1)`. `clap_mangen` renders one command per
//! page; one page for all would mean stitching its sections by hand.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap_complete::Shell;

/// The man section of every page: user commands.
pub const SECTION: &str = "1";

/// One generated file: its path under the output directory and its bytes.
#[derive(Debug, Clone)]
pub struct Generated {
    pub path: PathBuf,
    pub bytes: Vec<u8>,
}

/// Every visible command of `cmd` (built, so globals are propagated and subcommands carry
/// their `roost-NAME` display names), parents before children.
pub fn commands(cmd: &clap::Command) -> Vec<clap::Command> {
    let mut root = cmd.clone().disable_help_subcommand(true);
    root.build();
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(c) = stack.pop() {
        stack.extend(c.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
        out.push(c);
    }
    out
}

/// The page's name without its section: `roost`, `roost-certs-init`.
pub fn page_name(cmd: &clap::Command) -> String {
    cmd.get_display_name()
        .unwrap_or_else(|| cmd.get_name())
        .to_owned()
}

/// One man page per visible command, `man/NAME.1`.
pub fn man_pages(cmd: &clap::Command) -> anyhow::Result<Vec<Generated>> {
    commands(cmd)
        .into_iter()
        .map(|c| {
            let name = page_name(&c);
            let is_root = c.get_name() == cmd.get_name() && name == cmd.get_name();
            let mut bytes = Vec::new();
            clap_mangen::Man::new(c)
                .section(SECTION)
                .date(release_date())
                .source(format!("roost {}", env!("CARGO_PKG_VERSION")))
                .manual("roost manual")
                .render(&mut bytes)
                .with_context(|| format!("rendering the man page of {name}"))?;
            if is_root {
                bytes.extend_from_slice(root_extra().as_bytes());
            }
            Ok(Generated {
                path: PathBuf::from(format!("man/{name}.{SECTION}")),
                bytes,
            })
        })
        .collect()
}

/// The pages' date: that of the package's latest changelog entry, as `YYYY-MM-DD` (a fixed
/// date keeps the package reproducible; clap_mangen's empty default shifts `.TH`'s fields).
/// The trailer line reads ` -- NAME <MAIL>  Fri, 04 Dec 2026 10:45:00 +0000`.
pub fn release_date() -> String {
    const CHANGELOG: &str = include_str!("../../debian/changelog");
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let date = CHANGELOG
        .lines()
        .find_map(|l| l.strip_prefix(" -- "))
        .and_then(|l| l.split_once(">  "))
        .map(|(_, d)| d.split_whitespace().collect::<Vec<_>>());
    match date.as_deref() {
        Some([_, day, month, year, ..]) => match MONTHS.iter().position(|m| m == month) {
            Some(m) => format!("{year}-{:02}-{day}", m + 1),
            None => String::new(),
        },
        _ => String::new(),
    }
}

/// What `roost.1` says beyond the flags: the exit codes (the numbers from `roost::error`),
/// where the packaged files are, where to read on.
fn root_extra() -> String {
    use roost::error::{
        EXIT_CONFIG, EXIT_CORRUPTION, EXIT_FAILED, EXIT_INVALID, EXIT_IO, EXIT_LOCKED, EXIT_OK,
        EXIT_SOFTWARE,
    };
    format!(
        r#".SH "EXIT STATUS"
Following sysexits(3): {EXIT_OK} success; {EXIT_FAILED} failure (a \fBverify\fR violation, \fBget\fR
found nothing, \fBsubmit \-\-wait\fR saw a rejection or conflict); {EXIT_INVALID} usage or invalid input;
{EXIT_CORRUPTION} corruption on disk (a restart cannot help); {EXIT_SOFTWARE} internal error (a panic);
{EXIT_IO} I/O failure (a restart replays and repairs); {EXIT_LOCKED} the data directory is locked by
another roost, or a batch was not taken now (try again later); {EXIT_CONFIG} bad configuration.
.SH FILES
.TP
\fI/etc/roost/roost.toml\fR
The configuration; the service reads it only with the cluster drop-in
(\fI/usr/share/doc/roost/examples/cluster.conf\fR).
.TP
\fI/var/lib/roost\fR
The service's data directory: the WAL, the shards, the audit log.
.TP
\fI/var/spool/roost\fR
The spool: clients in the group \fBroost\-submit\fR deliver batches into it.
.SH "SEE ALSO"
\fI/usr/share/doc/roost/README.md\fR, \fBsystemctl\fR(1), \fBjournalctl\fR(1)
"#
    )
}

/// The completion file for each shell, at the name its Debian directory expects.
pub fn completions(cmd: &clap::Command) -> Vec<Generated> {
    let bin = cmd.get_name().to_owned();
    [
        (Shell::Bash, format!("completions/{bin}")),
        (Shell::Zsh, format!("completions/_{bin}")),
        (Shell::Fish, format!("completions/{bin}.fish")),
    ]
    .into_iter()
    .map(|(shell, path)| {
        let mut bytes = Vec::new();
        clap_complete::generate(shell, &mut cmd.clone(), bin.clone(), &mut bytes);
        Generated {
            path: PathBuf::from(path),
            bytes,
        }
    })
    .collect()
}

/// Writes every man page and completion file under `out`, after removing what an earlier run
/// left in `out/man` and `out/completions` (a page of a removed command must not ship).
pub fn write_all(cmd: &clap::Command, out: &Path) -> anyhow::Result<Vec<PathBuf>> {
    for sub in ["man", "completions"] {
        let dir = out.join(sub);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", dir.display())),
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut files = man_pages(cmd)?;
    files.extend(completions(cmd));
    files
        .into_iter()
        .map(|g| {
            let path = out.join(&g.path);
            std::fs::write(&path, &g.bytes)
                .with_context(|| format!("writing {}", path.display()))?;
            Ok(path)
        })
        .collect()
}
