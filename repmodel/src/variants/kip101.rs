//! `Kip101.tla`: a new follower truncates where the leader says its own latest epoch ends.
//!
//! Interpretation: the copy in `shared/spec/` has lost its indentation (the bullets of the
//! `/\` and `\/` lists all start in column 0, which TLA+ would read differently or not at
//! all). It is otherwise identical to upstream (hachikuji/kafka-specification), whose
//! indentation gives the reading transcribed here: `(IsEmpty /\ truncate to 0) \/ (\E record :
//! IsLatestRecord /\ truncate to LookupOffsetForEpoch)`.

use crate::base;
use crate::step::{Label, Successors};
use crate::types::{Config, Replica, State};

/// `OffsetsWithLargerEpochs(replica, epoch)`.
pub fn offsets_with_larger_epochs(
    s: &State,
    replica: Replica,
    epoch: i8,
) -> impl Iterator<Item = u8> + '_ {
    s.log(replica)
        .all_entries()
        .filter(move |(_, r)| r.epoch > epoch)
        .map(|(offset, _)| offset)
}

/// `LookupOffsetForEpoch(leader, follower, epoch)`.
pub fn lookup_offset_for_epoch(s: &State, leader: Replica, follower: Replica, epoch: i8) -> u8 {
    let leader_log = s.log(leader);
    match leader_log.latest_record() {
        None => s.rs(follower).hw,
        Some(latest) if latest.epoch == epoch => leader_log.end_offset(),
        Some(_) => offsets_with_larger_epochs(s, leader, epoch)
            .min()
            .unwrap_or(s.rs(follower).hw),
    }
}

/// `BecomeFollowerTruncateKip101`.
///
/// Interpretation: `TruncateTo` requires `newEndOffset <= endOffset`, so when the leader's
/// answer lies past the follower's end (the follower is a prefix of the leader), the action is
/// not enabled for that leader; Kafka would truncate to its own end (no-op) instead. Kept as
/// written.
pub fn become_follower_truncate_kip101(cfg: &Config, s: &State, out: &mut Successors) {
    for leader in cfg.all() {
        for replica in cfg.all() {
            let label = Label::new("BecomeFollowerTruncateKip101")
                .replica("leader", leader)
                .replica("replica", replica);
            if s.log(replica).is_empty() {
                base::become_follower_and_truncate_to(s, Some(leader), replica, 0, label, out);
            }
            if let Some(record) = s.log(replica).latest_record() {
                let offset = lookup_offset_for_epoch(s, leader, replica, record.epoch);
                base::become_follower_and_truncate_to(s, Some(leader), replica, offset, label, out);
            }
        }
    }
}

/// `Next` (declared `LOCAL` in the module).
pub fn next(cfg: &Config, s: &State, out: &mut Successors) {
    base::controller_elect_leader(cfg, s, out);
    base::controller_shrink_isr(cfg, s, out);
    base::become_leader(cfg, s, out);
    base::leader_expand_isr(cfg, s, out);
    base::leader_shrink_isr(cfg, s, out);
    base::leader_write(cfg, s, out);
    base::leader_inc_high_watermark(cfg, s, out);
    become_follower_truncate_kip101(cfg, s, out);
    base::follower_replicate(cfg, s, out);
}
