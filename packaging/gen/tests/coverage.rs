//! The generated man pages and completions cover the whole CLI: every command `roost` parses
//! has its page, every flag and argument shows on its command's page and in the completions,
//! and a command or flag added to the CLI shows up without touching the generator. The
//! commands are walked here, not with the generator's own walk, so a generator that skips one
//! fails.
#![forbid(unsafe_code)]

use std::collections::BTreeSet;

use clap::{Arg, ArgAction, Command};
use roost_docgen::{completions, man_pages, Generated};

/// The built command and every visible subcommand below it, with its page name
/// (`roost-certs-init`).
fn walk(cmd: &Command, name: String, out: &mut Vec<(String, Command)>) {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        if sub.get_name() != "help" {
            walk(sub, format!("{name}-{}", sub.get_name()), out);
        }
    }
    out.push((name, cmd.clone()));
}

fn all_commands(cmd: &Command) -> Vec<(String, Command)> {
    let mut built = cmd.clone();
    built.build();
    let mut out = Vec::new();
    walk(&built, built.get_name().to_owned(), &mut out);
    out
}

/// How an argument shows in help text: `--long`, `-s`, or a positional's `VALUE` name.
fn shown_as(arg: &Arg) -> String {
    if let Some(long) = arg.get_long() {
        format!("--{long}")
    } else if let Some(short) = arg.get_short() {
        format!("-{short}")
    } else {
        arg.get_value_names()
            .and_then(|v| v.first())
            .map_or_else(|| arg.get_id().as_str().to_uppercase(), |v| v.to_string())
    }
}

/// A page's text with roff's font switches and escapes taken out: `\fB\-\-wait\fR` -> `--wait`.
fn plain(roff: &[u8]) -> String {
    let text = String::from_utf8_lossy(roff);
    let mut out = text.replace("\\-", "-");
    for font in ["\\fB", "\\fI", "\\fR", "\\fP"] {
        out = out.replace(font, "");
    }
    out
}

/// What the pages fail to show of `cmd`: a command without its page, a page without a
/// command, an argument missing from its command's page, a subcommand its parent's page does
/// not list as `NAME(1)`.
fn missing_from_pages(cmd: &Command, pages: &[Generated]) -> Vec<String> {
    let commands = all_commands(cmd);
    let find = |name: &str| {
        pages
            .iter()
            .find(|p| p.path.to_string_lossy() == format!("man/{name}.1"))
            .map(|p| plain(&p.bytes))
    };
    let mut problems = Vec::new();
    let want: BTreeSet<String> = commands.iter().map(|(n, _)| format!("man/{n}.1")).collect();
    let have: BTreeSet<String> = pages
        .iter()
        .map(|p| p.path.to_string_lossy().into_owned())
        .collect();
    for extra in have.difference(&want) {
        problems.push(format!("{extra}: a page for no command"));
    }
    for (name, c) in &commands {
        let Some(page) = find(name) else {
            problems.push(format!("{name}: no page"));
            continue;
        };
        for arg in c.get_arguments().filter(|a| !a.is_hide_set()) {
            let word = shown_as(arg);
            if !page.contains(&word) {
                problems.push(format!("{name}.1 does not show {word}"));
            }
        }
        for sub in c.get_subcommands().filter(|s| s.get_name() != "help") {
            let listed = format!("{name}-{}(1)", sub.get_name());
            if !page.contains(&listed) {
                problems.push(format!("{name}.1 does not list {listed}"));
            }
        }
    }
    problems
}

/// What a completion script fails to offer: a subcommand's name or a long flag.
fn missing_from_completion(cmd: &Command, script: &Generated) -> Vec<String> {
    let text = String::from_utf8_lossy(&script.bytes);
    let mut problems = Vec::new();
    for (name, c) in all_commands(cmd) {
        if !text.contains(c.get_name()) {
            problems.push(format!("{}: no {name}", script.path.display()));
        }
        for long in c.get_arguments().filter_map(Arg::get_long) {
            if !text.contains(long) {
                problems.push(format!("{}: no --{long} of {name}", script.path.display()));
            }
        }
    }
    problems
}

