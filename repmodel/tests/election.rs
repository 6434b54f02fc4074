//! The election through a lease store (issue 27, `src/election.rs`), explored exhaustively:
//! every row of its results table pinned (distinct and generated states, depth, and per
//! invariant "holds" or the length of its shortest counterexample), every counterexample
//! replayed against the model, ending in the one state that breaks it. The design as built
//! keeps `NoAckLost`, `NoTwoAnswerInOneEpoch` and `OneLeaderKey` with leaders paused anywhere;
//! `AnswersWithinLease` holds when no pause falls between a leader's deadline check and its
//! act; each flaw breaks the invariant its rule keeps. `docs/replication-model.md` explains
//! the rows.
#![forbid(unsafe_code)]
// Tests may panic: that is how they fail (the unwrap/expect ban is for production code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use roost_repmodel::election::invariants::by_name;
use roost_repmodel::election::{self, print, Ack, Config, Election, Flaw, State};
use roost_repmodel::explorer::replay;
use roost_repmodel::{Model, Report, Successors};

type ElectionReport = Report<State, Config>;

/// One pinned row. `cex[i]` is the length (states, initial included) of the shortest
/// counterexample to `INVARIANTS[i]`, or `None` if it holds.
struct Pin {
    cfg: Config,
    distinct: u64,
    generated: u64,
    depth: u32,
    cex: [Option<usize>; 4],
}

/// Invariant order of `cex`.
const NAMES: [&str; 4] = [
    "NoTwoAnswerInOneEpoch",
    "AnswersWithinLease",
    "NoAckLost",
    "OneLeaderKey",
];

const OK: Option<usize> = None;

const fn fails(states: usize) -> Option<usize> {
    Some(states)
}

const STANDBY2: Config = Config::two_nodes(Ack::Standby);
const LOCAL2: Config = Config::two_nodes(Ack::Local).with_batches(1);
const LOCAL2_TWO_ANSWERS: Config = Config::two_nodes(Ack::Local)
    .with_max_epoch(2)
    .without_gap();
const STANDBY3: Config = Config::three_nodes(Ack::Standby);
const STANDBY3_THREE_ELECTIONS: Config = STANDBY3.without_gap().with_max_epoch(3);
const SHIP_WRITTEN2: Config = STANDBY2.without_gap().with_crash().with_ship_written();
const SHIP_WRITTEN3: Config = STANDBY3.without_gap().with_crash().with_ship_written();
const FETCH_BEFORE_SYNC2: Config = SHIP_WRITTEN2.with_fetch_before_sync();
const FETCH_BEFORE_SYNC3: Config = SHIP_WRITTEN3.with_fetch_before_sync();

