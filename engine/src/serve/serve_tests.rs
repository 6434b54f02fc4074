//! The tests of `serve/mod.rs`.

use super::*;
use crate::intake::events::arrivals;
use notify::event::{CreateKind, DataChange, EventKind, Flag, ModifyKind, RemoveKind, RenameMode};
use notify::Event;
use std::path::PathBuf;
use std::time::Duration;

#[test]
fn the_blocking_pool_holds_every_intake_thread_and_room_beside_them() {
    // Every bounded intake thread may wait for a standby's acknowledgement (ack =
    // "standby"), which is answered on a blocking thread too: room must remain.
    for toml in [
        "",
        "batches_in_flight_max = 8",
        "stream_batches_running_max = 1000",
    ] {
        let cfg: crate::config::Config = toml::from_str(toml).expect("config");
        let intake =
            cfg.batches_in_flight_max + cfg.bulk_files_in_flight_max + cfg.stream_batches_running();
        assert!(
            blocking_threads(&cfg) >= intake + BLOCKING_SLACK,
            "{toml:?}"
        );
    }
    assert_eq!(
        blocking_threads(&crate::config::Config::default()),
        64 + 4 + 256 + 16
    );
}

fn ev(kind: EventKind, paths: &[&str]) -> notify::Result<Event> {
    let mut e = Event::new(kind);
    for p in paths {
        e = e.add_path(PathBuf::from(p));
    }
    Ok(e)
}

/// An engine on a real temporary directory, with `crash` and a rescan interval.
fn open_real(
    dir: &std::path::Path,
    crash: Arc<dyn crate::pipeline::crash::CrashHook>,
    rescan_interval_ms: u64,
) -> Result<crate::replica::Node, EngineError> {
    use crate::config::Config;
    let opts = crate::pipeline::EngineOptions {
        storage: roost_storage::RealStorage::shared(),
        config: Arc::new(Config {
            data_dir: dir.to_path_buf(),
            control_socket: Some(dir.join("roost.sock")),
            rescan_interval_ms,
            ..Config::default()
        }),
        crash,
        log_role: std::sync::Arc::new(crate::replica::Opener::default()),
    };
    crate::replica::Node::open(opts, &|_, _, _| {})
}

/// `serve_until` on its own thread; `stop` asks it to stop and joins it.
struct Serving {
    stop: Arc<Notify>,
    thread: std::thread::JoinHandle<Result<(), EngineError>>,
}

impl Serving {
    fn start(node: crate::replica::Node) -> Serving {
        let stop = Arc::new(Notify::new());
        let s = stop.clone();
        let thread = std::thread::spawn(move || serve_until(node, s).map(|_| ()));
        Serving { stop, thread }
    }

    fn stop(self) {
        self.stop.notify_one();
        self.thread.join().expect("serve thread").expect("serve");
    }
}

/// Drops a one-create batch with `key` as `new/NAME`, the client's way.
fn drop_in(spool: &std::path::Path, name: &str, key: &str) {
    let tmp = spool.join("tmp").join(name);
    std::fs::write(
        &tmp,
        format!(r#"{{"request_key":"{key}","ops":[{{"op":"create","shard":"s","record":{{}}}}]}}"#),
    )
    .expect("write");
    std::fs::rename(&tmp, spool.join("new").join(name)).expect("rename");
}

/// Polls `f` for up to 20 s; fails with `what` after that.
fn wait_until(what: &str, f: impl Fn() -> bool) {
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(std::time::Instant::now() < until, "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Goal: once `serve_until` returns, nothing holds the engine (and its data directory
/// lock) any more: an embedding program can open the directory again at once.
#[test]
fn serve_releases_the_engine_when_it_returns() {
    let t = tempfile::tempdir().expect("tempdir");
    let dir = t.path().join("data");
    let open = || open_real(&dir, Arc::new(crate::pipeline::crash::NoCrash), 1_000);
    for round in 0..10 {
        let node = open().unwrap_or_else(|e| panic!("round {round}: {e}"));
        let engine = node.engine.clone();
        // A file arrives while serving, so the watcher has fired.
        let name = format!("f{round}.json");
        drop_in(&dir.join("spool"), &name, &format!("k{round}"));
        let serving = Serving::start(node);
        let out = dir.join("spool/out").join(&name);
        wait_until(&format!("no result in round {round}"), || out.exists());
        drop(engine);
        serving.stop();
    }
    open().expect("the directory is free after the last round");
}

/// Goal: a name that arrives again while its first batch is still in its durability tail
/// (the client saw the answer and reused the name at once) is taken as soon as the first
/// worker is done, not at the next rescan (set an hour apart here).
/// Method: a crash hook that holds the first batch at `after_result` until the second
/// file is in `new/`.
#[test]
fn a_name_reused_during_the_tail_is_taken_when_the_worker_is_done() {
    use crate::pipeline::crash::{HoldOnce, Step};

    let (hold, handle) = HoldOnce::new(Step::AfterResult.at());
    let t = tempfile::tempdir().expect("tempdir");
    let dir = t.path().join("data");
    let node = open_real(&dir, hold, 3_600_000).expect("open");
    let engine = node.engine.clone();
    let serving = Serving::start(node);
    let spool = dir.join("spool");
    drop_in(&spool, "same.json", "first");
    assert!(
        handle.reached(Duration::from_secs(20)),
        "the first batch reached its result"
    );
    let out = spool.join("out/same.json");
    assert!(std::fs::read_to_string(&out)
        .expect("first result")
        .contains("first"));
    drop_in(&spool, "same.json", "second");
    // Let the watcher deliver the second file's event while the first is held.
    std::thread::sleep(Duration::from_millis(300));
    handle.release();
    wait_until(
        "the reused name was not taken after its first worker finished",
        || {
            std::fs::read_to_string(&out)
                .unwrap_or_default()
                .contains("second")
        },
    );
    drop(engine);
    serving.stop();
}

#[test]
fn events_name_arrivals_and_ask_for_a_rescan_when_unsure() {
    let some = |n: &str| vec![Some(n.to_owned())];
    assert_eq!(
        arrivals(ev(EventKind::Create(CreateKind::File), &["/s/new/a.json"])),
        some("a.json")
    );
    assert_eq!(
        arrivals(ev(
            EventKind::Modify(ModifyKind::Name(RenameMode::To)),
            &["/s/new/b.json"]
        )),
        some("b.json")
    );
    // A rename within new/: only the target arrived.
    assert_eq!(
        arrivals(ev(
            EventKind::Modify(ModifyKind::Name(RenameMode::Both)),
            &["/s/new/.b.tmp", "/s/new/b.json"]
        )),
        some("b.json")
    );
    // The daemon's own removals, and writes to a file, are not arrivals.
    assert!(arrivals(ev(EventKind::Remove(RemoveKind::File), &["/s/new/a.json"])).is_empty());
    assert!(arrivals(ev(
        EventKind::Modify(ModifyKind::Name(RenameMode::From)),
        &["/s/new/a.json"]
    ))
    .is_empty());
    assert!(arrivals(ev(
        EventKind::Modify(ModifyKind::Data(DataChange::Any)),
        &["/s/new/a.json"]
    ))
    .is_empty());
    // Lost events: an overflowed queue, an error, a kind that says nothing.
    let overflow = Ok(Event::new(EventKind::Other).set_flag(Flag::Rescan));
    assert_eq!(arrivals(overflow), vec![None]);
    assert_eq!(
        arrivals(Err(notify::Error::generic("queue overflow"))),
        vec![None]
    );
    assert_eq!(arrivals(ev(EventKind::Any, &[])), vec![None]);
}