/// Goal: every command of `roost` has its page, listed by its parent, showing every flag.
#[test]
fn every_command_and_flag_is_in_the_man_pages() {
    let cmd = roost::cli::command();
    let pages = man_pages(&cmd).expect("render");
    assert!(pages.len() >= 15, "only {} pages", pages.len());
    let problems = missing_from_pages(&cmd, &pages);
    assert!(problems.is_empty(), "man pages: {problems:#?}");
}

/// Goal: the bash, zsh and fish completions offer every command and long flag.
#[test]
fn every_command_and_flag_is_in_the_completions() {
    let cmd = roost::cli::command();
    let scripts = completions(&cmd);
    let paths: Vec<String> = scripts
        .iter()
        .map(|s| s.path.display().to_string())
        .collect();
    assert_eq!(
        paths,
        [
            "completions/roost",
            "completions/_roost",
            "completions/roost.fish"
        ]
    );
    for script in &scripts {
        let problems = missing_from_completion(&cmd, script);
        assert!(problems.is_empty(), "completions: {problems:#?}");
    }
}

/// Goal: a command or flag added to the CLI reaches the pages and completions with no change
/// to the generator (nothing in it lists roost's commands).
#[test]
fn a_new_command_and_flag_show_up() {
    let cmd = roost::cli::command()
        .subcommand(
            Command::new("compact")
                .about("Compact the shards.")
                .arg(
                    Arg::new("dry-run")
                        .long("dry-run")
                        .action(ArgAction::SetTrue),
                )
                .subcommand(Command::new("plan").about("Print the plan.")),
        )
        .mut_subcommand("serve", |s| {
            s.arg(Arg::new("once").long("once").action(ArgAction::SetTrue))
        });
    let pages = man_pages(&cmd).expect("render");
    assert!(pages
        .iter()
        .any(|p| p.path.to_string_lossy() == "man/roost-compact-plan.1"));
    assert_eq!(missing_from_pages(&cmd, &pages), Vec::<String>::new());
    for script in completions(&cmd) {
        let text = String::from_utf8_lossy(&script.bytes).into_owned();
        assert!(
            text.contains("dry-run") && text.contains("once"),
            "{script:?}"
        );
        assert_eq!(missing_from_completion(&cmd, &script), Vec::<String>::new());
    }
}

/// Goal: the checks can fail: a flag taken out of a page, a page taken away, a stale page and
/// a flag the CLI gained after the pages were made are each reported.
#[test]
fn the_checks_can_fail() {
    let cmd = roost::cli::command();
    let pages = man_pages(&cmd).expect("render");
    let mut cut = pages.clone();
    let submit = cut
        .iter_mut()
        .find(|p| p.path.to_string_lossy() == "man/roost-submit.1")
        .expect("roost-submit.1");
    submit.bytes = plain(&submit.bytes).replace("--wait", "").into_bytes();
    assert_eq!(
        missing_from_pages(&cmd, &cut),
        ["roost-submit.1 does not show --wait"]
    );
    let mut fewer = pages.clone();
    fewer.retain(|p| p.path.to_string_lossy() != "man/roost-wal-dump.1");
    assert_eq!(
        missing_from_pages(&cmd, &fewer),
        ["roost-wal-dump: no page"]
    );
    let mut more = pages.clone();
    more.push(Generated {
        path: "man/roost-gone.1".into(),
        bytes: Vec::new(),
    });
    assert_eq!(
        missing_from_pages(&cmd, &more),
        ["man/roost-gone.1: a page for no command"]
    );
    let grown = cmd.mut_subcommand("verify", |s| s.arg(Arg::new("deep").long("deep")));
    assert_eq!(
        missing_from_pages(&grown, &pages),
        ["roost-verify.1 does not show --deep"]
    );
}

