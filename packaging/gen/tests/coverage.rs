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
