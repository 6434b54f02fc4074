//! The protocol's decisions as pure functions over what a node knows: how a leader answers a
//! fetch (`leader_answer`) and where a follower truncates on a diverging answer
//! (`follower_truncation`). No I/O, no clocks, no async: the runtime (`serve`, `follow`)
//! gathers the inputs and acts on the result, and the tables in the tests below walk every
//! branch. The rules are Kip320.tla's (fenced fetch, KIP-279 truncation) as Kafka runs them
//! inline in the fetch (KIP-595's `DivergingEpoch`).

use crate::log::{Epoch, EpochEnd, FollowerLog, LeaderLog, Lsn};

/// What `leader_answer` reads from the leader: the four read-only parts of `LeaderLog`.
/// Every `LeaderLog` is one; the tests implement it over a table.
pub trait LeaderView {
    fn leader_epoch(&self) -> Option<Epoch>;
    fn log_start(&self) -> Lsn;
    fn shippable_end(&self) -> Lsn;
    fn end_offset_for(&self, epoch: Epoch) -> EpochEnd;
}

impl<L: LeaderLog> LeaderView for L {
    fn leader_epoch(&self) -> Option<Epoch> {
        LeaderLog::leader_epoch(self)
    }
    fn log_start(&self) -> Lsn {
        LeaderLog::log_start(self)
    }
    fn shippable_end(&self) -> Lsn {
        LeaderLog::shippable_end(self)
    }
    fn end_offset_for(&self, epoch: Epoch) -> EpochEnd {
        LeaderLog::end_offset_for(self, epoch)
    }
}

/// What `follower_truncation` reads from the follower.
pub trait FollowerView {
    fn log_end(&self) -> Lsn;
    fn end_offset_for(&self, epoch: Epoch) -> EpochEnd;
}

impl<F: FollowerLog> FollowerView for F {
    fn log_end(&self) -> Lsn {
        FollowerLog::log_end(self)
    }
    fn end_offset_for(&self, epoch: Epoch) -> EpochEnd {
        FollowerLog::end_offset_for(self, epoch)
    }
}

/// The parts of a `Fetch` the leader decides on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FetchView {
    pub current_epoch: Epoch,
    pub fetch_lsn: Lsn,
    pub last_epoch: Epoch,
}

/// The leader's answer to one fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// This node is not the leader; `epoch` is the latest its log holds (0 if none).
    NotLeader { epoch: Epoch },
    /// The fetch knows a newer epoch: the caller must call `saw_higher_epoch(current_epoch)`.
    UnknownEpoch { leader_epoch: Epoch },
    /// The fetch claims a newer epoch no epoch source could have minted yet
    /// (`plausible_epoch`): refused, and nothing changes on the leader.
    ImplausibleEpoch { leader_epoch: Epoch },
    /// The fetch's epoch is older than the leader's.
    FencedEpoch { leader_epoch: Epoch },
    /// The follower's log diverges from the leader's at or before `fetch_lsn`.
    Diverging {
        leader_epoch: Epoch,
        epoch: Epoch,
        end_lsn: Lsn,
    },
    /// `fetch_lsn` is below the first record the leader retains.
    OutOfRange { log_start: Lsn },
    /// The logs agree below `fetch_lsn`: serve records from there (the acknowledgement counts).
    Read { leader_epoch: Epoch },
}