/// Goal: every page's `.TH` line carries the changelog's date, the version and the manual
/// (an empty date would shift the fields: the header showed "General Commands Manual").
#[test]
fn the_title_line_has_date_source_and_manual() {
    let date = roost_docgen::release_date();
    assert_eq!(date.len(), 10, "{date:?}");
    let pages = man_pages(&roost::cli::command()).expect("render");
    for page in &pages {
        let text = String::from_utf8_lossy(&page.bytes);
        let th = text.lines().find(|l| l.starts_with(".TH ")).expect(".TH");
        let want = format!(
            " {date} \"roost {}\" \"roost manual\"",
            env!("CARGO_PKG_VERSION")
        );
        assert!(th.ends_with(&want), "{}: {th}", page.path.display());
    }
}

/// The plain text of the page `name`.
fn page(pages: &[Generated], name: &str) -> String {
    let p = pages
        .iter()
        .find(|p| p.path.to_string_lossy() == format!("man/{name}.1"))
        .unwrap_or_else(|| panic!("no page {name}"));
    plain(&p.bytes)
}

/// Goal (issue 43): what a reader of the pages met: the NAME line read "roost - roost: a
/// write-ahead-log ..."; `--config`'s help stopped at "Without it, the embedded default";
/// `roost-submit(1)` showed `[FILE]` with no description; `roost --help` never named drill's
/// `--cluster`; the pages named examples/roost.toml where the package has none.
#[test]
fn the_pages_read_as_a_first_time_reader_needs() {
    let cmd = roost::cli::command();
    let pages = man_pages(&cmd).expect("render");
    let root = page(&pages, "roost");
    let name_line = root
        .lines()
        .skip_while(|l| *l != ".SH NAME")
        .nth(1)
        .expect("a NAME line");
    assert_eq!(name_line, "roost - a write-ahead-log batch-apply daemon");
    assert!(
        root.contains("/etc/roost/roost.toml if it exists"),
        "--config names its default"
    );
    assert!(!root.contains("the embedded default"), "{root}");
    assert!(root.contains("/usr/share/doc/roost/examples/roost.toml"));
    assert!(root.contains("runuser -u roost -- roost serve"));
    let drill_summary = root
        .lines()
        .skip_while(|l| !l.contains("roost-drill(1)"))
        .nth(1)
        .expect("drill's line in roost(1)");
    assert!(drill_summary.contains("--cluster"), "{drill_summary}");
    let submit = page(&pages, "roost-submit");
    assert!(submit.contains("[FILE]..."), "{submit}");
    assert!(submit.contains("Batch files to deliver"), "{submit}");
}

/// Goal (issue 43): the package's /etc/roost/roost.toml sets the package's paths, so the
/// installed roost finds its data, spool and sockets without flags or systemd's variables,
/// and holds every line of examples/roost.toml commented out (every key explained, at its
/// default), so the two cannot drift apart.
#[test]
fn the_conffile_sets_the_package_paths_and_comments_out_the_example() {
    let conf = roost_docgen::conffile();
    assert_eq!(conf.path.to_string_lossy(), "roost.toml");
    let text = String::from_utf8(conf.bytes).expect("utf-8");
    let dir = std::env::temp_dir().join(format!("roost-docgen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("roost.toml");
    std::fs::write(&path, &text).expect("write");
    let cfg = roost::config::Config::load(&path);
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = cfg.expect("the conffile loads");
    assert_eq!(cfg.data_dir.to_string_lossy(), "/var/lib/roost");
    assert_eq!(
        cfg.spool_dir(),
        std::path::PathBuf::from("/var/spool/roost")
    );
    assert_eq!(
        roost::control::socket::socket_path(&cfg).to_string_lossy(),
        "/run/roost/roost.sock"
    );
    assert_eq!(
        cfg.stream_socket
            .as_deref()
            .map(|p| p.to_string_lossy().into_owned()),
        Some("/var/spool/roost/stream.sock".to_owned())
    );
    let example = include_str!("../../../examples/roost.toml");
    let body: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("# Every other setting"))
        .skip(2)
        .collect();
    let commented: Vec<String> = example
        .lines()
        .map(|l| {
            if l.is_empty() || l.starts_with('#') {
                l.to_owned()
            } else {
                format!("# {l}")
            }
        })
        .collect();
    assert_eq!(body, commented);
    let set: Vec<&str> = text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(set.len(), roost_docgen::PACKAGE_PATHS.len(), "{set:?}");
}