/// The rows of `election::rows()`, in order, with what the explorer found.
fn pins() -> Vec<Pin> {
    let pin = |cfg, (distinct, generated, depth), cex| Pin {
        cfg,
        distinct,
        generated,
        depth,
        cex,
    };
    vec![
        pin(STANDBY2, (454717, 2039548, 34), [OK, fails(11), OK, OK]),
        pin(STANDBY2.without_gap(), (123826, 539803, 29), [OK; 4]),
        pin(LOCAL2, (237102, 1424997, 28), [OK, fails(9), fails(10), OK]),
        pin(
            LOCAL2.without_gap(),
            (62346, 370991, 24),
            [OK, OK, fails(8), OK],
        ),
        pin(
            LOCAL2_TWO_ANSWERS,
            (154514, 910909, 24),
            [OK, OK, fails(8), OK],
        ),
        pin(STANDBY3, (848620, 5794685, 29), [OK, fails(13), OK, OK]),
        pin(STANDBY3.without_gap(), (242737, 1647545, 25), [OK; 4]),
        pin(STANDBY3_THREE_ELECTIONS, (2636628, 22345903, 31), [OK; 4]),
        pin(
            LOCAL2.without_gap().with(Flaw::NoMargin),
            (122286, 711455, 26),
            [OK, fails(7), fails(8), fails(4)],
        ),
        pin(
            STANDBY3.without_gap().with(Flaw::CampaignOutsideIsr),
            (569425, 4036460, 26),
            [OK, OK, fails(12), OK],
        ),
        pin(
            STANDBY3.without_gap().with(Flaw::IsrGrowStoreFirst),
            (511417, 3619805, 27),
            [OK, OK, fails(14), OK],
        ),
        pin(
            STANDBY3.without_gap().with(Flaw::IsrShrinkMemoryFirst),
            (482773, 3364013, 25),
            [OK, OK, fails(11), OK],
        ),
        pin(
            STANDBY2.without_gap().with(Flaw::AcksAcrossEpochs),
            (144686, 638379, 29),
            [OK, OK, fails(13), OK],
        ),
        pin(
            LOCAL2_TWO_ANSWERS.with(Flaw::EpochFromNode),
            (500681, 3054442, 30),
            [fails(11), OK, fails(8), OK],
        ),
        pin(
            STANDBY3_THREE_ELECTIONS.with(Flaw::IsrGrowAtHw),
            (2862474, 24279469, 31),
            [OK, OK, fails(18), OK],
        ),
        pin(
            STANDBY2.with_handover(),
            (468131, 2843934, 34),
            [OK, fails(11), OK, OK],
        ),
        pin(
            STANDBY3.with_handover(),
            (865627, 7430930, 29),
            [OK, fails(13), OK, OK],
        ),
        pin(
            STANDBY3.without_gap().with_handover(),
            (252052, 2109284, 25),
            [OK; 4],
        ),
        pin(
            LOCAL2.without_gap().with_handover(),
            (64094, 478783, 23),
            [OK, OK, fails(8), OK],
        ),
        pin(
            STANDBY3
                .without_gap()
                .with_handover()
                .with(Flaw::ResignBeforeStepDown),
            (516937, 4412351, 24),
            [OK, fails(10), OK, fails(3)],
        ),
        pin(
            LOCAL2
                .without_gap()
                .with_handover()
                .with(Flaw::ResignBeforeStepDown),
            (146210, 1128933, 22),
            [OK, fails(6), fails(7), fails(3)],
        ),
        pin(
            STANDBY2.without_gap().with_crash(),
            (201339, 1204764, 31),
            [OK; 4],
        ),
        pin(SHIP_WRITTEN2, (285469, 1756674, 31), [OK; 4]),
        pin(SHIP_WRITTEN3, (432191, 3732732, 26), [OK; 4]),
        pin(
            SHIP_WRITTEN2.with(Flaw::HwPastDurable),
            (486279, 3025428, 30),
            [OK, OK, fails(11), OK],
        ),
        pin(
            STANDBY2
                .without_gap()
                .with_crash()
                .with(Flaw::HwPastDurable),
            (201339, 1204764, 31),
            [OK; 4],
        ),
        pin(FETCH_BEFORE_SYNC2, (398101, 2600560, 33), [OK; 4]),
        pin(FETCH_BEFORE_SYNC3, (731378, 6884316, 28), [OK; 4]),
        pin(
            FETCH_BEFORE_SYNC2.with(Flaw::AckWritten),
            (739411, 4868268, 33),
            [OK, OK, fails(12), OK],
        ),
        pin(
            FETCH_BEFORE_SYNC3.with(Flaw::CatchUpWritten),
            (944030, 8915670, 31),
            [OK, OK, fails(19), OK],
        ),
        pin(
            STANDBY2.without_gap().with_lost_win(),
            (141173, 610120, 29),
            [OK; 4],
        ),
        pin(
            STANDBY3.without_gap().with_lost_win(),
            (250997, 1693719, 25),
            [OK; 4],
        ),
        pin(
            STANDBY2
                .without_gap()
                .with_lost_win()
                .with(Flaw::AdoptLostWinFresh),
            (297597, 1297544, 44),
            [OK, fails(14), OK, fails(9)],
        ),
    ]
}

