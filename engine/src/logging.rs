//! Where the log goes and what it lets through: the `ROOST_LOG` filter and the choice between
//! JSON lines, plain lines and the systemd journal's native protocol. A leaf: it reads three
//! environment variables and stderr's identity, and knows nothing of the daemon. It never fails
//! to build a subscriber: a bad `ROOST_LOG` or an unreachable journal falls back and says so.

use std::io::IsTerminal;
use tracing::level_filters::LevelFilter;
use tracing::Subscriber;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::EnvFilter;

/// What the environment says about logging, read once by [`Env::from_process`]; tests build
/// one by hand.
#[derive(Debug, Clone, Default)]
pub struct Env {
    /// `ROOST_LOG`: an `EnvFilter` directive (`debug`, `roost=debug,roost_wal=info`).
    pub filter: Option<String>,
    /// `ROOST_LOG_FORMAT`: `json` for one JSON object per line on stderr.
    pub format: Option<String>,
    /// `JOURNAL_STREAM`: `DEV:INODE` of the stream systemd connected to the journal.
    pub journal_stream: Option<String>,
}

impl Env {
    pub fn from_process() -> Env {
        let var = |name| std::env::var(name).ok();
        Env {
            filter: var("ROOST_LOG"),
            format: var("ROOST_LOG_FORMAT"),
            journal_stream: var("JOURNAL_STREAM"),
        }
    }
}

/// The `SYSLOG_IDENTIFIER` of every journal entry (`journalctl -t roost`), whatever the
/// binary was renamed to.
pub const SYSLOG_IDENTIFIER: &str = "roost";

/// A subscriber ready to install, and what the caller should print to stderr once installed
/// (an ignored `ROOST_LOG`, a journal that could not be reached).
pub struct Built {
    pub subscriber: Box<dyn Subscriber + Send + Sync>,
    pub notes: Vec<String>,
}

/// Builds the subscriber `main` installs: `default` is the level when `ROOST_LOG` is unset or
/// invalid. JSON wins over the journal; the journal is used only when stderr is the stream
/// `JOURNAL_STREAM` names (a child whose stderr was redirected inherits the variable).
pub fn build(env: &Env, default: LevelFilter) -> Built {
    let mut notes = Vec::new();
    let filter = filter(env.filter.as_deref(), default, &mut notes);
    let registry = tracing_subscriber::registry().with(filter);
    let json = env.format.as_deref() == Some("json");
    let journal = !json
        && env
            .journal_stream
            .as_deref()
            .is_some_and(|s| stream_is_stderr(s, stderr_identity()));
    // A log line that cannot be written (stderr gone, EIO, a full disk under the journal) is
    // dropped: it must not panic the daemon or decide its exit code.
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal() && !journal)
        .log_internal_errors(false);
    let subscriber: Box<dyn Subscriber + Send + Sync> = if json {
        Box::new(registry.with(fmt.json()))
    } else if journal {
        match tracing_journald::layer() {
            Ok(layer) => {
                Box::new(registry.with(layer.with_syslog_identifier(SYSLOG_IDENTIFIER.into())))
            }
            Err(e) => {
                notes.push(format!(
                    "roost: the journal socket cannot be opened ({e}); logging plain lines to stderr"
                ));
                // stderr is still the journal's stream, which stamps the time itself.
                Box::new(registry.with(fmt.without_time()))
            }
        }
    } else {
        Box::new(registry.with(fmt))
    };
    Built { subscriber, notes }
}

/// Installs [`build`]'s subscriber for the whole process and prints its notes to stderr.
pub fn init(default: LevelFilter) {
    use std::io::Write;
    let built = build(&Env::from_process(), default);
    // Only fails if a subscriber is already set, which `main` never does.
    let _ = tracing::subscriber::set_global_default(built.subscriber);
    for note in built.notes {
        let _ = writeln!(std::io::stderr(), "{note}");
    }
}

/// `ROOST_LOG` as an `EnvFilter`; unset or blank gives `default`, and so does an invalid
/// directive, with a note: a typo in a log setting is no reason not to start.
fn filter(directive: Option<&str>, default: LevelFilter, notes: &mut Vec<String>) -> EnvFilter {
    let fallback = || EnvFilter::default().add_directive(default.into());
    match directive.map(str::trim).filter(|d| !d.is_empty()) {
        None => fallback(),
        Some(d) => EnvFilter::try_new(d).unwrap_or_else(|e| {
            notes.push(format!(
                "roost: ROOST_LOG={d:?} is not a valid filter ({e}); using the default \"{default}\""
            ));
            fallback()
        }),
    }
}

/// stderr's `(st_dev, st_ino)`, or `None` if it cannot be stat'ed (closed).
fn stderr_identity() -> Option<(u64, u64)> {
    let st = rustix::fs::fstat(std::io::stderr()).ok()?;
    #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
    Some((st.st_dev as u64, st.st_ino as u64))
}

/// Whether `JOURNAL_STREAM` (`DEV:INODE`, both decimal) names the stream with identity `stderr`.
/// systemd.exec(5): a program should compare both with its own fstat before trusting the
/// variable, since it is inherited by children whose stderr may go elsewhere.
pub fn stream_is_stderr(journal_stream: &str, stderr: Option<(u64, u64)>) -> bool {
    let parsed = journal_stream
        .split_once(':')
        .and_then(|(dev, ino)| Some((dev.parse::<u64>().ok()?, ino.parse::<u64>().ok()?)));
    parsed.is_some() && parsed == stderr
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_stream_must_name_stderr_exactly() {
        let me = Some((2049, 131));
        assert!(stream_is_stderr("2049:131", me));
        assert!(!stream_is_stderr("2049:132", me), "other inode");
        assert!(!stream_is_stderr("2050:131", me), "other device");
        assert!(!stream_is_stderr("2049:131", None), "stderr closed");
        for bad in [
            "",
            ":",
            "2049",
            "2049:",
            ":131",
            "2049:131:7",
            "a:b",
            "-1:131",
            " 2049:131",
        ] {
            assert!(!stream_is_stderr(bad, me), "malformed {bad:?}");
        }
    }

    #[test]
    fn real_stderr_matches_its_own_identity() {
        let (dev, ino) = stderr_identity().expect("stderr is open under cargo test");
        assert!(stream_is_stderr(&format!("{dev}:{ino}"), stderr_identity()));
    }

    #[test]
    fn roost_log_is_a_directive_and_a_bad_one_falls_back() {
        let mut notes = Vec::new();
        let f = filter(
            Some("roost=debug,roost_wal=info"),
            LevelFilter::WARN,
            &mut notes,
        );
        assert_eq!(f.max_level_hint(), Some(LevelFilter::DEBUG));
        let f = filter(Some("trace"), LevelFilter::WARN, &mut notes);
        assert_eq!(f.max_level_hint(), Some(LevelFilter::TRACE));
        let f = filter(None, LevelFilter::INFO, &mut notes);
        assert_eq!(f.max_level_hint(), Some(LevelFilter::INFO));
        let f = filter(Some("  "), LevelFilter::WARN, &mut notes);
        assert_eq!(f.max_level_hint(), Some(LevelFilter::WARN));
        assert!(notes.is_empty(), "{notes:?}");
        let f = filter(Some("roost=loud"), LevelFilter::INFO, &mut notes);
        assert_eq!(f.max_level_hint(), Some(LevelFilter::INFO));
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("ROOST_LOG=\"roost=loud\""), "{notes:?}");
    }
}
