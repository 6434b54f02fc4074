//! `roost-docgen`: roost's man pages and shell completions, generated from the clap command
//! the binary parses with (`roost::cli::command()`), so neither can drift from the CLI, and
//! the package's `/etc/roost/roost.toml`, generated from `examples/roost.toml` ([`conffile`]).
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
            clap_mangen::Man::new(c.clone())
                .section(SECTION)
                .date(release_date())
                .source(format!("roost {}", env!("CARGO_PKG_VERSION")))
                .manual("roost manual")
                .render(&mut bytes)
                .with_context(|| format!("rendering the man page of {name}"))?;
            let mut bytes = mark_repeated(&c, bytes);
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

/// `clap_mangen` shows a positional that takes many values as `[FILE]`, as if it took one;
/// `roost submit --help` says `[FILE]...`, and so do the pages, in the synopsis and the list.
fn mark_repeated(cmd: &clap::Command, roff: Vec<u8>) -> Vec<u8> {
    let mut text = String::from_utf8_lossy(&roff).into_owned();
    let repeated = cmd
        .get_positionals()
        .filter(|a| a.get_num_args().is_some_and(|r| r.max_values() > 1));
    for arg in repeated {
        let names: Vec<String> = match arg.get_value_names() {
            Some(v) => v.iter().map(|n| n.to_string()).collect(),
            None => vec![arg.get_id().as_str().to_owned()],
        };
        for name in names {
            for (open, close) in [("[", "]"), ("<", ">")] {
                let one = format!("{open}\\fI{name}\\fR{close}");
                let many = format!("{one}...");
                if !text.contains(&many) {
                    text = text.replace(&one, &many);
                }
            }
        }
    }
    text.into_bytes()
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
The configuration every command of \fI/usr/bin/roost\fR reads without \fB\-\-config\fR: the
package's paths below, then every other setting commented out at its default.
.TP
\fI/usr/share/doc/roost/examples/\fR
\fIroost.toml\fR explaining every key, \fIcluster/\fR (a three-node cluster's files),
\fIcluster.conf\fR (the drop-in a node that uses the network needs), batch files.
.TP
\fI/var/lib/roost\fR
The data directory: the WAL, the shards, the audit log.
.TP
\fI/var/spool/roost\fR
The spool: clients in the group \fBroost\-submit\fR deliver batches into \fInew/\fR, read
their results in \fIout/\fR and remove them; \fIstream.sock\fR is the stream socket.
.TP
\fI/run/roost/roost.sock\fR
The control socket (\fBroost status\fR), for root and the roost user.
.SH "RUNNING WITHOUT SYSTEMD"
\fBrunuser \-u roost \-\- roost serve\fR (its log on stderr, \fBSIGTERM\fR stops it); the
package's postinst made its directories (\fBsystemd\-tmpfiles \-\-create roost.conf\fR makes
\fI/run/roost\fR again after a reboot without systemd).
.SH "SEE ALSO"
\fI/usr/share/doc/roost/README.md\fR, \fBsystemctl\fR(1), \fBjournalctl\fR(1), \fBrunuser\fR(1)
"#
    )
}

/// Every key of roost's configuration, each explained: the file the package's conffile
/// carries, commented out, after the package's own paths.
const EXAMPLE_CONFIG: &str = include_str!("../../../examples/roost.toml");

/// What `/etc/roost/roost.toml` sets: the package's layout, which every command of the
/// installed `roost` reads without `--config` (`roost::cli::default_config_file`). The
/// stream socket lives in the spool, whose group is `roost-submit` and whose setgid bit gives
/// the socket that group: its clients can connect, as Postfix's `public/` holds the sockets
/// its `postdrop` group reaches. The control socket stays in `/run/roost` (the daemon's own
/// group): `promote` is for the operator, not for every client.
pub const PACKAGE_PATHS: [(&str, &str); 4] = [
    ("data_dir", "/var/lib/roost"),
    ("spool_dir", "/var/spool/roost"),
    ("control_socket", "/run/roost/roost.sock"),
    ("stream_socket", "/var/spool/roost/stream.sock"),
];

/// The package's `/etc/roost/roost.toml` (`roost.toml` here): a header, [`PACKAGE_PATHS`],
/// then `examples/roost.toml` with every line commented out (the built-in defaults, each key
/// explained), so the two cannot drift apart.
pub fn conffile() -> Generated {
    let mut text = String::from(
        "# /etc/roost/roost.toml, as the Debian package installs it (a conffile: dpkg keeps your\n\
         # edits). Every command of /usr/bin/roost reads it when --config is absent: the service,\n\
         # `runuser -u roost -- roost serve`, `roost status`, `roost submit`, `roost scan`.\n\
         #\n\
         # The package's paths. roost.service may write only these (StateDirectory=,\n\
         # RuntimeDirectory=, ReadWritePaths=): one moved elsewhere needs a drop-in that allows it.\n",
    );
    for (key, value) in PACKAGE_PATHS {
        text.push_str(&format!("{key} = {value:?}\n"));
    }
    text.push_str(
        "\n# Every other setting at its built-in default: examples/roost.toml (installed as\n\
         # /usr/share/doc/roost/examples/roost.toml) with each line commented out.\n",
    );
    for line in EXAMPLE_CONFIG.lines() {
        if line.is_empty() || line.starts_with('#') {
            text.push_str(line);
        } else {
            text.push_str("# ");
            text.push_str(line);
        }
        text.push('\n');
    }
    Generated {
        path: PathBuf::from("roost.toml"),
        bytes: text.into_bytes(),
    }
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
    files.push(conffile());
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