/// Explores `cfg` and checks it against its pinned row, and every counterexample against the
/// model: a behaviour from `Init` whose last state, and no earlier one, breaks the invariant.
fn assert_pinned(cfg: Config) -> ElectionReport {
    let pins = pins();
    let e = pins
        .iter()
        .find(|p| p.cfg == cfg)
        .unwrap_or_else(|| panic!("no pinned row for {cfg:?}"));
    let r = election::check(&cfg).expect("the model's constants fit");
    let row = format!("{} with {} nodes", print::describe(&cfg), cfg.nodes);
    println!("{}", print::table(std::slice::from_ref(&r)));
    let found: Vec<Option<usize>> = r.verdicts.iter().map(|v| v.counterexample_len()).collect();
    assert_eq!(found, e.cex.to_vec(), "{row}: verdicts for {NAMES:?}");
    assert_eq!(
        (r.distinct, r.generated, r.depth),
        (e.distinct, e.generated, e.depth),
        "{row}: counts"
    );
    for v in &r.verdicts {
        let Some(trace) = &v.counterexample else {
            continue;
        };
        replay(&Election, &cfg, trace).unwrap_or_else(|err| panic!("{row}: {err}"));
        let check = by_name(v.invariant).expect("a known invariant").check;
        let (last, before) = trace.steps.split_last().expect("a trace has a state");
        assert!(!check(&cfg, &last.state), "{row}: the last state breaks it");
        assert!(
            before.iter().all(|step| check(&cfg, &step.state)),
            "{row}: an earlier state breaks {}",
            v.invariant
        );
    }
    r
}

/// The counterexample to `invariant`, printed, with its last action checked.
fn counterexample(r: &ElectionReport, invariant: &str, last_action: &str) -> Vec<State> {
    let trace = r
        .verdict(invariant)
        .and_then(|v| v.counterexample.as_ref())
        .unwrap_or_else(|| panic!("{invariant} holds"));
    println!(
        "{invariant}, {} states:\n{}",
        trace.steps.len(),
        print::trace(&r.cfg, trace)
    );
    let last = trace.steps.last().and_then(|s| s.action).map(|l| l.action);
    assert_eq!(last, Some(last_action), "{invariant}: the last action");
    trace.steps.iter().map(|s| s.state).collect()
}

/// The table `election::rows()` (the command line's and the doc's) is the pinned one.
#[test]
fn every_row_of_the_table_is_pinned() {
    let pinned: Vec<Config> = pins().iter().map(|p| p.cfg).collect();
    assert_eq!(election::rows(), pinned);
    assert_eq!(election::INVARIANTS.map(|i| i.name), NAMES);
}

/// The design as built, leaders paused anywhere, two and three nodes: no acknowledged batch
/// is lost, no epoch has two answerers, no two nodes believe they hold the key. A leader
/// paused between its check and its act does answer after its lease (`AnswersWithinLease`,
/// 11 and 13 states), but only a batch a standby acknowledged in its epoch, so the batch is on
/// the next leader: safety there rests on epochs, not time.
#[test]
fn the_built_design_loses_no_acknowledged_batch_with_leaders_paused_anywhere() {
    for cfg in [STANDBY2, STANDBY3] {
        let r = assert_pinned(cfg);
        let states = counterexample(&r, "AnswersWithinLease", "Answer");
        let last = states.last().expect("a state");
        assert!(last.store.holder.is_none(), "the lease has expired");
        let answerer = (0..cfg.nodes)
            .find(|&n| last.node(n).is_leader())
            .expect("the old leader");
        assert!(
            (0..cfg.nodes).any(|n| n != answerer && last.node(n).log.offset_of(0).is_some()),
            "a standby holds the answered batch"
        );
    }
}