/// The leader's checks, in order (Kafka: `Partition.localLogWithEpochOrThrow` for the epoch
/// fence, then `Partition.readRecords` for the diverging check):
///
/// 1. not the leader -> `NotLeader`;
/// 2. the fetch's `current_epoch` newer -> `UnknownEpoch` when `plausible_epoch`, else
///    `ImplausibleEpoch`; older -> `FencedEpoch`;
/// 3. the fetch carries a `last_epoch` (> 0: the follower holds records): the leader's
///    `end_offset_for(last_epoch)` = (E, end). E < last_epoch or end < fetch_lsn ->
///    `Diverging { E, end }`. None (the leader holds no epoch that old): `Diverging { 0,
///    log_start }` when the leader still holds its whole history (the follower empties
///    itself), else `OutOfRange` (nothing below log_start can be compared any more);
/// 4. `fetch_lsn < log_start` -> `OutOfRange`;
/// 5. `fetch_lsn > shippable_end` (the follower holds records the leader never served, say
///    a leader that lost an unsynced tail kept its epoch) -> `Diverging { last_epoch,
///    shippable_end }`;
/// 6. else `Read`.
///
/// A fetch with `last_epoch == 0` claims no records (an empty or freshly re-seeded log), so
/// there is nothing to compare; a follower with records always sends their epoch (epochs
/// start at 1), which keeps this from being a way around the check.
pub fn leader_answer<V: LeaderView + ?Sized>(view: &V, fetch: &FetchView) -> Answer {
    let Some(leader_epoch) = view.leader_epoch() else {
        let epoch = view.end_offset_for(Epoch::MAX).map_or(0, |(e, _)| e);
        return Answer::NotLeader { epoch };
    };
    if fetch.current_epoch > leader_epoch {
        if !plausible_epoch(leader_epoch, fetch.current_epoch) {
            return Answer::ImplausibleEpoch { leader_epoch };
        }
        return Answer::UnknownEpoch { leader_epoch };
    }
    if fetch.current_epoch < leader_epoch {
        return Answer::FencedEpoch { leader_epoch };
    }
    let log_start = view.log_start();
    if fetch.last_epoch > 0 {
        match view.end_offset_for(fetch.last_epoch) {
            None if log_start <= 1 => {
                return Answer::Diverging {
                    leader_epoch,
                    epoch: 0,
                    end_lsn: log_start.max(1),
                }
            }
            None => return Answer::OutOfRange { log_start },
            Some((epoch, end_lsn)) if epoch < fetch.last_epoch || end_lsn < fetch.fetch_lsn => {
                return Answer::Diverging {
                    leader_epoch,
                    epoch,
                    end_lsn,
                }
            }
            Some(_) => {}
        }
    }
    if fetch.fetch_lsn < log_start {
        return Answer::OutOfRange { log_start };
    }
    let shippable_end = view.shippable_end();
    if fetch.fetch_lsn > shippable_end {
        // Step 3 found the fetch's last epoch on the leader (or there is none), so answering
        // with it makes the follower cut exactly to the shippable end: answering with the
        // leader's latest epoch instead would leave a follower that lacks it where it is.
        return Answer::Diverging {
            leader_epoch,
            epoch: fetch.last_epoch,
            end_lsn: shippable_end,
        };
    }
    Answer::Read { leader_epoch }
}

/// Epochs at or above this are never adopted nor minted: an epoch near the top of `u32`
/// could only come from a forger or a bug, and adopting one would leave no room above it.
/// 2^31 is 8 million promotions of one node (epochs are `generation << 8 | node_id`).
pub const EPOCH_CEILING: Epoch = 1 << 31;

/// How many generations (promotions, the epoch's high 24 bits) a newer epoch may be ahead
/// of the one a node holds: every promotion mints one generation above the highest epoch
/// the promoted node knows, so a node that missed more than this many promotions in a row
/// is told so by its operator (a restart as a standby), not by one message.
pub const EPOCH_GENERATIONS_AHEAD_MAX: Epoch = 1 << 10;

/// Whether `claimed`, an epoch above `own`, could have been minted by the cluster without
/// etcd (docs/replication.md, "Who may say what"): below `EPOCH_CEILING`, and at most
/// `EPOCH_GENERATIONS_AHEAD_MAX` generations above `own`. An epoch at or below `own` is
/// plausible (it is not news).
pub fn plausible_epoch(own: Epoch, claimed: Epoch) -> bool {
    if claimed <= own {
        return true;
    }
    claimed < EPOCH_CEILING && (claimed >> 8) <= (own >> 8) + EPOCH_GENERATIONS_AHEAD_MAX
}

/// Where a follower truncates on `Diverging { epoch, end_lsn }`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Truncation {
    /// Remove every record at or above this lsn (never above the follower's log end).
    pub truncate_to: Lsn,
    /// False: the follower does not hold the leader's epoch, so this is an intermediate
    /// point; the next fetch (with the new last epoch) asks again.
    pub complete: bool,
}

/// The follower's truncation point for a diverging answer: the leader's `epoch` ends at
/// `leader_end` on the leader. Mirrors Kafka's `AbstractFetcherThread.getOffsetTruncationState`
/// (reached from `truncateOnFetchResponse` / `maybeTruncateToEpochEndOffsets`):
///
/// ```text
/// endOffsetForEpoch(tp, leaderEpochOffset.leaderEpoch) match {
///   case Some(OffsetAndEpoch(followerEndOffset, followerEpoch)) =>
///     if (followerEpoch != leaderEpochOffset.leaderEpoch)
///       OffsetTruncationState(min(followerEndOffset, replicaEndOffset), truncationCompleted = false)
///     else
///       OffsetTruncationState(min(min(followerEndOffset, leaderEpochOffset.endOffset),
///                                 replicaEndOffset), truncationCompleted = true)
///   case None =>
///     OffsetTruncationState(min(leaderEpochOffset.endOffset, replicaEndOffset), truncationCompleted = true)
/// }
/// ```
///
/// The follower's high watermark plays no part: truncating to it is the pre-KIP-101 rule that
/// loses acknowledged records (docs/replication.md, "Why not truncate to the high watermark").
pub fn follower_truncation<V: FollowerView + ?Sized>(
    diverging_epoch: Epoch,
    leader_end: Lsn,
    follower: &V,
) -> Truncation {
    let log_end = follower.log_end();
    match follower.end_offset_for(diverging_epoch) {
        None => Truncation {
            truncate_to: leader_end.min(log_end),
            complete: true,
        },
        Some((epoch, end)) if epoch != diverging_epoch => Truncation {
            truncate_to: end.min(log_end),
            complete: false,
        },
        Some((_, end)) => Truncation {
            truncate_to: end.min(leader_end).min(log_end),
            complete: true,
        },
    }
}