/// With the check and the act one step, the margin keeps every answer inside the store's
/// lease, under both acks, at two and three nodes (three elections too): every invariant
/// holds under ack=standby. Under ack=local the same pause that breaks it above breaks it
/// here (9 states): the documented cost of `local`.
#[test]
fn without_a_pause_between_check_and_act_every_answer_is_within_the_lease() {
    for cfg in [
        STANDBY2.without_gap(),
        STANDBY3.without_gap(),
        STANDBY3_THREE_ELECTIONS,
    ] {
        assert_pinned(cfg);
    }
    assert_pinned(LOCAL2.without_gap());
    let r = assert_pinned(LOCAL2);
    counterexample(&r, "AnswersWithinLease", "Answer");
}

/// ack=local answers once the leader's own claim is durable, so a failover to a standby that
/// never fetched the batch loses it (8 states): `NoAckLost` is what ack=standby buys.
#[test]
fn ack_local_loses_an_acknowledged_batch_at_failover() {
    let r = assert_pinned(LOCAL2_TWO_ANSWERS);
    let states = counterexample(&r, "NoAckLost", "Campaign");
    let last = states.last().expect("a state");
    assert_eq!(last.batches[0].answer.map(|a| a.epoch), Some(1));
}

/// Mutant (a): a node believes its lease valid until send + TTL. Its clock lags the store's
/// by a tick, so its view outlasts the store's lease: two ticks after winning, the key is gone
/// (another node may win now) and it still believes it leads (`OneLeaderKey`, 4 states), and
/// it answers a batch under ack=local (`AnswersWithinLease`, 7 states).
#[test]
fn without_the_margin_a_lagging_clock_answers_after_the_store_expired() {
    let r = assert_pinned(LOCAL2.without_gap().with(Flaw::NoMargin));
    let states = counterexample(&r, "AnswersWithinLease", "Answer");
    let last = states.last().expect("a state");
    assert!(last.store.holder.is_none() && last.node(0).deadline > 0);
    counterexample(&r, "OneLeaderKey", "Tick");
}

/// Mutant (b): a node outside the store's ISR campaigns. The leader shrank the ISR to the
/// standby that fetched b0 and answered it; its lease runs out and the other standby, without
/// b0, wins (12 states).
#[test]
fn campaigning_outside_the_isr_loses_an_acknowledged_batch() {
    let r = assert_pinned(STANDBY3.without_gap().with(Flaw::CampaignOutsideIsr));
    counterexample(&r, "NoAckLost", "Campaign");
}

/// Mutant (c): the ISR grows in the store before the leader's memory. A standby is electable
/// while the hw does not wait for it: the leader answers b0 that it never fetched, and it wins
/// (14 states).
#[test]
fn growing_the_isr_in_the_store_first_loses_an_acknowledged_batch() {
    let r = assert_pinned(STANDBY3.without_gap().with(Flaw::IsrGrowStoreFirst));
    counterexample(&r, "NoAckLost", "Campaign");
}

/// Mutant (c'): the ISR shrinks in the leader's memory before the store. The hw stops
/// waiting for a standby that is still electable (11 states).
#[test]
fn shrinking_the_isr_in_memory_first_loses_an_acknowledged_batch() {
    let r = assert_pinned(STANDBY3.without_gap().with(Flaw::IsrShrinkMemoryFirst));
    counterexample(&r, "NoAckLost", "Campaign");
}

/// Mutant (d): the leader counts a fetch from a standby in an older epoch. r1 fenced with
/// b0@e1 at offset 0; r2 leads epoch 2, writes b1 at offset 0 and counts r1's offset 0 as b1:
/// it answers b1, and r1 wins epoch 3 without it (13 states). The epoch on acks is what keeps
/// a stale suffix from passing for the leader's.
#[test]
fn counting_acks_across_epochs_loses_an_acknowledged_batch() {
    let r = assert_pinned(STANDBY2.without_gap().with(Flaw::AcksAcrossEpochs));
    counterexample(&r, "NoAckLost", "Campaign");
}

/// Mutant (e): the winner takes its own last epoch + 1 (what a node-local generation does).
/// r1 wins epoch 1 and answers; its lease runs out; r2, which never saw epoch 1, wins epoch 1
/// too and answers (11 states). Epochs minted by the store's transaction are what keep one
/// answerer per epoch.
#[test]
fn epochs_the_nodes_pick_let_two_nodes_answer_in_one_epoch() {
    let r = assert_pinned(LOCAL2_TWO_ANSWERS.with(Flaw::EpochFromNode));
    counterexample(&r, "NoTwoAnswerInOneEpoch", "Answer");
}

/// Mutant (f), found by the model: a standby that reached the leader's hw counts as caught
/// up. r1 answers b0 with r2 in its ISR and r3 out; r2 wins epoch 2 with its hw at 0 (a new
/// leader counts again), takes r3 into the ISR at that hw although r3 lacks b0, and r3 wins
/// epoch 3 (18 states). Caught up means holding the leader's whole log.
#[test]
fn a_standby_that_reached_a_new_leaders_hw_is_not_caught_up() {
    let r = assert_pinned(STANDBY3_THREE_ELECTIONS.with(Flaw::IsrGrowAtHw));
    let states = counterexample(&r, "NoAckLost", "Campaign");
    let grown = states
        .iter()
        .any(|s| s.store.epoch == 2 && s.store.isr == roost_repmodel::types::ReplicaSet(0b111));
    assert!(grown, "r3 rejoins the ISR in epoch 2");
}

/// A handover (issue 42: a switchover, a graceful stop): the leader stops answering
/// (`StepDown`), then deletes its key (`Resign`) so that a node of the ISR wins at once. It
/// keeps every invariant the design keeps without it, at two and three nodes, with pauses
/// and without (and under ack=local loses only what ack=local loses anyway); a handover is
/// reached in those rows.
#[test]
fn a_handover_keeps_every_invariant_the_built_design_keeps() {
    for cfg in [STANDBY2, STANDBY3] {
        let r = assert_pinned(cfg.with_handover());
        counterexample(&r, "AnswersWithinLease", "Answer");
    }
    let r = assert_pinned(STANDBY3.without_gap().with_handover());
    assert!(r.verdicts.iter().all(|v| v.counterexample.is_none()));
    let r = assert_pinned(LOCAL2.without_gap().with_handover());
    counterexample(&r, "NoAckLost", "Campaign");
    let plain = election::check(&STANDBY3.without_gap()).expect("fits");
    assert!(
        r.distinct > 0
            && assert_pinned(STANDBY3.without_gap().with_handover()).distinct > plain.distinct,
        "the handover's steps reach states the design without them does not"
    );
}

/// Mutant (g): a leader deletes its key while it still leads (resign, then step down). At
/// once it believes it holds a key that is gone (`OneLeaderKey`, 3 states), and it answers
/// after another node could win (`AnswersWithinLease`, 10 states under ack=standby); under
/// ack=local it answers in epoch 1 a batch that epoch 2's leader, elected meanwhile, lacks
/// (`NoAckLost`, 7 states).
#[test]
fn resigning_before_stepping_down_answers_after_the_key_is_gone() {
    let r = assert_pinned(
        STANDBY3
            .without_gap()
            .with_handover()
            .with(Flaw::ResignBeforeStepDown),
    );
    let states = counterexample(&r, "AnswersWithinLease", "Answer");
    let last = states.last().expect("a state");
    assert!(last
        .batches
        .iter()
        .any(|b| b.answer.is_some_and(|a| !a.in_lease)));
    counterexample(&r, "OneLeaderKey", "Resign");
    let r = assert_pinned(
        LOCAL2
            .without_gap()
            .with_handover()
            .with(Flaw::ResignBeforeStepDown),
    );
    counterexample(&r, "NoAckLost", "Answer");
}