/// `end_offset_for` over a list of `(epoch, start lsn)` in increasing order and the log end:
/// the largest epoch <= `epoch` and the start of the next one (or `log_end` for the last).
/// The in-memory logs and the tables below share it; the daemon's epoch file can too.
pub fn end_offset_in(epochs: &[(Epoch, Lsn)], log_end: Lsn, epoch: Epoch) -> EpochEnd {
    let i = epochs.partition_point(|&(e, _)| e <= epoch);
    if i == 0 {
        return None;
    }
    let end = epochs.get(i).map_or(log_end, |&(_, start)| start);
    Some((epochs[i - 1].0, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A leader or follower as a table: epoch starts and ends.
    struct Table {
        leader: Option<Epoch>,
        log_start: Lsn,
        shippable_end: Lsn,
        log_end: Lsn,
        epochs: Vec<(Epoch, Lsn)>,
    }

    impl LeaderView for Table {
        fn leader_epoch(&self) -> Option<Epoch> {
            self.leader
        }
        fn log_start(&self) -> Lsn {
            self.log_start
        }
        fn shippable_end(&self) -> Lsn {
            self.shippable_end
        }
        fn end_offset_for(&self, epoch: Epoch) -> EpochEnd {
            end_offset_in(&self.epochs, self.log_end, epoch)
        }
    }

    impl FollowerView for Table {
        fn log_end(&self) -> Lsn {
            self.log_end
        }
        fn end_offset_for(&self, epoch: Epoch) -> EpochEnd {
            end_offset_in(&self.epochs, self.log_end, epoch)
        }
    }

    /// Leader in epoch 5: epoch 1 at lsn 1..3, epoch 3 at 3..6, epoch 5 at 6..10 (9 durable).
    fn leader() -> Table {
        Table {
            leader: Some(5),
            log_start: 1,
            shippable_end: 9,
            log_end: 10,
            epochs: vec![(1, 1), (3, 3), (5, 6)],
        }
    }

    fn fetch(current_epoch: Epoch, fetch_lsn: Lsn, last_epoch: Epoch) -> FetchView {
        FetchView {
            current_epoch,
            fetch_lsn,
            last_epoch,
        }
    }

    #[test]
    fn end_offset_in_table() {
        let e = [(1, 1), (3, 3), (5, 6)];
        let cases = [
            (0, None),
            (1, Some((1, 3))),
            (2, Some((1, 3))),
            (3, Some((3, 6))),
            (4, Some((3, 6))),
            (5, Some((5, 10))),
            (9, Some((5, 10))),
        ];
        for (asked, want) in cases {
            assert_eq!(end_offset_in(&e, 10, asked), want, "asked epoch {asked}");
        }
        assert_eq!(end_offset_in(&[], 1, 3), None);
    }

    #[test]
    fn leader_answer_table() {
        use Answer::*;
        let div = |epoch, end_lsn| Diverging {
            leader_epoch: 5,
            epoch,
            end_lsn,
        };
        let cases: Vec<(&str, FetchView, Answer)> = vec![
            (
                "newer epoch",
                fetch(6, 9, 5),
                UnknownEpoch { leader_epoch: 5 },
            ),
            (
                "newer epoch, the most generations ahead",
                fetch((EPOCH_GENERATIONS_AHEAD_MAX << 8) | 0xff, 9, 5),
                UnknownEpoch { leader_epoch: 5 },
            ),
            (
                "newer epoch, too many generations ahead",
                fetch((EPOCH_GENERATIONS_AHEAD_MAX + 1) << 8, 9, 5),
                ImplausibleEpoch { leader_epoch: 5 },
            ),
            (
                "an epoch near the top of u32",
                fetch(4_294_967_280, 9, 5),
                ImplausibleEpoch { leader_epoch: 5 },
            ),
            (
                "older epoch",
                fetch(4, 9, 5),
                FencedEpoch { leader_epoch: 5 },
            ),
            (
                "fencing before divergence",
                fetch(4, 99, 9),
                FencedEpoch { leader_epoch: 5 },
            ),
            ("empty follower", fetch(5, 1, 0), Read { leader_epoch: 5 }),
            ("caught up", fetch(5, 9, 5), Read { leader_epoch: 5 }),
            (
                "behind in epoch 1",
                fetch(5, 2, 1),
                Read { leader_epoch: 5 },
            ),
            (
                "at the end of epoch 1",
                fetch(5, 3, 1),
                Read { leader_epoch: 5 },
            ),
            ("past the end of epoch 1", fetch(5, 4, 1), div(1, 3)),
            ("epoch 2 unknown to the leader", fetch(5, 4, 2), div(1, 3)),
            ("epoch 4 unknown, ends before", fetch(5, 7, 4), div(3, 6)),
            (
                "epoch 4 unknown, at the end of 3",
                fetch(5, 6, 4),
                div(3, 6),
            ),
            ("past the durable end", fetch(5, 10, 5), div(5, 9)),
            ("future epoch record", fetch(5, 9, 7), div(5, 10)),
        ];
        for (name, f, want) in cases {
            assert_eq!(leader_answer(&leader(), &f), want, "{name}");
        }
    }

    #[test]
    fn plausible_epochs_stop_below_the_ceiling_whatever_the_own_epoch() {
        assert!(plausible_epoch(5, 5) && plausible_epoch(5, 1));
        assert!(plausible_epoch(0x300, 0x401));
        assert!(!plausible_epoch(EPOCH_CEILING - 1, EPOCH_CEILING));
        assert!(plausible_epoch(EPOCH_CEILING - 0x200, EPOCH_CEILING - 1));
        assert!(!plausible_epoch(0, u32::MAX));
    }

    #[test]
    fn leader_answer_not_leader_names_its_latest_epoch() {
        let mut t = leader();
        t.leader = None;
        assert_eq!(
            leader_answer(&t, &fetch(5, 9, 5)),
            Answer::NotLeader { epoch: 5 }
        );
        t.epochs.clear();
        assert_eq!(
            leader_answer(&t, &fetch(5, 9, 5)),
            Answer::NotLeader { epoch: 0 }
        );
    }

    #[test]
    fn leader_answer_with_a_retired_prefix() {
        // The leader retired lsn 1..4: its epoch list starts at epoch 3 (lsn 3).
        let mut t = leader();
        t.log_start = 4;
        t.epochs = vec![(3, 3), (5, 6)];
        let cases = [
            (
                "empty follower",
                fetch(5, 1, 0),
                Answer::OutOfRange { log_start: 4 },
            ),
            (
                "behind, epoch known",
                fetch(5, 3, 3),
                Answer::OutOfRange { log_start: 4 },
            ),
            (
                "epoch older than any held",
                fetch(5, 3, 1),
                Answer::OutOfRange { log_start: 4 },
            ),
            (
                "at log start",
                fetch(5, 4, 3),
                Answer::Read { leader_epoch: 5 },
            ),
        ];
        for (name, f, want) in cases {
            assert_eq!(leader_answer(&t, &f), want, "{name}");
        }
    }

    #[test]
    fn leader_answer_epoch_older_than_any_with_whole_history() {
        // The leader's records all belong to epochs after the follower's last one.
        let mut t = leader();
        t.epochs = vec![(3, 1), (5, 6)];
        assert_eq!(
            leader_answer(&t, &fetch(5, 4, 2)),
            Answer::Diverging {
                leader_epoch: 5,
                epoch: 0,
                end_lsn: 1
            }
        );
    }

    #[test]
    fn follower_truncation_table() {
        // Follower: epoch 1 at 1..3, epoch 2 at 3..5, epoch 4 at 5..8.
        let f = Table {
            leader: None,
            log_start: 1,
            shippable_end: 8,
            log_end: 8,
            epochs: vec![(1, 1), (2, 3), (4, 5)],
        };
        let t = |truncate_to, complete| Truncation {
            truncate_to,
            complete,
        };
        let cases = [
            ("leader's epoch 0: nothing below", 0, 1, t(1, true)),
            ("same epoch, leader ends earlier", 1, 2, t(2, true)),
            ("same epoch, follower ends earlier", 1, 7, t(3, true)),
            ("epoch 3 unknown here: to the end of 2", 3, 6, t(5, false)),
            ("epoch 4 held, leader ends at 6", 4, 6, t(6, true)),
            ("leader end past the log end", 4, 20, t(8, true)),
            ("epoch 9 unknown here: to the end of 4", 9, 20, t(8, false)),
        ];
        for (name, epoch, leader_end, want) in cases {
            assert_eq!(follower_truncation(epoch, leader_end, &f), want, "{name}");
        }
    }

    #[test]
    fn follower_truncation_never_rises_above_the_log_end() {
        let empty = Table {
            leader: None,
            log_start: 1,
            shippable_end: 1,
            log_end: 1,
            epochs: vec![],
        };
        assert_eq!(
            follower_truncation(3, 10, &empty),
            Truncation {
                truncate_to: 1,
                complete: true
            }
        );
    }
}