/// Power loss (issue 42): a node loses what it had not synced and starts again as a
/// follower. The design as built (a leader serves standbys only records it has synced) keeps
/// every invariant; so does a leader that serves records as soon as it has written them, so
/// that a standby's sync overlaps its own, at two and three nodes, because its hw never
/// passes its own durable end. Power loss is reached: some behaviour loses a written record.
#[test]
fn power_loss_loses_no_acknowledged_batch_when_records_are_shipped_before_the_sync() {
    for cfg in [
        STANDBY2.without_gap().with_crash(),
        SHIP_WRITTEN2,
        SHIP_WRITTEN3,
    ] {
        let r = assert_pinned(cfg);
        assert!(r.verdicts.iter().all(|v| v.counterexample.is_none()));
    }
    let without = election::check(&STANDBY2.without_gap()).expect("fits");
    let with = election::check(&STANDBY2.without_gap().with_crash()).expect("fits");
    assert!(
        with.distinct > without.distinct,
        "power loss reaches states the design without it does not"
    );
    let shipped = election::check(&SHIP_WRITTEN2).expect("fits");
    assert!(
        shipped.distinct > with.distinct,
        "serving written records reaches states serving synced ones does not"
    );
}

/// Mutant (h): the leader's hw counts what standbys hold past its own durable end. r1
/// writes b0, serves it to r2 before its sync, answers it once r2 holds it, loses power
/// before its sync, and wins epoch 2 without b0 (11 states). With records served only once
/// synced, the same flaw changes nothing (the same states): the clamp becomes load-bearing
/// when records are shipped before the sync.
#[test]
fn an_hw_past_the_leaders_durable_end_loses_an_acknowledged_batch_at_power_loss() {
    let r = assert_pinned(SHIP_WRITTEN2.with(Flaw::HwPastDurable));
    let states = counterexample(&r, "NoAckLost", "Campaign");
    let answered_unsynced = states
        .iter()
        .any(|s| s.batches[0].answer.is_some() && s.node(0).is_leader() && s.node(0).durable == 0);
    assert!(answered_unsynced, "b0 answered before its leader synced it");
    let synced_only = STANDBY2
        .without_gap()
        .with_crash()
        .with(Flaw::HwPastDurable);
    let r = assert_pinned(synced_only);
    assert!(r.verdicts.iter().all(|v| v.counterexample.is_none()));
}

/// A standby that fetches again before it syncs (issue 42, the convoy in docs/scaling.md)
/// keeps every invariant at two and three nodes while the leader counts only what it has
/// synced, for the hw and for its return to the ISR; counting what it has written
/// (`Flaw::AckWritten`) loses an acknowledged batch: the standby acknowledges b0 unsynced,
/// the power takes it, and it is elected without b0. Counting it for the return to the ISR
/// alone (`Flaw::CatchUpWritten`, the model's first version) loses one at three nodes: r3,
/// given up, is let back into the leader's memory on b0 unsynced, loses it, rejoins the
/// store's ISR and wins.
#[test]
fn a_standby_that_acknowledges_what_it_has_not_synced_loses_an_acknowledged_batch() {
    for cfg in [FETCH_BEFORE_SYNC2, FETCH_BEFORE_SYNC3] {
        let r = assert_pinned(cfg);
        assert!(r.verdicts.iter().all(|v| v.counterexample.is_none()));
    }
    let r = assert_pinned(FETCH_BEFORE_SYNC2.with(Flaw::AckWritten));
    let states = counterexample(&r, "NoAckLost", "Campaign");
    let lost_unsynced = states.windows(2).any(|w| {
        let (before, after) = (w[0].node(1), w[1].node(1));
        before.log.end() > before.durable && after.log.end() < before.log.end()
    });
    assert!(
        lost_unsynced,
        "the standby lost a record it had acknowledged unsynced"
    );
    let counted_unsynced = states
        .iter()
        .any(|s| s.node(0).hw > 0 && s.node(1).durable == 0 && s.node(1).log.end() > 0);
    assert!(
        counted_unsynced,
        "r1's hw passed b0 while r2 held it unsynced"
    );
    let answered = states.last().is_some_and(|s| s.batches[0].answer.is_some());
    assert!(answered, "b0 was answered");
    let r = assert_pinned(FETCH_BEFORE_SYNC3.with(Flaw::CatchUpWritten));
    let states = counterexample(&r, "NoAckLost", "Campaign");
    let readmitted_unsynced = states.windows(2).any(|w| {
        let (before, after) = (&w[0], &w[1]);
        let r3 = after.node(2);
        !before.node(0).isr.contains(2)
            && after.node(0).isr.contains(2)
            && r3.durable < r3.log.end()
    });
    assert!(
        readmitted_unsynced,
        "r3 rejoined r1's ISR holding b0 unsynced"
    );
}

/// Constants the arrays or the key cannot hold are refused, as is a margin as long as the
/// lease.
#[test]
fn constants_the_model_cannot_hold_are_refused() {
    let bad = [
        Config {
            nodes: 5,
            ..STANDBY2
        },
        Config {
            batches: 4,
            ..STANDBY2
        },
        Config {
            margin: 2,
            ..STANDBY2
        },
        Config {
            max_epoch: 7,
            ..STANDBY2
        },
    ];
    for cfg in bad {
        assert!(election::check(&cfg).is_err(), "{cfg:?}");
    }
    let big = Config {
        nodes: 4,
        batches: 3,
        max_epoch: 6,
        ttl: 8,
        ..STANDBY2
    };
    assert!(big.validate().is_err(), "does not pack into 128 bits");
}

/// A state outside its type has no key, and `Init` round-trips.
#[test]
fn state_keys_round_trip_and_refuse_ill_typed_states() {
    let cfg = STANDBY3;
    let init = Election.init(&cfg);
    let key = Election.encode(&cfg, &init).expect("Init is well typed");
    assert_eq!(Election.decode(&cfg, key), init);
    let mut bad = init;
    bad.store.lease = cfg.ttl + 1;
    assert_eq!(Election.encode(&cfg, &bad), None);
    let mut out = Successors::default();
    Election.next(&cfg, &init, &mut out);
    let actions: Vec<String> = out.items.iter().map(|(l, _)| l.to_string()).collect();
    assert_eq!(
        actions,
        [
            "Tick()",
            "Campaign(node=r1)",
            "Campaign(node=r2)",
            "Campaign(node=r3)"
        ]
    );
}

/// A win whose answer was lost (issue 42: etcd applied a campaign's transaction and the
/// node's call timed out): the store names a node that stays a follower
/// (`CampaignAnswerLost`), and the node gives the key up (`Resign`, as the daemon revokes
/// its lease). Every invariant holds at two and three nodes, and those rows reach states the
/// design without lost answers does not.
#[test]
fn a_lost_win_given_up_keeps_every_invariant() {
    for cfg in [STANDBY2.without_gap(), STANDBY3.without_gap()] {
        let r = assert_pinned(cfg.with_lost_win());
        assert!(r.verdicts.iter().all(|v| v.counterexample.is_none()));
        let plain = election::check(&cfg).expect("fits");
        assert!(
            r.distinct > plain.distinct,
            "lost answers reach states the design without them does not"
        );
    }
}

/// Mutant (j): the node adopts the lost win instead, with its view of the lease counted from
/// the moment it found the key (the wrong fix): it answers after its lease ran out
/// (`AnswersWithinLease`, 14 states) and believes it holds a key that is gone
/// (`OneLeaderKey`, 9 states).
#[test]
fn adopting_a_lost_win_with_a_fresh_view_answers_after_the_lease() {
    let r = assert_pinned(
        STANDBY2
            .without_gap()
            .with_lost_win()
            .with(Flaw::AdoptLostWinFresh),
    );
    counterexample(&r, "AnswersWithinLease", "Answer");
}
